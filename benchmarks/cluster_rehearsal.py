"""The shared-cluster path rehearsed end to end on this machine, as an ML engineer lives it; prints JSON.

A Ray head and two worker nodes started with `ray start`, each a process tree in a mount namespace
of its own (`unshare -m`) where the other nodes' directories, the laptop's and the servers' are
empty tmpfs mounts: a node reads another's files only through Ray (the job's runtime_env) or
object storage. A local S3-compatible server (moto) is the only storage the nodes share; an
`mlflow server --app-name basic-auth` on PostgreSQL is the team's tracking server, with a login per
person. From a "laptop" directory that sees no node's files, through the dashboard at 127.0.0.1
(as a tunnel gives it) and with a person's password in the tracking URI, `nmt submit` runs: a
local store refused; prepare; train on 2 nodes, one of which is killed once a checkpoint is
registered and replaced by a new node. The run's model is a candidate the person's login may not
register: `nmt promote`, run on the laptop with the promoting login (never in a job), scores it on
the prepared validation split, registers a copy and moves @champion, then promotes that version by
hand. Sweeps, evaluation jobs and `serve deploy` are rehearsed by the team's day
(tests/test_team_day.py), on a cluster that `ray up` starts.

    python benchmarks/cluster_rehearsal.py [--out result.json] [--keep DIR]

Needs root (mount namespaces); about 3 minutes on 2 cores. Prints its figures as one JSON line (--out:
everything it saw). tests/test_cluster_rehearsal.py runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from rehearsal_cluster import BUCKET, Rehearsal, mlflow_login

ROOT = Path(__file__).resolve().parents[1]
# The rehearsal's model and data: small enough that every stage takes seconds on a CPU.
SMALL = ["data.demo_sizes={train: 2000, validation: 60, test: 60}", "data.vocab_size=500", "model.d_model=64",
         "model.d_ff=128", "model.num_heads=4", "model.num_layers=1", "model.dropout=0.0", "train.max_tokens=1024",
         "train.warmup_steps=30", "train.log_every=5", "train.beam_size=1", "train.average_last=1",
         "train.resource_wait_s=120", "tracking.experiment=rehearsal", "tracking.system_metrics_s=0"]
MODEL = "transformer-nmt-demo-en-de"


def checkpoint_registered(rehearsal: Rehearsal, prefix: str) -> bool:
    """Whether Ray Train has registered a checkpoint under s3://team/<prefix> (its checkpoint manager's snapshot)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=rehearsal.s3, aws_access_key_id="rehearsal",
                      aws_secret_access_key="rehearsal", region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return any(key.endswith("/checkpoint_manager_snapshot.json") for key in keys)


def job_id(result) -> str:
    found = re.search(r"job (raysubmit_\w+) submitted", result.stderr if hasattr(result, "stderr") else result)
    return found.group(1) if found else ""


def output(result) -> str:
    """A submitted step's job logs (stdout), then what `nmt submit` itself said (stderr): why it failed."""
    return result.stdout + result.stderr


