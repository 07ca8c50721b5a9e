"""benchmarks/gpu_check.sh --device cpu --quick: every step of the prepared GPU run, small, on the CPU.

The script needs nothing from the session (it prepares its own small corpus on a Ray of its own first): it
runs once, in `make rehearse`, and the test reads what it left.
"""

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from scripts import script_run
from small import SMALL

pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[1]


def _argv(workdir: Path) -> list[str]:
    """`nmt prepare` of the small corpus (a local Ray of its own), then the check on the CPU."""
    data_sets = [s for s in SMALL if s.startswith("data.")] + [f"data.output_dir={workdir / 'data'}"]
    prepare = [sys.executable, "-m", "pipeline", "prepare", "--address", "local", "--config", "configs/demo.yaml",
               *(arg for item in data_sets for arg in ("--set", item))]
    check = ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(workdir / "out")]
    # the corpus's directory is named by its content
    script = (f"set -e; {shlex.join(prepare)}; "
              f"exec {shlex.join(check)} \"$(ls -d {shlex.quote(str(workdir / 'data'))}/demo-en-de-*)\" "
              "--device cpu --quick --deadline 1400")
    return ["bash", "-c", script]


@pytest.fixture(scope="module")
def outcome():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}  # the suite's interpreter, not PATH's
    with script_run("gpu", _argv, env, timeout_s=1500) as ran:
        yield ran


def test_the_gpu_check_runs_every_step_small_on_a_cpu(outcome):
    out = outcome.workdir / "out"
    log = (out / "gpu_check.log").read_text()[-6000:] if (out / "gpu_check.log").exists() else ""
    assert outcome.returncode == 0, (outcome.stderr[-3000:], log)
    steps = json.loads((out / "gpu_check.json").read_text())["steps"]
    assert set(steps) == {"recipe", "recipe_epochs", "evaluate", "model_step_tiny", "cuda_tests", "loop_baseline",
                          "loop_baseline_epochs"}
    assert all(step["exit"] == 0 for step in steps.values())
    assert steps["evaluate"]["sentences"] == 100 and "test_bleu_lc" in steps["evaluate"]
    assert "epoch_tokens_per_s" in steps["recipe_epochs"] and "mfu" not in steps["model_step_tiny"]
    assert set(steps["model_step_tiny"]["variants"]) == {"fused_adam", "vocab_padded", "compiled"}
