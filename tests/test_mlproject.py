"""The MLproject: `mlflow run . -e train` trains, and the run MLflow makes for it is the training run."""

import contextlib
import io
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, data_dir
from stores import sqlite_uri

from pipeline.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_mlflow_run_of_the_train_entry_point_trains_into_the_run_mlflow_made(ray_session, tmp_path):
    uri = sqlite_uri(tmp_path)
    overrides = [*SMALL, f"data.output_dir={data_dir(tmp_path)}", f"train.storage_path={tmp_path / 'runs'}",
                 f"tracking.tracking_uri={uri}", "tracking.experiment=mlproject", "train.max_steps=20",
                 "train.val_interval=20"]
    # Entry points take a config file: the resolved config of the small demo, as `nmt config` prints it.
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["config", "--config", str(ROOT / "configs" / "demo.yaml"),
                     *(arg for item in overrides for arg in ("--set", item))]) == 0
    config = tmp_path / "small.yaml"
    config.write_text(printed.getvalue())
    # The entry point's command is `nmt ...`, found on PATH as in an activated environment.
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "mlflow", "run", str(ROOT), "-e", "train", "--env-manager", "local",
                           "--experiment-name", "mlproject", "-P", f"config={config}",
                           "-P", f"address={ray_session.get_runtime_context().gcs_address}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mlproject").experiment_id])  # one run, not two
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["mlflow.project.entryPoint"] == "train" and tags["mlflow.source.type"] == "PROJECT"
    assert tags["nmt.run_name"] and tags["data_manifest"]  # what `nmt train` tags its run with
    assert run.data.params["model.d_model"] == "64" and run.data.params["config"] == str(config)
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "val_bleu")) == 20