def run(rehearsal: Rehearsal) -> dict:
    """The whole flow; returns what happened at each step, for the test and for people."""
    r, out = rehearsal, {}
    started = time.monotonic()
    r.start_s3()
    r.start_mlflow(MODEL)
    r.start_node("head", 0)
    for count, name in enumerate(("w1", "w2"), start=2):
        r.start_node(name, 1)
        r.wait_nodes(count, name)
    r.timings["start_cluster"] = round(time.monotonic() - started, 1)
    tracking = r.mlflow.replace("http://", f"http://trainer:{r.password}@")
    common = ["--config", "configs/demo.yaml", *[x for s in SMALL for x in ("--set", s)],
              "--set", f"tracking.tracking_uri={tracking}", "--set", f"data.output_dir=s3://{BUCKET}/prepared"]

    # 1. What a tunnel hides: the dashboard at 127.0.0.1 is a remote cluster, so a local store is refused.
    refused = r.submit("local_store", ["train", "--config", "configs/demo.yaml"])
    probe = "import os, sys; print(sum(os.path.exists(p) for p in sys.argv[1:]))"
    seen = r.laptop([sys.executable, "-c", probe, *r.alive_nodes()], timeout_s=60).stdout.strip()
    out["local_store"] = {"exit": refused.returncode, "stderr": refused.stderr[-2000:],
                          "node_sockets_seen_from_laptop": int(seen or -1)}

    prepared = r.submit("prepare", ["prepare", *common])
    out["prepare"] = {"exit": prepared.returncode, "job": job_id(prepared), "tail": output(prepared)[-1500:]}

    # 2. Training on the two worker nodes; w2 is lost once a checkpoint is registered, w3 joins.
    runs = f"s3://{BUCKET}/runs"
    train = ["train", *common, "--set", "train.num_workers=2", "--set", "train.placement_strategy=STRICT_SPREAD",
             "--set", "train.max_steps=60", "--set", "train.val_interval=10", "--set", "train.max_failures=2",
             "--set", f"train.storage_path={runs}", "--set", "train.run_name=rehearsal-train"]
    t0 = time.monotonic()
    process = r.submit("train", train, background=True)
    lost = {}
    deadline = time.monotonic() + 420
    while process.poll() is None and time.monotonic() < deadline:
        if not lost and checkpoint_registered(r, "runs/rehearsal-train"):
            lost = {"after_s": round(time.monotonic() - t0, 1), "processes_killed": r.kill_node("w2")}
            r.start_node("w3", 1)  # joins while the run waits for capacity; the run's own wait bounds it
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(60)
    r.timings["train"] = round(time.monotonic() - t0, 1)
    log = (r.root / "train.out").read_text()
    out["train"] = {"exit": process.returncode, "job": job_id(log), "lost_node": lost, "tail": log[-2500:]}

    # 3. The champion: the candidate scored by the promoting login on the laptop (the validation split of the
    # data prepared on S3, read with the promoter's own AWS login), a copy registered and crowned; then that
    # version promoted by hand.
    login = {"MLFLOW_TRACKING_URI": r.mlflow, "MLFLOW_TRACKING_USERNAME": "promoter",
             "MLFLOW_TRACKING_PASSWORD": r.promoter_password, **r.aws}
    data = ["--config", str(ROOT / "configs" / "demo.yaml"),  # its runs go to the promoter's own experiment
            *[x for s in SMALL if not s.startswith("tracking.experiment=") for x in ("--set", s)],
            "--set", f"data.output_dir=s3://{BUCKET}/prepared"]
    promote = [sys.executable, "-m", "pipeline", "promote", "--name", MODEL]
    t0 = time.monotonic()
    decided = r.laptop([*promote, *data], timeout_s=300, **login)
    by_hand = r.laptop([*promote, "1"], timeout_s=300, **login)
    r.timings["promote"] = round(time.monotonic() - t0, 1)
    out["promote"] = {"exit": decided.returncode or by_hand.returncode, "decided": decided.stdout[-800:],
                      "by_hand": by_hand.stdout[-300:], "tail": (decided.stderr + by_hand.stderr)[-1500:]}
    (r.root / "promote.out").write_text(decided.stdout + decided.stderr + by_hand.stdout + by_hand.stderr)
    out["mlflow"] = server_view(r)
    out["jobs"] = r.job_records()
    out["timings_s"] = {**r.timings, "total": round(time.monotonic() - started, 1)}
    out["tracking_uri"], out["s3"], out["root"] = r.mlflow, r.s3, str(r.root)
    return out


def server_view(r: Rehearsal) -> dict:
    """What the team sees on the tracking server afterwards, read as the trainer."""
    from mlflow.tracking import MlflowClient

    with mlflow_login("trainer", r.password):
        client = MlflowClient(r.mlflow)
        experiment = client.get_experiment_by_name("rehearsal")
        runs = client.search_runs([experiment.experiment_id])
        view = {"runs": [{"name": run.info.run_name, "status": run.info.status, "metrics": sorted(run.data.metrics),
                          "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}}
                         for run in runs]}
        train = next(run for run in runs if run.info.run_name == "rehearsal-train")
        for key in ("resumed_from_step", "val_loss"):
            view[key] = [(m.step, m.value) for m in client.get_metric_history(train.info.run_id, key)]
        champion = client.get_model_version_by_alias(MODEL, "champion")
        view["champion"] = {"name": champion.name, "version": champion.version, "tags": champion.tags}
        view["versions"] = len(client.search_model_versions(f"name = '{champion.name}'"))
        view["run_tags"] = {run.info.run_name: {k: v for k, v in run.data.tags.items()
                                                if k in ("mlflow.user", "mlflow.source.git.commit")} for run in runs}
        return view


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here as well")
    parser.add_argument("--keep", help="a short directory (Unix socket paths must stay short) kept afterwards")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("cluster_rehearsal: needs root and unshare (util-linux) for its nodes' mount namespaces", file=sys.stderr)
        return 2
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="nmt-rh-", dir="/tmp"))
    rehearsal = Rehearsal(root)
    try:
        result = run(rehearsal)
    finally:
        rehearsal.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary(result)))  # one line: benchmarks/run_all.py reads it
    return 0


def summary(result: dict) -> dict:
    """The figures of a rehearsal: seconds per step, the lost node, what the tracking server shows."""
    runs = result["mlflow"]["runs"]
    return {"seconds": result["timings_s"], "lost_node_after_s": result["train"]["lost_node"].get("after_s"),
            "resumed_from_step": [value for _, value in result["mlflow"]["resumed_from_step"]],
            "runs_finished": f"{sum(r['status'] == 'FINISHED' for r in runs)}/{len(runs)}",
            "jobs_succeeded": f"{sum(j['status'] == 'SUCCEEDED' for j in result['jobs'])}/{len(result['jobs'])}",
            "local_store_refused": result["local_store"]["exit"] == 2,
            "champion_version": result["mlflow"]["champion"]["version"]}


if __name__ == "__main__":
    sys.exit(main())
