"""When each update logs, validates, checkpoints, reports and ends the run: the same answer on every rank.

Every rank must stop at the same update (or the next all-reduce hangs) and report together (a
report is a barrier), so what depends on a rank's own clock (the time budget, the report interval)
is agreed by one all-reduce at each progress line and validation, never per update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..config import TrainConfig
from . import elastic
from .progress import Progress
from .workers import all_reduce_max


@dataclass(frozen=True)
class Due:
    """What an update is due for."""

    line: bool  # a progress line: the window's one host sync, metrics, the ETA
    validate: bool  # validation, a checkpoint and a report (also at the run's last update)
    checkpoint: bool  # a checkpoint and a report without validation (train.checkpoint_every)
    snapshot: bool  # the weights kept for the final average (train.average_every; else each validation's)
    report: bool  # the held progress values go out now: the report interval has passed on some rank


class Schedule:
    """The run's length, the cooldown's end (re-estimated under a time budget) and the per-update decisions."""

    def __init__(self, cfg: TrainConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.total: int | None = None  # updates the run will make, for the ETA and the end condition
        self.end_step: int | None = None  # where the cooldown ends
        self.notices = elastic.NoticeCadence(cfg.preemption_check_s, first_every=cfg.log_every)
        self._start_step, self._start, self._seconds_before = 0, time.perf_counter(), 0.0

    def begin_epoch(self, step: int, train_seconds: float, total_steps: int) -> None:
        """Start this epoch's clock; the run's length is fixed by its first epoch."""
        self.total = self.total or total_steps
        self.end_step = self.end_step or self.total
        self._start_step, self._start, self._seconds_before = step, time.perf_counter(), train_seconds

    def train_seconds(self) -> float:
        """Training time so far, across restarts."""
        return self._seconds_before + time.perf_counter() - self._start

    def remaining_s(self, step: int, train_seconds: float) -> float:
        """The ETA: the updates left at this epoch's rate, or the time budget left if that ends first."""
        rate = (step - self._start_step) / max(time.perf_counter() - self._start, 1e-9)
        remaining = (self.total - step) / max(rate, 1e-9)
        if self.cfg.time_budget_s:
            remaining = min(remaining, self.cfg.time_budget_s - train_seconds)
        return max(remaining, 0.0)

    def after_update(self, progress: Progress, end_of_epoch: bool, report_waited: bool) -> Due:
        """What update `progress.step` is due for; sets progress.finished when the run ends there."""
        cfg, step = self.cfg, progress.step
        out_of_steps = bool(cfg.max_steps) and step >= cfg.max_steps
        line = step % cfg.log_every == 0
        validate = bool(cfg.val_interval and step % cfg.val_interval == 0) or (not cfg.val_interval and end_of_epoch)
        report = False
        if line or validate:  # one all-reduce agrees on the budget and the report for every rank
            out_of_time, report, elapsed_ms = all_reduce_max(
                [int(bool(cfg.time_budget_s) and progress.train_seconds >= cfg.time_budget_s), int(report_waited),
                 int(progress.train_seconds * 1000)], self.device)
            out_of_steps |= bool(out_of_time)
            self.notices.retune(step, elapsed_ms / 1000)
            if cfg.time_budget_s and elapsed_ms:  # the same estimate on every rank, or replicas drift
                self.end_step = min(self.total, round(step * cfg.time_budget_s * 1000 / elapsed_ms))
        if end_of_epoch and progress.epoch + 1 >= cfg.epochs or out_of_steps:
            progress.finish()
        validate |= progress.finished
        checkpoint = not validate and bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
        snapshot = validate if not cfg.average_every else step % cfg.average_every == 0
        return Due(line or validate, validate, checkpoint, snapshot, bool(report))
