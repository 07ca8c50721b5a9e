"""`nmt serve` as a command: prints its URL once ready, answers, then Ctrl-C shuts Serve down and exits 0."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, stop_process, wait_http
from small import ROOT
from test_serve import SENTENCES, post

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _wait_for_line(log_path: Path, text: str, timeout_s: float, process) -> None:
    """Poll the command's log until it prints text; fail if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log_path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            pytest.fail(f"`nmt serve` exited with {process.returncode} before printing {text!r}")
        time.sleep(0.5)
    pytest.fail(f"`nmt serve` did not print {text!r} within {timeout_s:.0f}s")


def test_nmt_serve_command_serves_until_interrupted(ray_session, champion, tmp_path):
    """`nmt serve` in its own process: it answers, and Ctrl-C shuts Serve down and exits 0.

    It joins the session's Ray instance (a second one costs half a minute on 2 cores); test_serve.py's
    module-scoped service has shut Serve down there before this file runs.
    """
    port = free_port()
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "pipeline", "serve", "--model", f"models:/{champion.model_name}@champion",
               "--port", str(port), "--address", ray_session.get_runtime_context().gcs_address,
               "--set", f"tracking.tracking_uri={champion.uri}", "--set", "serve.max_batch_size=4"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                   env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    try:
        # The URL line is the user's signal that the app is RUNNING; /healthz can answer a moment before
        # serve.run returns, and a Ctrl-C then would interrupt the start-up instead of the service.
        _wait_for_line(log_path, f"at http://127.0.0.1:{port}", 240, process)
        wait_http(f"http://127.0.0.1:{port}/healthz", 30, process)
        status, body = post(port, "POST", "/translate", json.dumps({"texts": SENTENCES}).encode())
        assert status == 200 and len(body["translations"]) == 2
        process.send_signal(signal.SIGINT)
        assert process.wait(90) == 0
        with pytest.raises(OSError):  # Serve was shut down, its proxy with it
            post(port, "GET", "/healthz", timeout_s=5)
    except BaseException:
        print(log_path.read_text()[-3000:])
        raise
    finally:
        stop_process(process)
    assert "[serve] shutting down" in log_path.read_text()
