"""Stop the `nmt train` driver with SIGINT, then with SIGKILL; each rerun resumes one MLflow run to the end, the
last one from an earlier checkpoint when the latest ones are truncated (as by a full disk)."""

import signal
import subprocess

import pytest
from commands import nmt, run_until
from logs import driver_output
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, data_dir
from stores import sqlite_uri

from pipeline.common import checkpoint
from pipeline.common.errors import UserError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MAX_STEPS = 200


def step_of(directory) -> int | None:
    """The update a checkpoint directory was saved at, None if it does not load."""
    try:
        return checkpoint.load(directory)["progress"]["step"]
    except UserError:
        return None


def test_a_stopped_train_driver_resumes_from_its_checkpoint_without_a_second_run(ray_session, tmp_path):
    uri = sqlite_uri(tmp_path)
    command = nmt("train", "--config", "configs/demo.yaml", address=ray_session.get_runtime_context().gcs_address,
                  sets=[*SMALL, f"data.output_dir={data_dir(tmp_path)}", f"train.storage_path={tmp_path / 'runs'}",
                        f"tracking.tracking_uri={uri}", "tracking.experiment=driver", "train.run_name=driver",
                        f"train.max_steps={MAX_STEPS}", "train.val_interval=20", "train.epochs=100",
                        "train.keep_checkpoints=20"])
    client = MlflowClient(uri)

    def runs():
        experiment = client.get_experiment_by_name("driver")
        return client.search_runs([experiment.experiment_id]) if experiment else []

    def steps(key):
        (run,) = runs()
        return [m.step for m in client.get_metric_history(run.info.run_id, key)]

    def validated() -> int:
        return max(steps("val_bleu"), default=0) if runs() else 0

    def stop_when_validated(sig, lowest, highest, log_name):
        """Run the command, stop it with sig once its last validation (a checkpoint) is in [lowest, highest]."""
        code, log = run_until(command, lambda: lowest <= validated() <= highest, tmp_path / log_name, sig, 420)
        return code, log, validated()

    code, log, first_checkpoint = stop_when_validated(signal.SIGINT, 20, 60, "sigint.log")
    assert code == 130 and "nmt train: interrupted; the same command again resumes" in log, log[-3000:]
    assert "Traceback" not in driver_output(log), log[-3000:]  # a worker's teardown noise aside
    (run,) = runs()
    assert run.info.status == "KILLED"
    # The driver may validate once or twice more between Ctrl-C and stopping: the next command must
    # itself validate twice before it is killed, and still have updates left for the third.
    stopped_at = max(steps("val_bleu"))

    code, log, second_checkpoint = stop_when_validated(signal.SIGKILL, stopped_at + 40, MAX_STEPS - 40, "sigkill.log")
    assert code == -signal.SIGKILL
    assert "resumed from step" in log, log[-3000:]

    # The newest two checkpoints truncated: the killed driver may have written the newest without Ray Train
    # registering it, so the next one is Ray Train's latest, and the run falls back past it to an earlier one.
    by_step = {step_of(d): d for d in (tmp_path / "runs" / "driver").glob("checkpoint_*") if d.is_dir()}
    by_step.pop(None, None)  # one the kill left half-written
    assert len(by_step) >= 3, sorted(by_step)
    for step in sorted(by_step)[-2:]:
        model_file = by_step[step] / checkpoint.MODEL_FILE
        model_file.write_bytes(model_file.read_bytes()[:1000])
    earlier = sorted(by_step)[-3]

    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "falling back to the checkpoint before it" in again.stderr, again.stderr[-4000:]
    assert f"resumed from step {earlier} " in again.stderr, again.stderr[-4000:]
    (run,) = runs()  # one MLflow run across the three commands, now complete
    assert run.info.status == "FINISHED"
    train_steps = steps("train_loss")
    assert max(train_steps) == MAX_STEPS and max(steps("val_bleu")) == MAX_STEPS
    # Work up to the first checkpoint was never redone; every update was done at least once.
    assert all(train_steps.count(s) == 1 for s in train_steps if s <= first_checkpoint), sorted(train_steps)
    assert set(range(5, MAX_STEPS + 1, 5)) <= set(train_steps)
    assert train_steps.count(earlier + 5) >= 2, sorted(train_steps)  # trained again after the fallback
    versions = client.search_model_versions(f"run_id = '{run.info.run_id}'")
    assert len(versions) == 1  # registered once, by the run that finished
