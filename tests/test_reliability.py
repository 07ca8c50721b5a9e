"""Faults around training: the MLflow server down at the start, or going away mid-run."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from commands import nmt
from conftest import environment, free_port
from logs import leaks
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, data_dir

from pipeline.common.messages import Report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def ray_session_logs(ray) -> Path:
    """The log folder of the tests' Ray instance (/tmp/ray/session_latest may be another Ray's, started since)."""
    return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"


@pytest.fixture(scope="module")
def restarting_server(postgres, tmp_path_factory):
    """An MLflow server with logins on PostgreSQL, of this module's own: its tests stop and start it again.

    The store lives in PostgreSQL, so a restarted server has every run and metric logged before.
    """
    import secrets

    from mlflow_users import create_user
    from servers import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("restarting"), postgres.database("mlflow_restarting"), auth=True,
                          auth_backend=postgres.database("mlflow_restarting_auth"))
    server.password = secrets.token_urlsafe(16)
    with server:
        with server.admin():
            create_user(server.uri, "trainer", server.password)
        yield server


# A short outage is enough to be one: the server takes a few seconds more to start, and the logger's backoff
# (1 s, doubling) has tried several times before it answers.
DOWN_S = 4


def restart(server, down_s: float, stopped: dict) -> None:
    """Stop the server (every connection refused), and start it again on its port down_s seconds later."""
    server.stop()
    stopped["at"] = time.monotonic()
    time.sleep(down_s)
    server.start()
    stopped["back"] = time.monotonic()


@pytest.mark.rehearse  # a whole `nmt train` with a server restart and a search of every file it wrote
def test_training_goes_on_while_its_tracking_server_restarts_and_no_secret_shows_anywhere(
        ray_session, restarting_server, tmp_path):
    """`nmt train` on the session's Ray with the password in its config file's tracking URI (MLflow's variables
    hold the same login and a token too). The server is stopped mid-run and started again: training goes on,
    the metrics wait and arrive at their own steps and times, the run ends FINISHED and its model registers.
    Neither secret shows in the command's output (MLflow's errors during the outage included), in any param,
    tag or artifact, in the run's storage or in any log file of Ray's session."""
    import os

    server, password, token = restarting_server, restarting_server.password, "tok-9f8e7d6c5b4a"
    config = tmp_path / "secret.yaml"
    config.write_text((ROOT / "configs" / "demo.yaml").read_text() + "\ntracking:\n  tracking_uri: "
                      + server.uri.replace("http://", f"http://trainer:{password}@") + "\n")
    command = nmt("train", "--config", str(config), address=ray_session.get_runtime_context().gcs_address,
                  sets=[*SMALL, f"data.output_dir={data_dir(tmp_path)}", f"train.storage_path={tmp_path / 'runs'}",
                        "tracking.experiment=outage", "train.max_steps=200", "train.epochs=100",
                        "train.val_interval=50", "train.log_every=5", "train.report_interval_s=1",
                        "train.average_last=1"])
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": "trainer", "MLFLOW_TRACKING_PASSWORD": password,
           "MLFLOW_TRACKING_TOKEN": token}
    client = MlflowClient(server.uri.replace("http://", f"http://trainer:{password}@"))  # the test's own login
    stopped: dict[str, float] = {}

    def restart_mid_run() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                experiment = client.get_experiment_by_name("outage")
                runs = client.search_runs([experiment.experiment_id]) if experiment else []
                if runs and any(m.step >= 10 for m in client.get_metric_history(runs[0].info.run_id, "train_loss")):
                    break
            time.sleep(0.5)
        restart(server, 8, stopped)  # training goes on meanwhile: each report finds the server down

    restarter = threading.Thread(target=restart_mid_run, daemon=True)
    restarter.start()
    try:
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=800, env=env)
    finally:
        restarter.join(timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    assert stopped.get("back"), "the server was never restarted"
    err = result.stderr
    assert "cannot log metrics to " + server.uri in err and "answers again" in err, err[-3000:]
    (run,) = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
    assert run.info.status == "FINISHED"
    # Its model was logged, with the login, too: a candidate, as a run on a server with logins makes no model.
    assert run.data.tags["nmt.candidate"] and client.search_logged_models([run.info.experiment_id])
    # Nothing is missing, and each value kept the time it was measured at, so the history reads in order.
    history = sorted(client.get_metric_history(run.info.run_id, "train_loss"), key=lambda m: m.step)
    assert [m.step for m in history] == list(range(5, 201, 5)), [m.step for m in history]
    assert [m.timestamp for m in history] == sorted(m.timestamp for m in history)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val_bleu"))[-1] == 200
    assert run.data.params["tracking.tracking_uri"] == server.uri.replace("http://", "http://trainer:***@")
    artifacts = client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts"))
    assert {"secret.yaml", "config.resolved.yaml"} <= {p.name for p in Path(artifacts).rglob("*")}  # both redacted
    texts = {"stdout": result.stdout, "stderr": err, "params": repr(run.data.params), "tags": repr(run.data.tags)}
    found = leaks([password, token], texts, [artifacts, tmp_path / "runs", ray_session_logs(ray_session)])
    assert not found, found


def test_a_run_ending_while_its_server_restarts_is_finished_and_its_last_metrics_arrive(restarting_server, caplog):
    """The last report and the run's end meet a stopped server: both are retried until it is back."""
    import logging

    from pipeline.track import reports, tracking

    server = restarting_server
    with environment(MLFLOW_TRACKING_USERNAME="trainer", MLFLOW_TRACKING_PASSWORD=server.password,
                     MLFLOW_TRACKING_TOKEN=None, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
                     MLFLOW_HTTP_REQUEST_TIMEOUT="5"):
        client = MlflowClient(server.uri)
        with caplog.at_level(logging.WARNING, logger="pipeline"):
            with tracking.mlflow_run(server.uri, "ends", "run-a", {}, {}) as run:
                logger = reports.MetricLogger(run)
                stopped: dict[str, float] = {}
                restarter = threading.Thread(target=restart, args=(server, DOWN_S, stopped), daemon=True)
                restarter.start()
                while "at" not in stopped:
                    time.sleep(0.1)
                logger.log(Report({"step": 1, "time": time.time(), "train_loss": 2.0}))  # kept: the server is down
                assert len(logger.pending) == 1 and logger.backoff_s >= 1.0
                logger.log(Report({"step": 2, "time": time.time(), "train_loss": 1.0}, final=True))  # waits for it
                assert not logger.pending and stopped.get("back")
                restarter.join(timeout=60)
                run.end_tags["note"] = "ended"
                stopped.clear()  # down again as the run ends: the end waits for it too
                restarter = threading.Thread(target=restart, args=(server, DOWN_S, stopped), daemon=True)
                restarter.start()
                while "at" not in stopped:
                    time.sleep(0.1)
            assert stopped.get("back")
            restarter.join(timeout=60)
        found = client.get_run(run.id)
        assert found.info.status == "FINISHED" and found.data.tags["note"] == "ended"
        assert [(m.step, m.value) for m in sorted(client.get_metric_history(run.id, "train_loss"),
                                                   key=lambda m: m.step)] == [(1, 2.0), (2, 1.0)]
    assert "answers again" in caplog.text


