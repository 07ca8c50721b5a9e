"""Stop the `nmt tune` driver with SIGINT; --resume redoes no finished work, duplicates no runs. (A driver lost
outright, its head node restarted under it, is the team's day's: test_team_day.py.)"""

import signal
import subprocess

import pytest
from commands import nmt, run_until
from logs import driver_output
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, data_dir
from stores import sqlite_uri

pytestmark = [pytest.mark.slow, pytest.mark.rehearse, pytest.mark.timeout(1200)]  # two drivers: a whole path
MAX_STEPS = 120  # the interrupted trial's; the one that finishes first trains SHORT
SHORT = 40
# The stop waits for a window of several validations (every 20 updates): results reach MLflow in
# bursts on a loaded machine, and a window of one or two validations was missed there.
FIRST_STOP = 80


def test_a_stopped_sweep_driver_resumes_without_rerunning_finished_trials(ray_session, tmp_path):
    # A short trial first (grid order), then the long one that the stop interrupts.
    (tmp_path / "space.yaml").write_text(f"train.max_steps: {{grid: [{SHORT}, {MAX_STEPS}]}}\n")
    uri = sqlite_uri(tmp_path)
    # One trial at a time, so the stop lands between a finished trial and an early, checkpointed one.
    command = nmt("tune", "--config", "configs/demo.yaml", "--space", str(tmp_path / "space.yaml"),
                  address=ray_session.get_runtime_context().gcs_address,
                  sets=[*SMALL, f"data.output_dir={data_dir(tmp_path)}", f"train.storage_path={tmp_path / 'runs'}",
                        f"tracking.tracking_uri={uri}", "tracking.experiment=resume", "tune.name=resume",
                        "tune.search=grid", "tune.scheduler=fifo", "tune.max_concurrent_trials=1",
                        f"train.max_steps={MAX_STEPS}", "train.val_interval=20", "train.epochs=100",
                        # Batches twice the small config's, so that each stop window lasts long enough.
                        "train.max_tokens=4096"])
    client = MlflowClient(uri)

    def trial_runs():
        experiment = client.get_experiment_by_name("resume")
        if experiment is None:
            return []
        return [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("nmt.kind") == "trial"]

    def steps(run_id, key):
        return [m.step for m in client.get_metric_history(run_id, key)]

    def validated(run):
        return max(steps(run.info.run_id, "val_bleu"), default=0)

    def finished_and_early(runs):
        """A finished trial, and one validated (so checkpointed) but at most half way."""
        return (any(r.info.status == "FINISHED" for r in runs)
                and any(r.info.status == "RUNNING" and 0 < validated(r) <= FIRST_STOP for r in runs))

    code, log = run_until(command, lambda: finished_and_early(trial_runs()), tmp_path / "sigint.log", signal.SIGINT)
    assert code == 130 and "nmt tune: interrupted; the same command with --resume" in log, log[-3000:]
    assert "Traceback" not in driver_output(log), log[-3000:]  # a worker's teardown noise aside
    # The short trial reached its own train.max_steps, not the command's: it did not stop early.
    assert f" ended at update {SHORT}: val_bleu " in log, log[-3000:]
    sweep_run = [r for r in client.search_runs([client.get_experiment_by_name("resume").experiment_id])
                 if r.data.tags.get("nmt.kind") == "sweep"]
    assert [r.info.status for r in sweep_run] == ["KILLED"]
    finished_before = {r.data.tags["nmt.trial_id"]: r.info.run_id for r in trial_runs() if r.info.status == "FINISHED"}
    history_before = {t: steps(run_id, "val_bleu") for t, run_id in finished_before.items()}
    (stopped_run,) = [r.info.run_id for r in trial_runs() if r.info.status != "FINISHED"]
    checkpointed = max(steps(stopped_run, "val_bleu"))

    again = subprocess.run([*command, "--resume"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    runs = trial_runs()
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs), \
        [(r.info.run_name, r.info.status) for r in runs]  # no duplicate runs, both complete
    for trial_id, run_id in finished_before.items():  # the finished trial was not trained again
        assert steps(run_id, "val_bleu") == history_before[trial_id]
    assert {r.info.run_id for r in runs} == {stopped_run, *finished_before.values()}
    # The interrupted trial continued from its checkpoints: updates before the first were logged once.
    train_steps = steps(stopped_run, "train_loss")
    assert max(train_steps) == MAX_STEPS
    assert all(train_steps.count(s) == 1 for s in train_steps if s <= checkpointed), sorted(train_steps)
    assert max(steps(stopped_run, "val_bleu")) == MAX_STEPS
