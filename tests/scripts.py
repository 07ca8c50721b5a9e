"""A long script of the rehearsal tier, run to its end in a short work directory of its own, then removed.

    with script_run("spot", lambda workdir: [python, "benchmarks/spot_rehearsal.py", "--out", str(workdir)],
                    env, timeout_s=700) as outcome:
        ... outcome.returncode, outcome.workdir ...

The directory is under /tmp with a short name: Ray's socket paths, made under a node's temp directory,
must stay under 107 bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from small import ROOT


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a script left: its exit code, its output, its work directory, and how long it ran."""

    returncode: int
    stdout: str
    stderr: str
    workdir: Path
    seconds: float


def _stop(process: subprocess.Popen) -> None:
    """The script and everything it started (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


@contextlib.contextmanager
def script_run(name: str, argv: Callable[[Path], list[str]], env: dict[str, str],
               timeout_s: float) -> Iterator[Outcome]:
    """argv(workdir) run from the project root to its end (killed after timeout_s), for the block."""
    workdir = Path(tempfile.mkdtemp(prefix=f"nmt-{name[:6]}-", dir="/tmp"))
    started = time.monotonic()
    process = subprocess.Popen(argv(workdir), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        try:
            out, err = process.communicate(timeout=timeout_s)
            code = process.returncode
        except subprocess.TimeoutExpired:
            _stop(process)
            out, err = process.communicate()
            code, err = -1, f"{err}\n(stopped after {timeout_s:.0f} s)"
        yield Outcome(code, out, err, workdir, round(time.monotonic() - started, 1))
    finally:
        if process.poll() is None:
            _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
