"""Training on spot nodes, rehearsed on real Ray nodes (benchmarks/spot_rehearsal.py): a preemption notice
becomes a checkpoint before the deadline, the run shrinks to the worker that is left and grows back to two.

The scenario has its own Ray nodes, S3 server and MLflow store: it runs once for the module, in `make rehearse`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from scripts import script_run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(900)]
DEADLINE_S = 10  # half the benchmark's: the checkpoint is stored within about 5 s of the notice


def _argv(workdir: Path) -> list[str]:
    """The notice scenario alone, with a local S3 server of its own (not the session's)."""
    return [sys.executable, str(ROOT / "benchmarks" / "spot_rehearsal.py"), "--scenarios", "notice",
            "--deadline-s", str(DEADLINE_S), "--out", str(workdir)]


@pytest.fixture(scope="module")
def result():
    """The notice scenario's figures: its metric histories, tags, and the times of the drain."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    with script_run("spot", _argv, env, timeout_s=700) as outcome:
        logs = {p.name: p.read_text(errors="replace")[-3000:] for p in outcome.workdir.glob("*.log")}
        assert outcome.returncode == 0, (outcome.stderr[-3000:], logs)
        print(f"spot rehearsal: {outcome.seconds:.0f}s")
        return json.loads((outcome.workdir / "figures.json").read_text())["notice"]


def test_preempted_node_checkpoints_before_its_deadline_and_the_elastic_run_shrinks_then_grows(result):
    assert result["status"] == "FINISHED" and "chaos_error" not in result, result
    history = result["history"]
    # The notice became a checkpoint after the drain and before the deadline (the report that carries it).
    (warned,) = set(map(tuple, history["preemption_warning_s"]))  # logged again when resumed: MLflow keeps one
    jit_step, warning_s, reported_ms = warned
    assert result["drained_at"] * 1000 <= reported_ms <= result["deadline"] * 1000, (result, warned)
    assert 0 < warning_s <= DEADLINE_S
    # The run resumed from exactly that step: no update lost (rank 0 never trained past it).
    resumed = [int(v) for _, v, _ in sorted(history["resumed_from_step"], key=lambda e: e[2])]
    assert resumed[0] == jit_step, (resumed, jit_step)
    assert result["updates_lost"] == 0, {k: result[k] for k in ("last_update", "resumed_from")}
    # Two workers, then one (with the same tokens per update, within 10%), then two again.
    sizes = [(step, int(v), t) for step, v, t in sorted(history["world_size"], key=lambda e: e[2])]
    order = [size for i, (_, size, _) in enumerate(sizes) if i == 0 or size != sizes[i - 1][1]]
    assert order[:3] == [2, 1, 2], order
    size_of = {(step, stamp): size for step, size, stamp in sizes}  # both values of a progress line
    tokens = {}
    for step, value, stamp in history["tokens_per_update"]:
        tokens.setdefault(size_of[step, stamp], []).append(value)
    two, one = (sum(tokens[n]) / len(tokens[n]) for n in (2, 1))
    assert abs(one - two) <= 0.1 * two, (one, two)
    # Each restart has its tag; max_failures is 0, so no restart was counted as a failure.
    tags = result["tags"]
    assert tags["restart.1"].startswith(f"preemption at step {jit_step}, 2 -> 1 workers"), tags
    assert any(v.startswith("resize at step") and v.endswith("1 -> 2 workers") for v in tags.values()), tags
    # Every validation logged once.
    val_steps = [step for step, _, _ in history["val_loss"]]
    assert len(val_steps) == len(set(val_steps)), val_steps
    # Both original worker nodes logged their own system metrics.
    for node in result["nodes"]:
        assert f"system/{node}/cpu_utilization_percentage" in result["system_keys"], (node, result["system_keys"])
