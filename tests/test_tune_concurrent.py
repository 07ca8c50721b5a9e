"""Two sweeps started at once against one SQLite MLflow store and one data directory: both complete.
One searches with Ray Tune's grid, the other with Optuna (TPE), which then resumes like any sweep."""

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL

pytestmark = [pytest.mark.slow, pytest.mark.rehearse, pytest.mark.timeout(900)]  # two whole sweeps at once


def test_two_sweeps_on_one_sqlite_store_at_once_both_complete(ray_session, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs, commands = {}, {}
    searches = {"left": ("train.lr_scale: {grid: [2.0]}", "grid"),
                "right": ("train.lr_scale: {choice: [1.5]}", "optuna")}
    for name, (space, search) in searches.items():
        (tmp_path / f"{name}.yaml").write_text(space + "\n")
        command = [sys.executable, "-m", "pipeline", "tune", "--config", "configs/demo.yaml", "--space",
                   str(tmp_path / f"{name}.yaml"), "--address", ray_session.get_runtime_context().gcs_address]
        # Same store, experiment, registered model and prepared-data directory: every shared write races.
        for item in [*SMALL, f"data.output_dir={tmp_path / 'data'}", f"train.storage_path={tmp_path / 'runs'}",
                     f"tracking.tracking_uri={uri}", "tracking.experiment=shared", f"tune.name={name}",
                     f"tune.search={search}", "tune.num_samples=1", "tune.scheduler=fifo", "train.max_steps=40",
                     "train.val_interval=20", "train.epochs=100"]:
            command += ["--set", item]
        commands[name] = command
        procs[name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       cwd=ROOT)
    logs = {name: proc.communicate(timeout=720)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"sweep {name}:\n{logs[name][-4000:]}"
        assert "database is locked" not in logs[name], logs[name][-4000:]
        # One line per trial start and end, no Tune status tables, no colour codes off a terminal.
        assert "[tune] trial " in logs[name] and " ended at update 40: val_bleu " in logs[name], logs[name][-4000:]
        assert "Trial status" not in logs[name] and "\x1b[" not in logs[name], logs[name][-4000:]
        assert "INFO mlflow" not in logs[name] and "Downloading artifacts" not in logs[name], logs[name][-4000:]

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shared")
    runs = client.search_runs([experiment.experiment_id])
    sweeps = {r.info.run_name: r for r in runs if r.data.tags.get("nmt.kind") == "sweep"}
    trials = [r for r in runs if r.data.tags.get("nmt.kind") == "trial"]
    assert set(sweeps) == {"left", "right"} and len(trials) == 2, [r.info.run_name for r in runs]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {t.data.tags["mlflow.parentRunId"] for t in trials} == {r.info.run_id for r in sweeps.values()}
    for trial in trials:
        assert max(m.step for m in client.get_metric_history(trial.info.run_id, "train_loss")) == 40
    model_name = trials[0].data.params["tracking.registered_model"]
    versions = client.search_model_versions(f"name = '{model_name}'")
    assert len(versions) == 2  # each sweep registered its best trial
    assert client.get_model_version_by_alias(model_name, "champion").version in {v.version for v in versions}
    assert {t.data.params["tune.search"] for t in trials} == {"grid", "optuna"}

    # The Optuna sweep resumes like the others: its finished trial is reported again, nothing reruns.
    again = subprocess.run([*commands["right"], "--resume"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "*best*" in again.stdout and "OK" in again.stdout, again.stdout
    assert len(client.search_runs([experiment.experiment_id])) == len(runs)
    assert len(client.search_model_versions(f"name = '{model_name}'")) == 2
