"""benchmarks/cpu_profile.py: a command's CPU time, by kind of process."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

BUSY = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"


def run_profiler(*args: str) -> subprocess.CompletedProcess:
    """benchmarks/cpu_profile.py with these arguments, its output captured."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_profile.py"), *args], capture_output=True,
                          text=True, timeout=60)


def test_a_busy_child_is_counted_under_its_kind_and_the_exit_status_passes_through(tmp_path):
    out = tmp_path / "profile.json"
    done = run_profiler("--interval", "0.1", "--json", str(out), "--",
                        sys.executable, "-c", BUSY + "\nraise SystemExit(3)")
    assert done.returncode == 3, done.stderr
    profile = json.loads(out.read_text())
    assert 0.8 <= profile["by_kind"]["python -c"] <= profile["busy_s"], profile["by_kind"]
    assert sum(profile["timeline_30s"]["0"].values()) == pytest.approx(sum(profile["by_kind"].values()))
    assert "python -c" in done.stderr and not list(tmp_path.glob("*.partial"))


def test_without_a_command_it_says_how_to_name_one():
    done = run_profiler()
    assert done.returncode == 2 and "name the command to run after --" in done.stderr
