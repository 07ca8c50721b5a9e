"""An MLflow server that requires a login (`mlflow server --app-name basic-auth`): a wrong password.

A sweep that logs through the login is tests/test_tune_asha.py."""

from __future__ import annotations

import os
import subprocess

import pytest
from commands import nmt
from small import ROOT, SMALL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_wrong_password_is_one_line_naming_the_server_and_nothing_starts(mlflow_auth_server, tmp_path):
    command = nmt("train", "--config", "configs/demo.yaml",
                  sets=[*SMALL, f"data.output_dir={tmp_path / 'data'}", f"train.storage_path={tmp_path / 'runs'}",
                        f"tracking.tracking_uri={mlflow_auth_server.uri}"])
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": "trainer", "MLFLOW_TRACKING_PASSWORD": "not-the-password"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"MLflow tracking server {mlflow_auth_server.uri} refused the credentials (HTTP 401)" in result.stderr
    assert "Traceback" not in result.stderr and "not-the-password" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing was started
