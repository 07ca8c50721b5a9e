"""Which checkpoint a run publishes: the best validation among those Ray Train kept, the final average only where
it won, a damaged one passed over; and the tag that says which weights the run kept."""

import types

import torch
from ray.train import Checkpoint

from pipeline.common import checkpoint
from pipeline.track.publish import best_checkpoint, kept_checkpoint


def _kept(tmp_path, name: str, metrics: dict, loadable: bool = True) -> tuple[Checkpoint, dict]:
    """A checkpoint directory as Ray Train keeps one, with the metrics of its report."""
    directory = tmp_path / name
    checkpoint.save(directory, 0, {"model": {"w": torch.zeros(2)}, "progress": {"step": metrics.get("step", 0)}})
    if not loadable:
        (directory / checkpoint.MODEL_FILE).write_bytes(b"truncated")
    return Checkpoint.from_directory(str(directory)), metrics


def test_the_average_is_published_only_where_it_beats_every_validation(tmp_path):
    last = _kept(tmp_path, "last", {"step": 100, "val_bleu": 20.0})
    earlier = _kept(tmp_path, "earlier", {"step": 80, "val_bleu": 19.0})
    unvalidated = _kept(tmp_path, "checkpoint_every", {"step": 90, "val_bleu": float("nan")})
    losing = _kept(tmp_path, "average", {"step": 100, "val_bleu": 19.5, "averaged": 3})
    result = types.SimpleNamespace(best_checkpoints=[earlier, unvalidated, last, losing])
    best, metrics = best_checkpoint(result)
    assert best.path == last[0].path and kept_checkpoint(metrics) == "update 100"
    winning = _kept(tmp_path, "average-won", {"step": 100, "val_bleu": 21.0, "averaged": 3})
    best, metrics = best_checkpoint(types.SimpleNamespace(best_checkpoints=[earlier, last, winning]))
    assert best.path == winning[0].path and kept_checkpoint(metrics) == "average of the last 3 weights"


def test_a_damaged_best_checkpoint_is_passed_over_for_the_next_best(tmp_path, caplog):
    damaged = _kept(tmp_path, "damaged", {"step": 100, "val_bleu": 22.0}, loadable=False)
    next_best = _kept(tmp_path, "next", {"step": 80, "val_bleu": 19.0})
    best, metrics = best_checkpoint(types.SimpleNamespace(best_checkpoints=[damaged, next_best]))
    assert best.path == next_best[0].path and metrics["step"] == 80
    assert "publishing the next best checkpoint" in caplog.text
    assert best_checkpoint(types.SimpleNamespace(best_checkpoints=[damaged])) is None
