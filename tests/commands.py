"""`nmt` commands as the tests run them: the command line, and a run stopped with a signal once it is ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from small import ROOT


def nmt(subcommand: str, *args: str, sets: list[str] = (), address: str | None = None) -> list[str]:
    """`python -m pipeline SUBCOMMAND ARGS --address A --set K=V ...` as an argument list."""
    command = [sys.executable, "-m", "pipeline", subcommand, *args]
    if address:
        command += ["--address", address]
    return command + [x for item in sets for x in ("--set", item)]


def run_until(command: list[str], ready: Callable[[], bool], log_path: Path, sig: int,
              timeout_s: float = 600, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start the command, send sig (like Ctrl-C, or a lost machine with SIGKILL) once ready() says so;
    (exit status, its log). Fails the test if the command ends first or is not ready in time."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                   env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.poll() is None and not ready():
            time.sleep(0.25)
        assert process.poll() is None, f"ended before the stop point:\n{log_path.read_text()[-3000:]}"
        assert ready(), f"no stop point within {timeout_s:.0f}s:\n{log_path.read_text()[-3000:]}"
        os.killpg(process.pid, sig)
        process.wait(180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    return process.returncode, log_path.read_text()
