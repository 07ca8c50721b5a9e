"""benchmarks/tracking_load.py at a small scale: its trials, sweeps and promotion run on both stores, and every
point they log is read back (the figures at 64 to 512 trials are in benchmarks/results.json).

The script starts its own PostgreSQL and MLflow servers: it runs once, in `make rehearse`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from scripts import script_run
from small import ROOT

pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(900)]


def _argv(workdir: Path) -> list[str]:
    """The load benchmark with 8 trials in 2 processes for 6 s on each store."""
    return [sys.executable, str(ROOT / "benchmarks" / "tracking_load.py"), "--trials", "8", "--processes", "2",
            "--duration-s", "6", "--report-interval-s", "1", "--ramp-s", "2", "--rows-per-report", "3",
            "--out", str(workdir / "load.json")]


@pytest.fixture(scope="module")
def outcome():
    with script_run("load", _argv, dict(os.environ), timeout_s=800) as ran:
        yield ran


def test_tracking_load_loses_nothing_on_sqlite_or_postgresql_and_lists_the_candidates(outcome):
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    out = outcome.workdir / "load.json"
    levels = {level["store"]: level for level in json.loads(out.read_text())["levels"]}
    assert set(levels) == {"sqlite", "postgresql"}
    for store, level in levels.items():
        assert level["trial_errors"] == 0 and level["processes_missing"] == 0, (store, level["first_trial_error"])
        # Each trial queued its reports' values, its node's and its controller's samples: all are in the store.
        assert level["points_queued"] > 8 * 6 * 3 and level["lost_points"] == 0 == level["extra_points"], level
        assert level["runs_not_finished"] == 0 and level["requests"] > 0 and level["p99_s"] > 0
        # Two sweeps, each with a best trial that its person's login could only mark a candidate.
        assert level["candidates_found"] == 2