def test_a_server_that_refuses_under_load_gets_the_metrics_later_with_a_growing_backoff(restarting_server):
    """HTTP 503 (as MLflow answers when its database pool is exhausted): the logger keeps the values, waits
    longer after each refusal, and sends them in order once the server takes them."""
    import http.server
    import urllib.request

    from pipeline.track import reports, tracking

    server, refusing = restarting_server, {"on": True}

    class Gate(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if refusing["on"]:
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "pool exhausted"}')
                return
            request = urllib.request.Request(server.uri + self.path, data=body or None, method=self.command,
                                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                self.send_response(answer.status)
                payload = answer.read()
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    gate = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gate)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{gate.server_address[1]}"
    try:
        with environment(MLFLOW_TRACKING_USERNAME="trainer", MLFLOW_TRACKING_PASSWORD=server.password,
                         MLFLOW_TRACKING_TOKEN=None, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0"):
            client = MlflowClient(server.uri)
            run_id = client.create_run(client.create_experiment("refused")).info.run_id
            logger = reports.MetricLogger(tracking.Run(uri, run_id))
            backoffs = []
            for step in range(1, 4):
                logger.next_try = 0.0  # as if the backoff had passed: each report tries, and is refused
                logger.log(Report({"step": step, "time": 1_700_000_000.0 + step, "train_loss": 10.0 - step}))
                backoffs.append(logger.backoff_s)
            assert len(logger.pending) == 3 and backoffs == [1.0, 2.0, 4.0]
            logger.log(Report({"step": 4, "time": 1_700_000_004.0, "train_loss": 6.0}))  # inside the backoff: not tried
            assert len(logger.pending) == 4
            refusing["on"] = False
            logger.log(Report({"step": 5, "time": 1_700_000_005.0, "train_loss": 5.0}, final=True))
            history = sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.timestamp)
            assert [(m.step, m.value) for m in history] == [(s, 10.0 - s) for s in range(1, 6)]
    finally:
        gate.shutdown()


def test_an_unreachable_mlflow_server_stops_the_command_before_any_work(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "train", "--config", "configs/demo.yaml", "--set",
         f"tracking.tracking_uri={uri}", "--set", f"data.output_dir={tmp_path / 'data'}", "--set",
         f"train.storage_path={tmp_path / 'runs'}"], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"MLflow tracking server {uri} is unreachable" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing started
