"""The per-worker training loop (plain PyTorch): token-budget batches -> DDP steps -> validation -> report.

A `Replica` holds a worker's model and data and what acts on them (updater, validator, checkpointer,
reporter); a `Trainer` runs it, and reads as the schedule: each update, then what `Schedule` says that
update is due for (a progress line, a validation, a checkpoint, a report, a preemption check).

The only code that runs on training workers. Ray (or torchrun) reaches it through a
WorkerContext; the loop itself knows nothing of either, so the same code trains under
`nmt train`, inside a Tune trial, and under `torchrun -m pipeline.train.loop`.
"""

from __future__ import annotations

import itertools
import math
import random
import time

import numpy as np
import torch
import torch.distributed as dist

from model import Transformer

from ..common import log
from ..common.errors import UserError
from ..common.messages import LoopArgs, ParentInit, Report
from ..config import Config, config_from_dict
from ..data.manifest import load_manifest
from . import elastic, parent
from .checkpointer import Checkpointer
from .epoch_plan import EpochData
from .prefetch import BatchPrefetcher
from .progress import Progress
from .progress_window import HeldReports, Window
from .reporter import Reporter
from .schedule import Schedule
from .shapes import ShapePolicy
from .updater import Updater
from .validate import Preempted, Validator
from .workers import RayContext, WorkerContext, all_gather_objects, all_reduce_max, unwrap

logger = log.get("train")


