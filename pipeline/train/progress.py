"""Where training stands: saved in every checkpoint so a resumed run continues exactly, and changed only here.

Every rank holds the same Progress (the loop's decisions are agreed by all-reduces), so each change
is a method that every rank calls at the same update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def nothing() -> torch.Tensor:
    """The bitmap of an epoch that has seen nothing yet."""
    return torch.empty(0, dtype=torch.uint8)


@dataclass
class Progress:
    """The run's position: updates, epoch, the segment of the epoch and what it has seen, validations, restarts."""

    step: int = 0  # optimizer updates done
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of the epoch's current segment already consumed (epoch_plan)
    finished: bool = False
    train_seconds: float = 0.0  # wall-clock time spent training so far, across restarts
    history: list[dict] = field(default_factory=list)  # validation metrics so far
    world_size: int = 0  # workers when saved
    segment_workers: int = 0  # the worker count of the epoch's current segment: its batches depend on it
    segment_seen: torch.Tensor = field(default_factory=nothing)  # the epoch's examples seen when the segment began
    seen: torch.Tensor = field(default_factory=nothing)  # ... and as of this checkpoint, all ranks together
    restarts: int = 0  # times the run resumed from a checkpoint
    preempted: bool = False  # saved on a preemption notice: the restart that follows is the preemption's
    validate_first: bool = False  # saved on a notice that came while validating: the restart validates first
    attempt: str = ""  # the command (nmt train, a trial) that saved it: a new one resuming is a rerun

    @classmethod
    def saved(cls, values: dict[str, Any]) -> Progress:
        """A checkpoint's progress (fields it does not know are left out; older checkpoints are read too)."""
        progress = cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})
        if "segment_workers" not in values:  # saved before segments: its position counts the whole epoch's batches
            progress.segment_workers = values.get("world_size", 0)
        return progress

    def resumed(self, attempt: str) -> None:
        """A restart resumes here: one more restart, no hold of the preemption it may have come from."""
        self.restarts, self.preempted, self.attempt = self.restarts + 1, False, attempt

    def running_on(self, workers: int) -> None:
        """The worker count this epoch goes on at; another count than its segment's starts a new segment."""
        self.world_size = workers
        if self.segment_workers != workers:
            self.segment_seen, self.segment_workers, self.batch_in_epoch = self.seen, workers, 0

    def updated(self, batch_in_epoch: int, train_seconds: float) -> None:
        """One more optimizer update, the segment consumed up to batch_in_epoch."""
        self.step, self.batch_in_epoch, self.train_seconds = self.step + 1, batch_in_epoch, train_seconds

    def finish(self) -> None:
        """The run ends at this update (the schedule's decision, the same on every rank)."""
        self.finished = True

    def next_epoch(self, workers: int) -> None:
        """The next epoch starts with nothing seen, in one segment at this worker count."""
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.seen, self.segment_seen, self.segment_workers = nothing(), nothing(), workers

    def validated(self, metrics: dict[str, float]) -> None:
        """A validation's scores, kept for the run's best."""
        self.history.append({key: metrics[key] for key in ("step", "val_bleu", "val_loss")})

    def best_bleu(self) -> float:
        """The best validation BLEU so far (-1 before any)."""
        return max((row["val_bleu"] for row in self.history), default=-1.0)

    def hold(self, validating: bool) -> None:
        """A preemption checkpoint is being saved: the restart after it is the preemption's (and validates
        first when the notice came while validating)."""
        self.preempted, self.validate_first = True, validating

    def released(self) -> None:
        """No restart came after the hold: the run goes on."""
        self.preempted, self.validate_first = False, False

    def pop_validate_first(self) -> bool:
        """Whether this start must validate before it trains (a notice came while validating); asked once."""
        first, self.validate_first = self.validate_first, False
        return first

    def record_seen(self, seen: torch.Tensor) -> None:
        """The examples the epoch has seen as of a checkpoint (all ranks together): a resize goes on from here."""
        self.seen = seen
