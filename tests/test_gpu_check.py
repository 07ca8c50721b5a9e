"""benchmarks/gpu_check.sh --device cpu --quick: every step of the prepared GPU run, small, on the CPU.

The script runs once, in `make rehearse`, on the session's small corpus (prepared with Ray Data on the session's
Ray, or reused), and the test reads what it left.
"""

import json
import os
import sys
from pathlib import Path

import pytest
from scripts import script_run
from small import small_config

pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def outcome(ray_session, tmp_path_factory):
    from pipeline.data.prepare import prepare

    manifest = prepare(small_config(tmp_path_factory.mktemp("gpu-data")).data)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}  # the suite's interpreter, not PATH's
    argv = ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")]
    with script_run("gpu", lambda workdir: [*argv, str(workdir / "out"), manifest.path, "--device", "cpu", "--quick",
                                            "--deadline", "1400"], env, timeout_s=1500) as ran:
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