class Replica:
    """One data-parallel replica: its model and data, and what updates, validates, checkpoints and reports them."""

    def __init__(self, cfg: Config, data_path: str, ctx: WorkerContext, init: ParentInit | None = None,
                 attempt: str = ""):
        self.ctx, self.train_cfg = ctx, cfg.train
        manifest = load_manifest(data_path)
        tokenizer = manifest.tokenizer()
        self.model_cfg = cfg.transformer_config(tokenizer.src_vocab_size,
                                                None if tokenizer.joint else tokenizer.tgt_vocab_size)
        torch.manual_seed(self.train_cfg.seed)  # every rank starts from the same weights
        random.seed(self.train_cfg.seed + ctx.world_rank)
        self.model = Transformer(self.model_cfg).to(ctx.device)
        self.updater = Updater(self.model, self.train_cfg, self.model_cfg, ctx)
        self.checkpointer = Checkpointer(self.updater, tokenizer, self.model_cfg, self.train_cfg, ctx)
        restored = self.checkpointer.restore(attempt)
        if restored is None and init:  # a resumed fine-tuning run continues from its own checkpoint
            self._start_from_parent(init)
        self.progress = restored.progress if restored else Progress(attempt=attempt)
        self.replayed = restored.replayed if restored else []  # the restored checkpoint's report, sent again
        self.reporter = Reporter(ctx, cfg.tracking.system_metrics_s, lambda: self.progress.step,
                                 restored.restart if restored else None)
        self.holds = elastic.Holds(ctx.preemption_notice)
        self.validator = Validator(manifest, tokenizer, self.train_cfg, ctx, self.holds.notice)
        # Micro-batches per update at this worker count: an update averages the same tokens at any size.
        self.accumulation = elastic.accumulation(self.train_cfg.target_tokens(), self.train_cfg.max_tokens,
                                                 ctx.world_size)
        self.updater.prepare(self.accumulation, self.model_cfg.pad_id)
        self.shapes = ShapePolicy.of(self.train_cfg)
        self.data = EpochData(manifest.split_dir("train"), ctx.world_rank, ctx.world_size, self.train_cfg.max_tokens,
                              self.train_cfg.seed, gather=all_gather_objects,
                              largest=lambda n: all_reduce_max([n], ctx.device)[0], shapes=self.shapes)

    def _start_from_parent(self, init: ParentInit) -> None:
        """Fine-tuning: the parent's weights; the optimizer, schedule and progress stay fresh."""
        config, weights = parent.load_staged(init.path)
        parent.check_shape(config, init.described, self.model_cfg)  # a sweep may sample another shape
        self.model.load_state_dict(weights)
        self.say(f"starting from {init.described}; optimizer and learning-rate schedule start fresh")

    def say(self, message: str, warn: bool = False) -> None:
        """Log on rank 0 only: one line per event, not one per worker."""
        if self.ctx.is_main:
            (logger.warning if warn else logger.info)(message)

    def announce(self) -> None:
        """The run's first line: workers, device, process group, data on this rank, accumulation, precision."""
        group = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
        self.say(f"{self.ctx.world_size} worker(s), rank 0 on {self.ctx.device}, process group: {group}, "
                 f"{self.data.rows.size // self.ctx.world_size:,} training pairs per rank and epoch, "
                 f"{self.accumulation} batch(es) per update, amp {self.updater.amp_dtype or 'off'}"
                 f"{self.updater.step_fn.described(self.shapes)}")

    def total_steps(self, batches_per_epoch: int) -> int:
        """Updates the whole run will make (for the ETA and the end condition)."""
        total = math.ceil(batches_per_epoch / self.accumulation) * self.train_cfg.epochs
        return min(total, self.train_cfg.max_steps) if self.train_cfg.max_steps else total

    def prefetch(self, batches: list[np.ndarray]) -> BatchPrefetcher:
        """The collated batches, built ahead in a thread (pinned when they go to a GPU)."""
        return BatchPrefetcher(self.data.shard, batches, pin=self.ctx.device.type == "cuda", shapes=self.data.shapes)

    def validate(self, held: HeldReports) -> dict[str, float]:
        """Validation metrics. On a preemption notice while validating the checkpoint comes first (marked to
        validate again after the restart); if no restart comes, it validates."""
        try:
            return self.validator.score(unwrap(self.updater.wrapped))
        except Preempted as stop:
            self.hold(stop.notice, held, validating=True)
            return self.validator.score(unwrap(self.updater.wrapped))

    def hold(self, notice, held: HeldReports, validating: bool = False) -> None:
        """Checkpoint for a preemption notice with the values held back, then hold for the restart (elastic.Holds)."""
        def checkpoint(warning_s: float) -> None:
            self.progress.hold(validating)
            self.checkpoint(held, {"preemption_warning_s": warning_s})

        self.holds.hold(notice, checkpoint, lambda message: self.say(f"step {self.progress.step}: {message}", True))
        self.progress.released()  # no restart came: the node stays, and so does the run

    def checkpoint(self, held: HeldReports, values: dict) -> None:
        """A checkpoint without validation (train.checkpoint_every, a preemption notice), with the values held back.

        Its val_bleu is NaN: Ray Train keeps it as the latest and ranks it below every validated one, Tune and
        MLflow get no score of it, and its weights are not among those averaged at the end.
        """
        values = {**values, **self.position_metrics(), "val_bleu": float("nan"), "time": time.time()}
        self.report(Report(values, held.take()))

    def report(self, report: Report) -> None:
        """Checkpoint (rank 0 writes the state, every rank its RNG) and send the report with it."""
        self.progress.record_seen(self.data.seen(self.progress))  # every rank: a resize goes on from exactly here
        directory = self.checkpointer.save(self.progress, report.values, list(report.earlier))
        self.reporter.send(report, directory)

    def average_and_report(self) -> None:
        """Evaluate the average of the last checkpoints (Sec. 6.1) and report it as a checkpoint of its own.

        Checkpoints are kept by val_bleu, so the average becomes the run's best only if it wins.
        """
        averaged = self.checkpointer.average()
        if not averaged:
            return
        metrics = {**self.validator.score(unwrap(self.updater.wrapped), ask=False), "averaged": averaged}
        self.say(f"average of the last {averaged} checkpoints: val_bleu {metrics['val_bleu']:.2f} "
                 f"(best single {self.progress.best_bleu():.2f})")
        self.report(Report({**self.position_metrics(), **metrics, "time": time.time()}, final=True))

    def position_metrics(self) -> dict:
        """Where training stands (step, epoch, workers) and the learning rate: part of every report."""
        return {"step": self.progress.step, "epoch": self.progress.epoch, "world_size": self.ctx.world_size,
                "lr": self.updater.lr}


