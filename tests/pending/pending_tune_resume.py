"""SIGKILL the `nmt tune` driver mid-sweep, rerun with --resume. Held out of the suite: the kill
condition must use a logged metric (step is not one) and tolerate the averaged report's repeated step."""

from mlflow.tracking import MlflowClient


def test_a_killed_sweep_driver_resumes_without_rerunning_finished_trials(ray_session, tmp_path):
    """SIGKILL the `nmt tune` driver mid-sweep, rerun it with --resume: same trials, same MLflow runs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from small import SMALL

    (tmp_path / "space.yaml").write_text("train.lr_scale: {grid: [2.0, 1.5]}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "-m", "pipeline", "tune", "--config", "configs/demo.yaml", "--space",
               str(tmp_path / "space.yaml"), "--address", ray_session.get_runtime_context().gcs_address]
    for item in [*SMALL, f"data.output_dir={tmp_path / 'data'}", f"train.storage_path={tmp_path / 'runs'}",
                 f"tracking.tracking_uri={uri}", "tracking.experiment=resume", "tune.name=resume",
                 "tune.search=grid", "tune.scheduler=fifo", "train.max_steps=100", "train.val_interval=20",
                 "train.epochs=100"]:
        command += ["--set", item]
    client = MlflowClient(uri)

    def trial_runs():
        experiment = client.get_experiment_by_name("resume")
        if experiment is None:
            return []
        return [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("nmt.kind") == "trial"]

    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 480
    # Kill once the first trial finished and the second has validated (so it has a checkpoint).
    while time.monotonic() < deadline and first.poll() is None:
        runs = trial_runs()
        done = [r for r in runs if r.info.status == "FINISHED"]
        # Early in the second trial (one validation of five), so the kill lands well before it ends.
        started = [r for r in runs if r.info.status == "RUNNING" and "val_bleu" in r.data.metrics
                   and r.data.metrics.get("step", 0) < 60]
        if done and started:
            break
        time.sleep(2)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    log.close()
    finished_before = {r.data.tags["nmt.trial_id"]: r.info.run_id for r in trial_runs() if r.info.status == "FINISHED"}
    history_before = {t: client.get_metric_history(run_id, "val_bleu") for t, run_id in finished_before.items()}

    again = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    runs = trial_runs()
    assert len(runs) == 2 and all(r.info.status in ("FINISHED", "KILLED") for r in runs)  # no duplicates
    for trial_id, run_id in finished_before.items():  # the finished trial was not trained again
        assert [m.step for m in client.get_metric_history(run_id, "val_bleu")] == \
            [m.step for m in history_before[trial_id]]
    resumed = [r for r in runs if r.info.run_id not in finished_before.values()]
    steps = [m.step for m in client.get_metric_history(resumed[0].info.run_id, "val_bleu")]
    assert "resumed from step" in again.stderr and steps == sorted(set(steps)) and max(steps) == 100
