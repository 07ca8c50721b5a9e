"""benchmarks/gpu_check.sh --device cpu --quick: every step of the prepared GPU run, small, on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from small import small_config

from pipeline.data.prepare import prepare

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_every_step_small_on_a_cpu(ray_session, tmp_path):
    manifest = prepare(small_config(tmp_path).data)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}  # the suite's interpreter, not PATH's
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), manifest.path, "--device",
                           "cpu", "--quick", "--deadline", "3000"], env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, (out / "gpu_check.log").read_text()[-6000:]
    steps = json.loads((out / "gpu_check.json").read_text())["steps"]
    assert set(steps) == {"recipe", "recipe_epochs", "evaluate", "model_step_tiny", "cuda_tests", "loop_baseline",
                          "loop_baseline_epochs"}
    assert all(step["exit"] == 0 for step in steps.values())
    assert steps["evaluate"]["sentences"] == 100 and "test_bleu_lc" in steps["evaluate"]
    assert "epoch_tokens_per_s" in steps["recipe_epochs"] and "mfu" not in steps["model_step_tiny"]
    assert set(steps["model_step_tiny"]["variants"]) == {"fused_adam", "vocab_padded", "compiled"}
