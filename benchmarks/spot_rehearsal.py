"""Training on spot nodes, rehearsed on this machine: a node is reclaimed after a preemption notice, the run
shrinks to the worker that is left and grows back when a new node joins.

A Ray head (0 CPUs) and two 1-CPU worker nodes (ray.cluster_utils, separate raylets), a local S3 server
as the only storage, `nmt train` of a small model with `train.min_workers=1`, `train.num_workers=2`.
Once a checkpoint is registered, one worker node is drained with reason PREEMPTION and a deadline; at the
deadline it is killed; a fresh node is added once the run goes on without it.

    python benchmarks/spot_rehearsal.py                 # with and without the notice: updates lost per preemption
    python benchmarks/spot_rehearsal.py --scenarios notice --out DIR   # one scenario, its figures in DIR/figures.json
    python benchmarks/spot_rehearsal.py --scenario notice --storage s3://bucket/prefix --out DIR   # in this process

The comparison runs the same scenario twice: with the notice (train.preemption_check_s=1, the loop saves
a checkpoint before the deadline) and without it (0: the run resumes from its last periodic checkpoint).
Updates lost = the last update rank 0 finished before the restart minus the step the run resumed from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 20  # the drain's deadline: GCP gives 30 s of notice, AWS 120 s
RECLAIM_AFTER_S = 1  # the node is killed this long after the deadline Ray was told
# Training seconds (neither the wait for the deadline nor the restarts count): the run must still be going
# when the new node is in use, however fast the machine trains. Ray Train's elastic policy learns of nodes
# from a coordinator that refreshes every 20 s, then waits train.resize_interval_s: the run trains on one
# worker for up to about 30 s before it grows back (measured: 22 s), then trains on two.
TIME_BUDGET_S = 45
COMMON = ["data.demo_sizes={train: 4000, validation: 40, test: 40}", "data.vocab_size=500",
          "model.d_model=64", "model.d_ff=128", "model.num_heads=4", "model.num_layers=1", "model.dropout=0.0",
          "train.max_tokens=1024", "train.warmup_steps=30", "train.epochs=100", "train.val_interval=20",
          "train.log_every=1", "train.beam_size=1", "train.average_last=1", "train.resource_wait_s=60",
          "train.report_interval_s=2", "train.num_workers=2", "train.min_workers=1", "train.resize_interval_s=5",
          "train.max_failures=0", "tracking.system_metrics_s=2", "tracking.register=false"]


def _checkpoints(uri: str) -> tuple[int, bool]:
    """Checkpoints stored under a run's storage, and whether Ray Train has registered one (its snapshot)."""
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    files = [f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))]
    return sum(f.endswith("/model.pt") for f in files), any(f.endswith("checkpoint_manager_snapshot.json")
                                                              for f in files)


def _metric(uri: str, run_name: str, key: str) -> list[tuple[int, float, int]]:
    """(step, value, timestamp ms) of a run's metric, as logged so far ([] before the run exists)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, f"tags.`nmt.run_name` = '{run_name}'") if experiments else []
    if not runs:
        return []
    return [(m.step, m.value, m.timestamp) for m in client.get_metric_history(runs[0].info.run_id, key)]


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.5)


def scenario(name: str, storage: str, out: Path, deadline_s: float = DEADLINE_S) -> dict:
    """Run one scenario (notice: the loop checks for preemption; none: it never asks) and return its figures."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.common import log
    from pipeline.config import load_config
    from pipeline.launch.preemption_notice import drain_for_preemption
    from pipeline.train.driver import train

    os.environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] = "1"  # Ray Train's drain watcher (5 s by default)
    log.setup()
    uri = f"sqlite:///{out}/mlflow.db"
    runs = f"{storage}/runs-{name}"
    cfg = load_config(REPO_ROOT / "configs" / "demo.yaml", [
        *COMMON, f"train.preemption_check_s={1 if name == 'notice' else 0}", f"train.time_budget_s={TIME_BUDGET_S}",
        f"train.storage_path={runs}", f"train.run_name=spot-{name}", f"data.output_dir={storage}/data",
        f"tracking.tracking_uri={uri}"])
    events: dict = {}
    done = threading.Event()

    def reclaim(node) -> None:  # the machine goes: every process of the node dies at once, no goodbye to Ray
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        for proc in [*raylet.children(recursive=True), raylet]:
            proc.kill()
        cluster.remove_node(node, allow_graceful=False)

    def chaos() -> None:
        try:
            _wait(lambda: _checkpoints(f"{runs}/spot-{name}")[1] or done.is_set(), 600, "a registered checkpoint")
            time.sleep(1)  # mid-interval: without the notice, the updates since the checkpoint are lost
            victim = workers[1]
            events["drained_at"] = time.time()
            events["deadline"] = drain_for_preemption(cluster.address, victim.node_id, deadline_s)
            # The cloud takes the node at the deadline (Ray Train waits train.preemption_grace_s for it to go).
            time.sleep(max(0.0, events["deadline"] + RECLAIM_AFTER_S - time.time()))
            reclaim(victim)
            events["reclaimed_at"] = time.time()
            # A new node joins once the run goes on without the old one.
            _wait(lambda: any(v == 1 for _, v, _ in _metric(uri, f"spot-{name}", "world_size")) or done.is_set(),
                  300, "the run on one worker")
            cluster.add_node(num_cpus=1)
            events["added_at"] = time.time()
        except Exception as err:  # reported in the figures: the run itself decides the exit status
            events["chaos_error"] = repr(err)

    # A node that vanishes is found dead by the GCS's health checks: every second, dead after two misses.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 2}},
        shutdown_at_exit=False)
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        ray.init(address=cluster.address)
        events["nodes"] = [f"node-{w.node_id[:8]}" for w in workers]
        thread = threading.Thread(target=chaos, daemon=True)
        thread.start()
        started = time.time()
        try:
            outcome = train(cfg)
        finally:
            done.set()
            thread.join(60)
        events["seconds"] = round(time.time() - started, 1)
        from mlflow.tracking import MlflowClient

        run = MlflowClient(uri).get_run(outcome.run_id)
        history = {key: [(m.step, m.value, m.timestamp) for m in MlflowClient(uri).get_metric_history(
            outcome.run_id, key)] for key in ("world_size", "tokens_per_update", "resumed_from_step", "val_loss",
                                             "preemption_warning_s", "step")}
        events.update(status=run.info.status, history=history,
                      tags={k: v for k, v in run.data.tags.items() if k.startswith("restart.")},
                      system_keys=sorted(k for k in run.data.metrics if k.startswith("system/node-")),
                      checkpoint=outcome.checkpoint_path)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return events


