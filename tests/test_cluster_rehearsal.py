"""The shared-cluster path end to end (benchmarks/cluster_rehearsal.py): three `ray start` nodes in mount
namespaces of their own, S3 the only storage they share, an MLflow server on PostgreSQL with a login per
person, and every step submitted from a laptop directory through the dashboard at 127.0.0.1.

The script runs once for the module (about 2.5 minutes on 2 cores, in `make rehearse`); the tests read what
it did, the servers' records and the files it left. Sweeps, evaluation jobs and `serve deploy` on a cluster
are the team's day's (test_team_day.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from logs import leaks
from scripts import script_run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(900)]
MODEL = "transformer-nmt-demo-en-de"


def _unable() -> str | None:
    """Why the rehearsal cannot run here, if it cannot."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "the rehearsal's nodes run in mount namespaces of their own: it needs root and unshare"
    return None


def _argv(workdir: Path) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "cluster_rehearsal.py"), "--keep", str(workdir),
            "--out", str(workdir / "result.json")]


@pytest.fixture(scope="module")
def rehearsal():
    """The rehearsal's JSON, and its directory."""
    message = _unable()
    if message:
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_", "RAY_"))}
    with script_run("cluster", _argv, env, timeout_s=840) as outcome:
        root = outcome.workdir
        if outcome.returncode != 0:
            outputs = {p.name: p.read_text(errors="replace")[-1500:] for p in root.glob("*.out")}
            pytest.fail(f"the rehearsal failed ({outcome.returncode}): {outcome.stderr[-3000:]}\n{outputs}")
        print(f"the rehearsal ran for {outcome.seconds} s")
        yield json.loads((root / "result.json").read_text()), root


def test_submit_through_a_tunnel_refuses_a_local_tracking_store(rehearsal):
    """The dashboard is at 127.0.0.1 (as a tunnel gives it), yet the cluster does not see this machine's files."""
    result, _ = rehearsal
    refused = result["local_store"]
    assert refused["node_sockets_seen_from_laptop"] == 0  # the laptop really sees none of the nodes' files
    assert refused["exit"] == 2, refused["stderr"]
    assert "does not see this machine's files" in refused["stderr"]
    assert "tracking.tracking_uri=sqlite:///" in refused["stderr"] and "--set tracking.tracking_uri=http" in \
        refused["stderr"]
    assert "Traceback" not in refused["stderr"] and "submitted" not in refused["stderr"]


def test_cluster_rehearsal_trains_through_a_lost_node_then_promotes_from_the_laptop(rehearsal):
    result, root = rehearsal
    for step in ("prepare", "train", "promote"):
        assert result[step]["exit"] == 0, (step, result[step]["tail"])
    jobs = {job["submission_id"]: job for job in result["jobs"]}
    assert {jobs[result[s]["job"]]["status"] for s in ("prepare", "train")} == {"SUCCEEDED"}
    # The job record (what `ray job list`, the dashboard and get_job_info() show) holds the URI without the
    # login; the login went to the job as a forwarded package instead.
    train_job = jobs[result["train"]["job"]]
    assert train_job["runtime_env"]["env_vars"]["MLFLOW_TRACKING_URI"] == result["tracking_uri"]
    assert f"--set tracking.tracking_uri={result['tracking_uri']} " in train_job["entrypoint"]
    assert len(train_job["runtime_env"]["py_modules"]) == 1
    assert "forwarding MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_USERNAME to the job" in \
        (root / "train.out").read_text()
    assert result["train"]["lost_node"].get("processes_killed", 0) >= 3, "no worker node was lost during training"

    # Everything the team sees on the tracking server (read by the script as the trainer, before it stopped).
    seen = result["mlflow"]
    runs = {run["name"]: run for run in seen["runs"]}
    assert all(run["status"] == "FINISHED" for run in seen["runs"]), [(r["name"], r["status"]) for r in seen["runs"]]
    assert "rehearsal-train" in runs
    train = runs["rehearsal-train"]
    assert {"train_loss", "val_bleu", "val_loss"} <= set(train["metrics"])
    # The lost node's worker came back from a checkpoint on S3, not from scratch; every validation logged once.
    resumed = [value for _, value in seen["resumed_from_step"]]
    assert resumed and min(resumed) >= 10, resumed
    val_steps = [step for step, _ in seen["val_loss"]]
    assert sorted(set(val_steps)) == sorted(val_steps) and max(val_steps) == 60
    assert train["tags"]["best_checkpoint"].startswith("s3://team/runs/rehearsal-train/")
    # The person's login could not register: the model was a candidate, which the promoting login scored and
    # registered from the laptop, then promoted by hand.
    decided = result["promote"]["decided"]
    assert decided.count(f"registered as {MODEL} version") == 1 and "rejected" not in decided, decided
    assert "@champion" in result["promote"]["by_hand"], result["promote"]
    assert train["tags"]["nmt.candidate"] == MODEL
    champion = seen["champion"]
    assert champion["name"] == MODEL and champion["version"] == "1" and seen["versions"] == 1
    assert champion["tags"]["data_path"].startswith("s3://team/prepared/")
    # Who and what: every run of a submitted job names its person (the MLflow login and who submitted it from
    # where) and the commit submitted, though the job ran from an upload without .git as the nodes' user.
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    for name, tags in seen["run_tags"].items():
        assert tags == {"mlflow.user": "trainer", "mlflow.source.git.commit": commit}, name
    assert all(run["tags"]["nmt.submitted_by"].startswith(f"{os.environ.get('USER', 'root')}@")
               for run in seen["runs"]), [run["tags"].get("nmt.submitted_by") for run in seen["runs"]]
    # Nothing written into the laptop directory; the trainer's password nowhere in job records or logs, and
    # the promoting login's never on the cluster at all.
    password = (root / "trainer.password").read_text()
    promoter = (root / "promoter.password").read_text()
    assert not any((root / "laptop").iterdir())
    logs = [path for node in ("head", "w1", "w2", "w3") for path in (root / node / "ray").glob("session_2*/logs")]
    assert len(logs) == 4
    texts = {"jobs": json.dumps(result["jobs"]), **{p.name: p.read_text(errors="replace") for p in root.glob("*.out")}}
    found = leaks([password, promoter], texts, logs)
    assert not found, found