def _eta(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


class Trainer:
    """A replica's run, read as its schedule: an update, then what the schedule says that update is due for."""

    def __init__(self, replica: Replica):
        self.replica, self.progress = replica, replica.progress
        self.schedule = Schedule(replica.train_cfg, replica.ctx.device)
        self.window = Window(replica.ctx.device, self.progress.step)
        self.held = HeldReports(replica.replayed, replica.train_cfg.report_interval_s)

    def fit(self) -> None:
        """Train until the run ends, then evaluate and report the average of the last checkpoints."""
        if self.progress.finished:  # a rerun of a finished run: nothing to train, nothing to average again
            return
        if self.progress.pop_validate_first():  # preempted while validating: that validation comes first
            if not self.replica.train_cfg.average_every:
                self.replica.checkpointer.keep_snapshot()
            self.validate({**self.replica.position_metrics(), **self.replica.reporter.restart_values(),
                           "time": time.time()})
        while not self.progress.finished:
            self.epoch()
        self.replica.average_and_report()

    def epoch(self) -> None:
        """The rest of the epoch, update by update."""
        replica, progress = self.replica, self.progress
        batches = replica.data.begin(progress)  # as many on every rank, at least one
        self.schedule.begin_epoch(progress.step, progress.train_seconds,
                                  replica.total_steps(replica.data.full_epoch_batches()))
        position = progress.batch_in_epoch
        with replica.prefetch(batches[position:]) as stream:
            while position < len(batches) and not progress.finished:
                group = list(itertools.islice(stream, replica.accumulation))
                self.window.add(replica.updater.update(group))
                position += len(group)
                progress.updated(position, self.schedule.train_seconds())
                replica.updater.cool_down(progress.step, self.schedule.end_step)
                self.after_update(position >= len(batches))

    def after_update(self, end_of_epoch: bool) -> None:
        """What this update is due for, in this order: the progress line; the weights kept for the final average;
        the next epoch's position (so that a checkpoint of this update resumes there); a validation with its
        checkpoint, a checkpoint alone, the held values sent or held longer; a preemption check."""
        progress = self.progress
        due = self.schedule.after_update(progress, end_of_epoch, self.held.waited())
        metrics = self.line() if due.line else None
        if due.snapshot:
            self.replica.checkpointer.keep_snapshot()
        if end_of_epoch and not progress.finished:
            progress.next_epoch(self.replica.ctx.world_size)
        if due.validate:
            self.validate(metrics)
        elif due.checkpoint:
            self.replica.checkpoint(self.held, metrics or {})
        elif due.report:
            self.replica.reporter.send(Report(metrics, self.held.take()))
        elif metrics is not None:
            self.held.hold(metrics)
        if metrics is not None:
            self.window.restart(progress.step)  # windows leave validation and checkpoints out
        if not progress.finished and self.schedule.notices.due(progress.step) \
                and (notice := self.replica.holds.notice()) is not None:
            self.replica.hold(notice, self.held)

    def line(self) -> dict:
        """A progress line's metrics (a restart's values with the first after it), logged with the ETA."""
        replica, progress, schedule = self.replica, self.progress, self.schedule
        metrics = {**self.window.close(progress.step), "train_seconds": progress.train_seconds,
                   **replica.position_metrics(), **replica.reporter.restart_values(), "time": time.time()}
        replica.say(f"step {progress.step}/{schedule.total} epoch {progress.epoch + 1} "
                    f"loss {metrics['train_loss']:.3f} lr {metrics['lr']:.2e} {metrics['tokens_per_s']:,.0f} tok/s "
                    f"ETA {_eta(schedule.remaining_s(progress.step, progress.train_seconds))}")
        return metrics

    def validate(self, metrics: dict) -> None:
        """Validate, log the result, then checkpoint and report it with the values held back."""
        replica, progress = self.replica, self.progress
        metrics.update(replica.validate(self.held))
        progress.validated(metrics)
        replica.say(f"validation at step {progress.step}: val_loss {metrics['val_loss']:.3f} "
                    f"val_bleu {metrics['val_bleu']:.2f} val_chrf {metrics['val_chrf']:.2f}")
        final = progress.finished and not replica.checkpointer.will_average()
        replica.report(Report(metrics, self.held.take(), final))


def train_loop(loop_config: dict, ctx: WorkerContext | None = None) -> None:
    """Entry point on every worker: rebuild the config, train, validate, report, until done."""
    args = LoopArgs.from_dict(loop_config)
    log.setup(args.log_level, process_stderr=True)  # a worker process of its own
    log.quiet_exit_in_finalizers()  # Ray ends its workers with a SIGTERM
    ctx = ctx or RayContext()
    replica = Replica(config_from_dict(args.config), args.data_path, ctx, args.init, args.attempt)
    replica.announce()
    Trainer(replica).fit()


def main(argv: list[str] | None = None) -> None:
    """The same loop without Ray: `torchrun --nproc-per-node N -m pipeline.train.loop --config F --data DIR`."""
    import argparse
    import os

    from ..config import load_config
    from .workers import TorchrunContext

    parser = argparse.ArgumentParser(prog="python -m pipeline.train.loop", description=main.__doc__)
    parser.add_argument("--config", help="experiment YAML file")
    parser.add_argument("--data", required=True, help="a prepared dataset directory (from nmt prepare)")
    parser.add_argument("--checkpoints", help="checkpoint directory (default: <storage_path>/<run_name>)")
    parser.add_argument("--device", default="auto", help="auto (this rank's GPU when there is one), cpu or cuda")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    log.setup()  # progress lines at INFO, as `nmt train` prints them
    try:
        cfg = load_config(args.config, args.overrides)
        root = args.checkpoints or os.path.join(cfg.train.storage_path, cfg.train.run_name or "torchrun")
        loop_args = LoopArgs(cfg.to_dict(), args.data, log.level(), attempt="")
        train_loop(loop_args.to_dict(), TorchrunContext(root, args.device))
    except UserError as err:  # a user's mistake: the message, not a traceback
        raise SystemExit(f"{parser.prog}: error: {err}") from None


if __name__ == "__main__":
    main()
