"""The background lane: long commands that need nothing from the session (their own cluster, servers and
files), started as soon as the tests are collected so that their minutes overlap the tests that keep one
core busy. A test module takes part by defining `background_job(workdir) -> Job`; its tests then read
`lane.result(name)`, and conftest runs them last.

Measured on 2 cores: the cluster rehearsal keeps 1.3 cores busy for three minutes, the fast tests 1.05 for two.

An `idle` job starts at once beside the others, in a thread of its own, and once set up lowers its own
priority (tests/idle.py): it then runs on the cycles that nothing else wants. A pair of Ray Train tests took
70 s beside such a job as alone, while at normal priority the job slowed the tests around it more than it saved.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from servers import stop_tree


@dataclasses.dataclass(frozen=True)
class Job:
    """One command of the lane: what to run, where, with which environment and for how long at most."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    timeout_s: float
    idle: bool = False  # starts at once, in a thread of its own, and lowers its priority once set up (tests/idle.py)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a job left: its exit code, its output, its work directory, and how long it ran."""

    returncode: int
    stdout: str
    stderr: str
    workdir: Path
    seconds: float


class Lane:
    """Runs its jobs one after another in a thread, each idle job in a thread of its own; `result` waits for one."""

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[Path, Job]] = {}
        self._outcomes: dict[str, Outcome] = {}
        self._done: dict[str, threading.Event] = {}
        self._processes: dict[str, subprocess.Popen] = {}
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(self, name: str, make_job) -> None:
        """Schedule make_job(workdir) under name (unless it returns None); its workdir is short (Ray's socket
        paths stay under 107 bytes)."""
        if name not in self._jobs:
            workdir = Path(tempfile.mkdtemp(prefix=f"nmt-{name[:6]}-", dir="/tmp"))
            job = make_job(workdir)
            if job is None:
                shutil.rmtree(workdir, ignore_errors=True)
                return
            self._jobs[name] = (workdir, job)
            self._done[name] = threading.Event()

    def start(self) -> None:
        """Start the jobs added so far, in the background."""
        if self._jobs and not self._threads:
            queue = [name for name, (_, job) in self._jobs.items() if not job.idle]
            idle = [[name] for name, (_, job) in self._jobs.items() if job.idle]
            self._threads = [threading.Thread(target=self._run_all, args=(names,), name="test-lane", daemon=True)
                             for names in [queue, *idle] if names]
            for thread in self._threads:
                thread.start()

    def result(self, name: str) -> Outcome:
        """The job's outcome, once it has ended (every job has a timeout, so this wait is bounded)."""
        self._done[name].wait()
        return self._outcomes[name]

    def running(self) -> bool:
        """Whether a job that is not idle is still running (or waiting for its turn)."""
        return bool(self._threads) and any(not self._done[name].is_set()
                                           for name, (_, job) in self._jobs.items() if not job.idle)

    def finished(self) -> dict[str, Outcome]:
        """The outcomes of the jobs that have ended, in the order they ended."""
        return dict(self._outcomes)

    def stop(self) -> None:
        """Stop the running jobs (each one's whole process group) and remove every work directory."""
        self._stopping.set()
        for process in list(self._processes.values()):
            if process.poll() is None:
                stop_tree(process)
        for thread in self._threads:
            thread.join(60)
        for workdir, _ in self._jobs.values():
            shutil.rmtree(workdir, ignore_errors=True)

    def _run_all(self, names: list[str]) -> None:
        for name in names:
            workdir, job = self._jobs[name]
            started = time.monotonic()
            try:
                if self._stopping.is_set():
                    raise RuntimeError("the session ended before this job started")
                process = self._processes[name] = subprocess.Popen(
                    job.argv, cwd=job.cwd, env=job.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True)
                try:
                    out, err = process.communicate(timeout=job.timeout_s)
                    code = process.returncode
                except subprocess.TimeoutExpired:
                    stop_tree(process)
                    out, err = process.communicate()
                    code, err = -1, f"{err}\n(the lane stopped it after {job.timeout_s:.0f} s)"
            except Exception as exc:  # reported to the test that reads this job, not lost in the thread
                code, out, err = -1, "", repr(exc)
            self._outcomes[name] = Outcome(code, out, err, workdir, round(time.monotonic() - started, 1))
            self._done[name].set()
