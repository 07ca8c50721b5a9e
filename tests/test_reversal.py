"""Real learning on CPU in well under a minute: a small Transformer learns to reverse sequences.

The training (tests/reverse_job.py) runs as an idle job of the background lane, on the cycles the other
tests leave free; the test, run last, reads its figure.
"""

import json
import os
import sys
from pathlib import Path

from lane import Job
from reverse_job import REVERSE_FLOOR

ROOT = Path(__file__).resolve().parents[1]


def background_job(workdir: Path) -> Job:
    """tests/reverse_job.py with seed 0."""
    argv = [sys.executable, str(ROOT / "tests" / "reverse_job.py"), "0", str(workdir / "result.json")]
    return Job(argv, ROOT, dict(os.environ), timeout_s=900, idle=True)


def test_the_model_learns_to_reverse_sequences(lane):
    """Nearly every held-out sequence reversed exactly after 800 updates."""
    outcome = lane.result(__name__)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    exact = json.loads((outcome.workdir / "result.json").read_text())["exact_match"]
    assert exact >= REVERSE_FLOOR, exact
