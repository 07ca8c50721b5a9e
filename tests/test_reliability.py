"""Faults around training: the MLflow server down at the start, or going away mid-run."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import environment, free_port
from logs import leaks
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, data_dir, small_config

from pipeline.train.driver import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


class SwitchableProxy:
    """A TCP proxy in front of the MLflow server; switched down, it cuts and refuses connections like an outage."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.refused = 0
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def set_up(self, up: bool) -> None:
        self.up = up
        if not up:
            with self.lock:
                for sock in self.open:
                    sock.close()  # live keep-alive connections die with the outage too
                self.open.clear()

    def close(self) -> None:
        self.listener.close()
        self.set_up(False)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                self.refused += 1
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.close()
                except OSError:
                    pass


def ray_session_logs(ray) -> Path:
    """The log folder of the tests' Ray instance (/tmp/ray/session_latest may be another Ray's, started since)."""
    return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"


def test_training_goes_on_while_mlflow_is_unreachable_and_logs_the_gap_afterwards(ray_session, mlflow_auth_server,
                                                                                     tmp_path, capfd):
    """Against a server with logins, the password in the tracking URI only: MLflow's errors during the outage
    name the URI, and the password shows in none of them, nor in any file, param, tag or artifact."""
    proxy = SwitchableProxy(int(mlflow_auth_server.uri.rsplit(":", 1)[1]))
    password = mlflow_auth_server.password
    uri = f"http://127.0.0.1:{proxy.port}"
    cfg = small_config(tmp_path, "train.max_steps=200", "train.epochs=100", "train.val_interval=50",
                       "train.log_every=5", "train.average_last=1", "tracking.register=false",
                       "tracking.experiment=outage", tracking_uri=uri.replace("http://", f"http://trainer:{password}@"))
    # The test itself reads past the proxy, with the login in its own client's URI.
    client = MlflowClient(mlflow_auth_server.uri.replace("http://", f"http://trainer:{password}@"))
    outage: dict[str, float] = {}

    def cut_mlflow_for_a_while() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            experiment = client.get_experiment_by_name("outage")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            if runs and any(m.step >= 10 for m in client.get_metric_history(runs[0].info.run_id, "train_loss")):
                break
            time.sleep(0.5)
        proxy.set_up(False)
        outage["start"] = time.monotonic()
        time.sleep(15)
        proxy.set_up(True)
        outage["end"] = time.monotonic()

    cutter = threading.Thread(target=cut_mlflow_for_a_while, daemon=True)
    cutter.start()
    try:  # no login in the environment: the driver takes it from the URI and gives it to Ray Train's controller
        with environment(MLFLOW_TRACKING_USERNAME=None, MLFLOW_TRACKING_PASSWORD=None, MLFLOW_TRACKING_TOKEN=None):
            outcome = train(cfg)
    finally:
        cutter.join(timeout=60)
        proxy.close()
    out, err = capfd.readouterr()
    assert outage.get("end") and proxy.refused > 0, "the outage never hit the run"
    assert "cannot log metrics to " + uri in err and "answers again" in err, err[-3000:]
    run = client.get_run(outcome.run_id)
    assert run.info.status == "FINISHED"
    # Nothing is missing: every progress report reached MLflow, the delayed ones after the outage.
    steps = sorted({m.step for m in client.get_metric_history(outcome.run_id, "train_loss")})
    assert steps == list(range(5, 201, 5)), steps
    assert sorted(m.step for m in client.get_metric_history(outcome.run_id, "val_bleu"))[-1] == 200
    artifacts = client.download_artifacts(outcome.run_id, "", str(tmp_path / "artifacts"))
    texts = {"stdout": out, "stderr": err, "params": repr(run.data.params), "tags": repr(run.data.tags)}
    found = leaks([password], texts, [artifacts, outcome.storage_path, ray_session_logs(ray_session)])
    assert not found, found


def test_an_unreachable_mlflow_server_stops_the_command_before_any_work(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "train", "--config", "configs/demo.yaml", "--set",
         f"tracking.tracking_uri={uri}", "--set", f"data.output_dir={tmp_path / 'data'}", "--set",
         f"train.storage_path={tmp_path / 'runs'}"], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"MLflow tracking server {uri} is unreachable" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing started


def test_no_secret_reaches_output_logs_params_or_artifacts(ray_session, mlflow_auth_server, tmp_path):
    """Against a server that checks logins: the password in the URI and in MLflow's variables is echoed nowhere."""
    import os

    password, token = mlflow_auth_server.password, "tok-9f8e7d6c5b4a"
    uri = mlflow_auth_server.uri.replace("http://", f"http://trainer:{password}@")
    config = tmp_path / "secret.yaml"
    config.write_text((ROOT / "configs" / "demo.yaml").read_text() + f"\ntracking:\n  tracking_uri: {uri}\n")
    command = [sys.executable, "-m", "pipeline", "train", "--config", str(config),
               "--address", ray_session.get_runtime_context().gcs_address]
    for item in [*SMALL, f"data.output_dir={data_dir(tmp_path)}", f"train.storage_path={tmp_path / 'runs'}",
                 "tracking.experiment=secrets", "train.max_steps=10", "train.val_interval=10", "train.epochs=100"]:
        command += ["--set", item]
    env = {**os.environ, "MLFLOW_TRACKING_PASSWORD": password, "MLFLOW_TRACKING_USERNAME": "trainer",
           "MLFLOW_TRACKING_TOKEN": token}
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]

    with environment(MLFLOW_TRACKING_USERNAME="trainer", MLFLOW_TRACKING_PASSWORD=password):
        client = MlflowClient(mlflow_auth_server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("secrets").experiment_id])
        artifacts = client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts"))
        assert client.search_model_versions(f"run_id = '{run.info.run_id}'")  # registered with the login, too
    # Ray Train's controller (an actor of the shared Ray instance, started without the login) logged them.
    assert {"train_loss", "val_bleu"} <= set(run.data.metrics)
    assert run.data.params["tracking.tracking_uri"] == mlflow_auth_server.uri.replace("http://", "http://trainer:***@")
    texts = {"stdout": result.stdout, "stderr": result.stderr, "params": repr(run.data.params),
             "tags": repr(run.data.tags)}
    # Every artifact and every log file of Ray's session
    found = leaks([password, token], texts, [artifacts, ray_session_logs(ray_session)])
    assert not found, found
    logged = {path.name for path in Path(artifacts).rglob("*")}
    assert {"secret.yaml", "config.resolved.yaml"} <= logged  # both configs were logged, redacted