def updates_lost(log_text: str) -> dict:
    """From rank 0's progress lines: the last update before the first restart, the step resumed from."""
    before, _, after = log_text.partition("resumed from step")
    # Progress lines, and the step a preemption checkpoint stored (reached before its progress line).
    found = re.findall(r"step (\d+)/\d+ epoch|checkpointing step (\d+)", before)
    steps = [int(number) for pair in found for number in pair if number]
    resumed = re.match(r" (\d+)", after)
    if not steps or not resumed:
        return {"last_update": max(steps, default=None), "resumed_from": None, "updates_lost": None}
    return {"last_update": max(steps), "resumed_from": int(resumed.group(1)),
            "updates_lost": max(steps) - int(resumed.group(1))}


def run_scenario(name: str, storage: str, out: Path, timeout_s: float = 900,
                 deadline_s: float = DEADLINE_S) -> tuple[dict, str]:
    """The scenario in a process of its own (a Cluster cannot share one with another Ray); figures and log."""
    log = out / f"{name}.log"  # for a failure's post-mortem, written as it goes
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, __file__, "--scenario", name, "--storage", storage, "--out",
                                 str(out), "--deadline-s", str(deadline_s)], cwd=REPO_ROOT, stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {name} failed (exit {proc.returncode}), log {log}:\n{text[-4000:]}")
    figures = json.loads((out / f"{name}.json").read_text())
    return {**figures, **updates_lost(text)}, text


def _scenarios(text: str) -> list[str]:
    """--scenarios: a comma-separated list of notice and none."""
    names = text.split(",")
    unknown = sorted(set(names) - {"notice", "none"})
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)} is not a scenario (notice, none)")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("notice", "none"), help="run one scenario in this process")
    parser.add_argument("--storage", help="storage URI every node shares (default: a local S3 server of its own)")
    parser.add_argument("--out", help="directory for the figures and logs (default: a temporary one)")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="the drain's deadline (default: 20)")
    parser.add_argument("--scenarios", type=_scenarios, default="notice,none",
                        help="the scenarios to compare (default: notice,none)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="spot-rehearsal-"))
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO_ROOT))
    if args.scenario:
        figures = scenario(args.scenario, args.storage, out, args.deadline_s)
        (out / f"{args.scenario}.json").write_text(json.dumps(figures))
        return 0
    s3 = None
    storage = args.storage
    if storage is None:  # a local S3 server for both scenarios
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="spot",
                          AWS_SECRET_ACCESS_KEY="spot", AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1",
                          AWS_EC2_METADATA_DISABLED="true")
        s3 = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        import boto3

        boto3.client("s3").create_bucket(Bucket="spot")
        storage = "s3://spot/rehearsal"
    try:
        result = {"benchmark": "spot_rehearsal", "cpu_count": os.cpu_count(), "deadline_s": args.deadline_s}
        every = {}  # each scenario's whole figures (metric histories included), for the tests
        for name in args.scenarios:
            every[name], _ = run_scenario(name, storage, out, deadline_s=args.deadline_s)
            result[name] = {k: every[name].get(k) for k in ("updates_lost", "last_update", "resumed_from",
                                                            "seconds", "tags", "status", "chaos_error")}
        (out / "figures.json").write_text(json.dumps(every))
        print(json.dumps(result))
    finally:
        if s3 is not None:
            s3.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
