"""An MLflow server that requires a login (`mlflow server --app-name basic-auth`): right and wrong credentials."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import environment
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, small_config

from pipeline.tune.sweep import sweep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_wrong_password_is_one_line_naming_the_server_and_nothing_starts(mlflow_auth_server, tmp_path):
    command = [sys.executable, "-m", "pipeline", "train", "--config", "configs/demo.yaml",
               *(x for s in [*SMALL, f"data.output_dir={tmp_path / 'data'}", f"train.storage_path={tmp_path / 'runs'}",
                             f"tracking.tracking_uri={mlflow_auth_server.uri}"] for x in ("--set", s))]
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": "trainer", "MLFLOW_TRACKING_PASSWORD": "not-the-password"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"MLflow tracking server {mlflow_auth_server.uri} refused the credentials (HTTP 401)" in result.stderr
    assert "Traceback" not in result.stderr and "not-the-password" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing was started


def test_a_sweep_logs_and_registers_with_credentials_from_the_environment(ray_session, mlflow_auth_server, tmp_path):
    (tmp_path / "space.yaml").write_text("train.warmup_steps: {choice: [20, 40]}\n")
    cfg = small_config(tmp_path, "tune.num_samples=2", "tune.scheduler=fifo", "tune.name=auth-sweep",
                       "tracking.experiment=auth-sweep", "train.max_steps=20", "train.val_interval=20",
                       "train.average_last=1", tracking_uri=mlflow_auth_server.uri)
    with environment(MLFLOW_TRACKING_USERNAME="trainer", MLFLOW_TRACKING_PASSWORD=mlflow_auth_server.password):
        outcome = sweep(cfg, str(tmp_path / "space.yaml"))
        client = MlflowClient(mlflow_auth_server.uri)
        runs = client.search_runs([client.get_experiment_by_name("auth-sweep").experiment_id])
        versions = client.search_model_versions(f"name = '{cfg.tracking.registered_model}'")
    assert outcome.registered is not None and len(outcome.trials) == 2
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 3  # the sweep and its two trials
    # Trials and Ray Train's controllers are actors of a Ray instance started without the login: they logged too.
    trials = [r for r in runs if r.info.run_id != outcome.parent_run_id]
    assert all({"train_loss", "val_bleu"} <= set(r.data.metrics) for r in trials)
    assert any(v.version == outcome.registered.version for v in versions)
