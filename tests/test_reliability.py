"""Faults around training: the MLflow server down at the start, or going away mid-run."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from commands import nmt
from conftest import environment, free_port
from logs import leaks
from mlflow.tracking import MlflowClient
from small import ROOT, SMALL, data_dir

from pipeline.common.messages import Report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def restarting_server(mlflow_auth_server):
    """The session's MLflow server with logins, which these tests stop and start again (they log in as `trainer`).

    Its store lives in PostgreSQL, so the restarted server has every login, run and metric it had; it is
    running again when each test ends, whatever happened in it.
    """
    import types

    server = mlflow_auth_server.server
    try:
        yield types.SimpleNamespace(uri=server.uri, password=mlflow_auth_server.password, stop=server.stop,
                                    start=server.start)
    finally:
        if server.process is None or server.process.poll() is not None:
            server.stop()
            server.start()


# A short outage is enough to be one: the logger's backoff (1 s, doubling) has tried twice before the gate opens.
DOWN_S = 2


def restart(server, down_s: float, stopped: dict) -> None:
    """Stop the server (every connection refused), and start it again on its port down_s seconds later."""
    server.stop()
    stopped["at"] = time.monotonic()
    time.sleep(down_s)
    server.start()
    stopped["back"] = time.monotonic()


class Gate:
    """A proxy on a port of its own in front of the MLflow server: it passes requests on, answers 503 while
    `refusing` (as MLflow does when its database pool is exhausted), and refuses every connection while closed
    (as a stopped server does) without stopping the server behind it."""

    def __init__(self, target: str):
        self.target, self.refusing, self.port = target, False, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.listening = None
        self.open()

    def open(self) -> None:
        """Listen (again) on the gate's port."""
        listening = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), _GateHandler)
        listening.gate = self
        threading.Thread(target=listening.serve_forever, daemon=True).start()
        self.listening = listening

    def close(self) -> None:
        """Stop listening: a connection to the port is refused until open()."""
        listening, self.listening = self.listening, None
        if listening is not None:
            listening.shutdown()
            listening.server_close()

    def reopen_after(self, seconds: float) -> threading.Timer:
        """close() now and open() again in `seconds`, on a timer thread."""
        self.close()
        timer = threading.Timer(seconds, self.open)
        timer.start()
        return timer


class _GateHandler(http.server.BaseHTTPRequestHandler):
    """The Gate's requests: 503 while it refuses, else passed on to the server and its answer passed back."""

    def _answer(self):
        gate = self.server.gate
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if gate.refusing:
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "pool exhausted"}')
            return
        request = urllib.request.Request(gate.target + self.path, data=body or None, method=self.command,
                                         headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        try:
            answer = urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as refused:  # a 4xx or 5xx answer is passed back as it is
            answer = refused
        with answer:
            payload = answer.read()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.mark.rehearse  # a whole `nmt train` with a server restart and a search of every file it wrote
def test_training_goes_on_while_its_tracking_server_restarts_and_no_secret_shows_anywhere(
        ray_session, ray_dashboard, restarting_server, tmp_path):
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
    found = leaks([password, token], texts, [artifacts, tmp_path / "runs", ray_dashboard.session_dir / "logs"])
    assert not found, found


def test_a_run_ending_while_its_server_is_away_is_finished_and_its_last_metrics_arrive(mlflow_auth_server, caplog):
    """The last report and the run's end meet a server that refuses connections: both are retried until it is back."""
    import logging

    from pipeline.track import reports, tracking

    gate = Gate(mlflow_auth_server.uri)
    try:
        with environment(MLFLOW_TRACKING_USERNAME="trainer", MLFLOW_TRACKING_PASSWORD=mlflow_auth_server.password,
                         MLFLOW_TRACKING_TOKEN=None, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
                         MLFLOW_HTTP_REQUEST_TIMEOUT="5"):
            client = MlflowClient(mlflow_auth_server.uri)
            with caplog.at_level(logging.WARNING, logger="pipeline"):
                with tracking.mlflow_run(gate.uri, "ends", "run-a", {}, {}) as run:
                    logger = reports.MetricLogger(run)
                    reopening = gate.reopen_after(DOWN_S)
                    logger.log(Report({"step": 1, "time": time.time(), "train_loss": 2.0}))  # kept: nobody answers
                    assert len(logger.pending) == 1 and logger.backoff_s >= 1.0
                    logger.log(Report({"step": 2, "time": time.time(), "train_loss": 1.0}, final=True))  # waits
                    assert not logger.pending and gate.listening is not None
                    reopening.join()
                    run.end_tags["note"] = "ended"
                    reopening = gate.reopen_after(DOWN_S)  # away again as the run ends: the end waits for it too
                assert gate.listening is not None
                reopening.join()
            found = client.get_run(run.id)
            assert found.info.status == "FINISHED" and found.data.tags["note"] == "ended"
            assert [(m.step, m.value) for m in sorted(client.get_metric_history(run.id, "train_loss"),
                                                       key=lambda m: m.step)] == [(1, 2.0), (2, 1.0)]
        assert "answers again" in caplog.text
    finally:
        gate.close()


def test_a_server_that_refuses_under_load_gets_the_metrics_later_with_a_growing_backoff(mlflow_auth_server):
    """HTTP 503 (as MLflow answers when its database pool is exhausted): the logger keeps the values, waits
    longer after each refusal, and sends them in order once the server takes them."""
    from pipeline.track import reports, tracking

    gate = Gate(mlflow_auth_server.uri)
    gate.refusing = True
    try:
        with environment(MLFLOW_TRACKING_USERNAME="trainer", MLFLOW_TRACKING_PASSWORD=mlflow_auth_server.password,
                         MLFLOW_TRACKING_TOKEN=None, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0"):
            client = MlflowClient(mlflow_auth_server.uri)
            run_id = client.create_run(client.create_experiment("refused")).info.run_id
            logger = reports.MetricLogger(tracking.Run(gate.uri, run_id))
            backoffs = []
            for step in range(1, 4):
                logger.next_try = 0.0  # as if the backoff had passed: each report tries, and is refused
                logger.log(Report({"step": step, "time": 1_700_000_000.0 + step, "train_loss": 10.0 - step}))
                backoffs.append(logger.backoff_s)
            assert len(logger.pending) == 3 and backoffs == [1.0, 2.0, 4.0]
            logger.log(Report({"step": 4, "time": 1_700_000_004.0, "train_loss": 6.0}))  # inside the backoff: not tried
            assert len(logger.pending) == 4
            gate.refusing = False
            logger.log(Report({"step": 5, "time": 1_700_000_005.0, "train_loss": 5.0}, final=True))
            history = sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.timestamp)
            assert [(m.step, m.value) for m in history] == [(s, 10.0 - s) for s in range(1, 6)]
    finally:
        gate.close()


def test_an_unreachable_mlflow_server_stops_the_command_before_any_work(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "train", "--config", "configs/demo.yaml", "--set",
         f"tracking.tracking_uri={uri}", "--set", f"data.output_dir={tmp_path / 'data'}", "--set",
         f"train.storage_path={tmp_path / 'runs'}"], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"MLflow tracking server {uri} is unreachable" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing started
