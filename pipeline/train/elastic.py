"""A run whose worker count changes: the batch an update averages, why a run restarted, and when the ranks ask
Ray Train whether a node is about to be preempted (where an epoch resumes: epoch_plan).

The optimisation must not notice a resize: an update averages about `train.target_tokens()` padded
tokens whatever the worker count, so each restart recomputes the micro-batches per update; the
learning-rate schedule counts updates and so runs on unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Why a run's workers started again from a checkpoint (a tag per restart in MLflow).
PREEMPTION, RESIZE, FAILURE, RERUN = "preemption", "resize", "failure", "rerun"
# How long past a preemption deadline the workers wait for Ray Train to restart them before going on.
RESTART_WAIT_S = 120.0
UNKNOWN_DEADLINE_S = 120.0  # Ray Train's own wait when a drain names no deadline


def accumulation(target_tokens: int, max_tokens: int, world_size: int) -> int:
    """Micro-batches per update on each worker so that world_size workers together average target_tokens."""
    return max(1, round(target_tokens / (max_tokens * max(world_size, 1))))


def restart_cause(saved: dict, world_size: int, attempt: str) -> str:
    """Why a run resumes from a checkpoint whose progress is `saved`: a new command, a preemption, a resize
    or a failure. Ray Train does not tell the workers, so it is read from the checkpoint: a preemption
    checkpoint says so, more workers is a resize (Ray Train grows a healthy run), and anything else (fewer
    workers too: a node lost without notice) is a failure."""
    if attempt and saved.get("attempt") and saved["attempt"] != attempt:
        return RERUN
    if saved.get("preempted"):
        return PREEMPTION
    if world_size > saved.get("world_size", world_size):
        return RESIZE
    return FAILURE


class NoticeCadence:
    """When the ranks ask about preemption: every `every` updates, so all ranks ask at the same updates (the
    question is a barrier), with `every` re-derived from the rank-agreed time per update to about check_s."""

    def __init__(self, check_s: float, first_every: int):
        self.check_s, self.every = check_s, max(1, first_every)

    def due(self, step: int) -> bool:
        """Whether the ranks ask after update `step`."""
        return self.check_s > 0 and step % self.every == 0

    def retune(self, steps: int, seconds: float) -> None:
        """Re-derive the interval from `steps` updates taking `seconds` (the same figures on every rank)."""
        if steps > 0 and seconds > 0:
            self.every = max(1, int(self.check_s * steps / seconds))


def notice_key(notice) -> tuple:
    """What tells one preemption notice from another: its deadline and the ranks it names."""
    return notice.deadline_ms, tuple(sorted(notice.preempted_ranks))


def seconds_left(deadline_ms: int | None, noticed_at: float) -> float:
    """Seconds until a preemption deadline (Ray Train's default wait when the drain named none)."""
    deadline = deadline_ms / 1000 if deadline_ms else noticed_at + UNKNOWN_DEADLINE_S
    return deadline - time.time()


def wait_for_restart(deadline_ms: int | None, noticed_at: float, poll_s: float = 1.0) -> None:
    """Hold the ranks after a preemption checkpoint until Ray Train restarts them at the deadline: an update
    made now would be lost with the node. Returns (and training goes on) if no restart came well after it."""
    until = time.time() + seconds_left(deadline_ms, noticed_at) + RESTART_WAIT_S
    while time.time() < until:
        time.sleep(poll_s)


class Holds:
    """The preemption notices this process has checkpointed and held for. A drain that never completes keeps its
    notice up: the run checkpoints and holds for it once, then trains on."""

    def __init__(self, ask: Callable[[], Any]):
        self.ask, self.held_for = ask, set()

    def notice(self) -> Any:
        """A notice not held for yet (all ranks ask together: the question is a barrier), else None."""
        found = self.ask()
        return None if found is None or notice_key(found) in self.held_for else found

    def hold(self, notice: Any, checkpoint: Callable[[float], None], say: Callable[[str], None]) -> None:
        """A worker's node is being reclaimed: checkpoint(seconds before the deadline) now, then no more updates
        (they would be lost with the node) until Ray Train restarts the workers from it after the deadline."""
        noticed_at = time.time()
        warning_s = seconds_left(notice.deadline_ms, noticed_at)
        self.held_for.add(notice_key(notice))
        say(f"node(s) of rank(s) {notice.preempted_ranks} are being preempted (deadline in {warning_s:.0f}s): "
            "checkpointing")
        checkpoint(warning_s)
        say(f"checkpoint stored {seconds_left(notice.deadline_ms, noticed_at):.0f}s before the deadline; "
            "waiting for Ray Train to resume the run from it")
        wait_for_restart(notice.deadline_ms, noticed_at)
