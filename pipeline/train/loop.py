"""The per-worker training loop (plain PyTorch): token-budget batches -> DDP steps -> validation -> report.

The only code that runs on training workers. Ray (or torchrun) reaches it through a
WorkerContext; the loop itself knows nothing of either, so the same code trains under
`nmt train`, inside a Tune trial, and under `torchrun -m pipeline.train.loop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from model import Transformer, average_checkpoints, cooldown_factor, warmup_schedule

from ..common import checkpoint, log, storage
from ..common.errors import UserError
from ..common.messages import LoopArgs, ParentInit, Report
from ..common.node_metrics import NodeSampler
from ..config import Config, config_from_dict
from ..data.manifest import load_manifest
from . import elastic, parent
from .epoch_plan import EpochData, nothing
from .prefetch import Batch, BatchPrefetcher
from .progress_window import HeldReports, Window
from .schedule import Due, Schedule
from .shapes import ShapePolicy
from .shard import COLUMNS, TokenShard
from .step import TrainStep, adam
from .validate import Preempted, validate
from .workers import RayContext, WorkerContext, all_gather_objects, all_reduce_, all_reduce_max, unwrap

logger = log.get("train")


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so a resumed run continues exactly."""

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


def _amp_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """bf16 where the GPU supports it, fp16 (with a GradScaler) otherwise, off on CPU."""
    if setting == "off" or device.type != "cuda":
        return None
    if setting == "bf16" or (setting == "auto" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return torch.float16


class Replica:
    """One data-parallel replica: its model, optimizer and data, and the steps that change them."""

    def __init__(self, cfg: Config, data_path: str, ctx: WorkerContext, init: ParentInit | None = None,
                 attempt: str = ""):
        self.cfg, self.ctx, self.train_cfg, self.attempt = cfg, ctx, cfg.train, attempt
        manifest = load_manifest(data_path)
        self.tokenizer = manifest.tokenizer()
        tgt_vocab = None if self.tokenizer.joint else self.tokenizer.tgt_vocab_size
        self.model_cfg = cfg.transformer_config(self.tokenizer.src_vocab_size, tgt_vocab)
        torch.manual_seed(self.train_cfg.seed)  # every rank starts from the same weights
        random.seed(self.train_cfg.seed + ctx.world_rank)
        self.model = Transformer(self.model_cfg).to(ctx.device)
        self.optimizer = adam(self.model.parameters(), ctx.device)
        self.scheduler = warmup_schedule(self.optimizer, self.model_cfg.d_model, self.train_cfg.warmup_steps,
                                         self.train_cfg.lr_scale)
        self.amp_dtype = _amp_dtype(self.train_cfg.amp, ctx.device)
        self.scaler = torch.amp.GradScaler(enabled=self.amp_dtype == torch.float16)
        self.progress = Progress()
        self.resumed_from: int | None = None  # the step restored from, logged once to MLflow with the next line
        self.restart: dict | None = None  # why, and from how many workers (logged with resumed_from)
        # The restored checkpoint's own report, sent again with the next one: a run killed after the
        # checkpoint was saved but before Ray Train's controller logged its report would otherwise
        # leave a gap in MLflow's history. Values logged twice are identical, and MLflow keeps one.
        self.replayed: list[dict] = []
        self.snapshots: list[dict[str, torch.Tensor]] = []  # last N weights, for averaging
        self.held_for: set[tuple] = set()  # the preemption notices this process has checkpointed and held for
        self.node_sampler: NodeSampler | None = None  # on each node's first worker: its system metrics
        # By node id, not Ray Train's local rank: that groups workers by IP, which nodes may share.
        first_on_node = all_gather_objects(ctx.node).index(ctx.node) == ctx.world_rank
        if first_on_node and cfg.tracking.system_metrics_s > 0:
            self.node_sampler = NodeSampler(ctx.node, cfg.tracking.system_metrics_s, lambda: self.progress.step)
        if not self._restore() and init:  # a resumed fine-tuning run continues from its own checkpoint
            self._start_from_parent(init)
        # Micro-batches per update at this worker count: an update averages the same tokens at any size.
        self.accumulation = elastic.accumulation(self.train_cfg.target_tokens(), self.train_cfg.max_tokens,
                                                 ctx.world_size)
        self.progress.attempt = attempt
        self.train_step = TrainStep(ctx.prepare_model(self.model), self.train_cfg, self.model_cfg.pad_id,
                                    self.amp_dtype, ctx.device, self.accumulation)
        self.ddp_model = self.train_step.model  # compiled or not
        self.shapes = ShapePolicy.of(self.train_cfg)
        self.data = EpochData(manifest.split_dir("train"), ctx.world_rank, ctx.world_size, self.train_cfg.max_tokens,
                              self.train_cfg.seed, gather=all_gather_objects,
                              largest=lambda n: all_reduce_max([n], ctx.device)[0], shapes=self.shapes)
        val = manifest.read_split("validation", [*COLUMNS, "tgt"])
        self.val = TokenShard.from_batches([val])
        self.val_refs = val.column("tgt").to_pylist()

    def _restore(self) -> bool:
        """Resume from the newest checkpoint that loads (a corrupt or unsafe one is skipped with a warning)."""
        refused = []
        for directory in self.ctx.resume_candidates():
            try:  # every rank reads the same model file, so all ranks skip the same checkpoints
                state = checkpoint.load(directory, map_location=self.ctx.device)
            except UserError as err:
                refused.append(str(err))
                if self.ctx.is_main:
                    logger.warning(f"{err}; falling back to the checkpoint before it")
                continue
            self._load_state(directory, state)
            return True
        if refused:
            raise UserError(f"none of this run's {len(refused)} checkpoints can be loaded ({refused[-1]}); "
                            "delete the run's directory under train.storage_path to start it over")
        return False

    def _start_from_parent(self, init: ParentInit) -> None:
        """Fine-tuning: the parent's weights; the optimizer, schedule and progress stay fresh."""
        config, weights = parent.load_staged(init.path)
        parent.check_shape(config, init.described, self.model_cfg)  # a sweep may sample another shape
        self.model.load_state_dict(weights)
        if self.ctx.is_main:
            logger.info(f"starting from {init.described}; optimizer and learning-rate schedule start fresh")

    def _load_state(self, directory: str, state: dict) -> None:
        """Model, optimizer, schedule, progress and this rank's RNG streams from a loaded checkpoint."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        saved = state["progress"]
        self.progress = Progress(**{k: v for k, v in saved.items() if k in Progress.__dataclass_fields__})
        if "segment_workers" not in saved:  # saved before segments: its position counts the whole epoch's batches
            self.progress.segment_workers = saved.get("world_size", 0)
        self.resumed_from = self.progress.step
        self.restart = {"cause": elastic.restart_cause(saved, self.ctx.world_size, self.attempt),
                        "from_workers": saved.get("world_size") or self.ctx.world_size}
        self.progress.restarts += 1
        self.progress.preempted = False
        self.replayed = [*state.get("earlier", []), *([state["metrics"]] if "metrics" in state else [])]
        try:
            rng = checkpoint.load_rng(directory, self.ctx.world_rank)
        except Exception as err:  # a damaged RNG file only costs bit-exact resumption, not the run
            logger.warning(f"rank {self.ctx.world_rank}'s RNG state in {directory} cannot be loaded "
                           f"({type(err).__name__}); continuing with fresh random streams")
            rng = None
        if rng is not None:
            checkpoint.set_rng_state(rng)
        if self.ctx.is_main:
            logger.info(f"resumed from step {self.progress.step} (epoch {self.progress.epoch}, "
                        f"batch {self.progress.batch_in_epoch}) after a {self.restart['cause']}, on "
                        f"{self.ctx.world_size} worker(s) (was {self.restart['from_workers']})")

    def announce(self) -> None:
        """The run's first line: workers, device, process group, data on this rank, accumulation, precision."""
        if self.ctx.is_main:
            group = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
            pairs = self.data.rows.size // self.ctx.world_size
            logger.info(f"{self.ctx.world_size} worker(s), rank 0 on {self.ctx.device}, process group: {group}, "
                        f"{pairs:,} training pairs per rank and epoch, {self.accumulation} batch(es) per update, "
                        f"amp {self.amp_dtype or 'off'}{self.train_step.described(self.shapes)}")

    def epoch_batches(self) -> list[np.ndarray]:
        """This rank's batches for the rest of the epoch (epoch_plan); the loop goes on at progress.batch_in_epoch."""
        self.progress.world_size = self.ctx.world_size
        return self.data.begin(self.progress)

    def total_steps(self, batches_per_epoch: int) -> int:
        """Updates the whole run will make (for the ETA and the end condition)."""
        per_epoch = math.ceil(batches_per_epoch / self.accumulation)
        total = per_epoch * self.train_cfg.epochs
        return min(total, self.train_cfg.max_steps) if self.train_cfg.max_steps else total

    def prefetch(self, batches: list[np.ndarray]) -> BatchPrefetcher:
        """The collated batches, built ahead in a thread (pinned when they go to a GPU)."""
        return BatchPrefetcher(self.data.shard, batches, pin=self.ctx.device.type == "cuda", shapes=self.data.shapes)

    def cool_down(self, step: int, end_step: int) -> None:
        """Set the learning rate of the update after `step`: Eq. 3's, falling linearly to 0 at end_step."""
        if self.train_cfg.cooldown:
            factor = cooldown_factor(step / max(end_step, 1), self.train_cfg.cooldown)
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                group["lr"] = lr * factor  # from the schedule's value, so a factor never compounds

    def update(self, group: list[Batch]) -> torch.Tensor:
        """One optimizer update over `accumulation` micro-batches; returns this rank's [loss sum, target tokens].

        The sums stay on the device: the loop syncs them once per log line, not per micro-batch.
        """
        self.ddp_model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        for i, batch in enumerate(group):
            src, tgt_in, tgt_out = (t.to(self.ctx.device, non_blocking=True) for t in batch)
            last = i == len(group) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.ddp_model, "no_sync") \
                else self.ddp_model.no_sync()  # all-reduce gradients once per update, not per micro-batch
            with sync:
                loss, count = self.train_step(src, tgt_in, tgt_out)
                self.scaler.scale(loss).backward()
            sums += torch.stack([loss.detach().double(), count.double()])
        # DDP averaged the per-rank gradient sums; rescale so that every target token in the
        # global batch weighs the same: grad = sum over all tokens / all tokens. The factor is
        # a device tensor, so no step waits for the GPU to catch up.
        total_tokens = all_reduce_(sums[1].clone())
        self.scaler.unscale_(self.optimizer)
        factor = (self.ctx.world_size / total_tokens.clamp_min(1.0)).float()  # the grads' dtype: foreach's fast path
        torch._foreach_mul_([p.grad for p in self.model.parameters() if p.grad is not None], factor)
        if self.train_cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return sums

    def validate(self, held: HeldReports) -> dict[str, float]:
        """Validation metrics, asking about preemption between decoding chunks. On a notice the preemption
        checkpoint comes first (marked to validate again after the restart); if no restart comes, it validates."""
        try:
            return self._validate()
        except Preempted as stop:
            notice = stop.notice
            self.progress.validate_first = True
            held.flush(lambda earlier: self.checkpoint_and_hold(notice, earlier))
            self.progress.validate_first = False
            return self._validate()

    def _validate(self, ask: bool = True) -> dict[str, float]:
        return validate(unwrap(self.ddp_model), self.val, self.val_refs, self.tokenizer, self.train_cfg, self.ctx,
                        notice=self.notice if ask and self.train_cfg.preemption_check_s else None)

    def notice(self):
        """A preemption notice the ranks have not held for yet (all ranks ask together), else None.

        A drain that never completes keeps its notice up: the run checkpoints and holds for it once, then trains on.
        """
        found = self.ctx.preemption_notice()
        return None if found is None or elastic.notice_key(found) in self.held_for else found

    def report(self, metrics: dict, earlier: list[dict] | None = None, keep_snapshot: bool = True,
               final: bool = False) -> None:
        """Checkpoint (rank 0 writes the state, every rank its RNG) and report, with earlier progress values."""
        if keep_snapshot:
            self.snapshots = (self.snapshots + [{k: v.detach().to("cpu", copy=True)
                                                 for k, v in self.model.state_dict().items()}])
            self.snapshots = self.snapshots[-self.train_cfg.average_last:]
        self.progress.seen = self.data.seen(self.progress)  # every rank: a resize goes on from exactly here
        directory = storage.staging_dir("nmt-ckpt-")
        state = None
        if self.ctx.is_main:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                     "progress": self.progress.__dict__, "model_config": self.model_cfg.to_dict(),
                     "metrics": metrics, "earlier": earlier or []}
            self.tokenizer.save(directory)  # a checkpoint can be fine-tuned from on its own
        checkpoint.save(directory, self.ctx.world_rank, state)
        self.send(Report(metrics, tuple(earlier or ()), final), directory)

    def send(self, report: Report, directory: str | None = None) -> None:
        """Report (a barrier on every rank), with this node's system-metric samples when this rank takes them."""
        if self.node_sampler is not None:
            report = dataclasses.replace(report, node_samples=tuple(self.node_sampler.drain()))
        self.ctx.report(report.to_metrics(), directory)

    def will_average(self) -> bool:
        """Whether average_and_report will report, counting the snapshot the next report() keeps."""
        return min(len(self.snapshots) + 1, self.train_cfg.average_last) >= 2

    def average_and_report(self, best_bleu: float) -> None:
        """Evaluate the average of the last checkpoints (Sec. 6.1) and report it as a checkpoint of its own.

        Checkpoints are kept by val_bleu, so the average becomes the run's best only if it wins.
        """
        if len(self.snapshots) < 2:
            return
        self.model.load_state_dict(average_checkpoints(self.snapshots))
        metrics = {**self._validate(ask=False), "averaged": len(self.snapshots)}  # the run's end: no hold
        if self.ctx.is_main:
            logger.info(f"average of the last {len(self.snapshots)} checkpoints: val_bleu "
                        f"{metrics['val_bleu']:.2f} (best single {best_bleu:.2f})")
        self.report({**self.position_metrics(), **metrics, "time": time.time()}, keep_snapshot=False, final=True)

    def position_metrics(self) -> dict:
        """Where training stands (step, epoch, workers) and the learning rate: part of every report."""
        return {"step": self.progress.step, "epoch": self.progress.epoch, "world_size": self.ctx.world_size,
                "lr": self.optimizer.param_groups[0]["lr"]}

    def restart_metrics(self) -> dict:
        """Once after a resume: the step it resumed from and why (MLflow gets a tag per restart)."""
        if self.resumed_from is None:
            return {}
        found = {"resumed_from_step": self.resumed_from, "restarts": self.progress.restarts,
                 "restart_cause": self.restart["cause"], "restart_from_workers": self.restart["from_workers"]}
        self.resumed_from = None
        return found

    def checkpoint_and_hold(self, notice, earlier: list[dict]) -> None:
        """A worker's node is being reclaimed: a checkpoint now, at an update boundary, then no more updates (they
        would be lost with the node) until Ray Train restarts the workers from it after the deadline."""
        noticed_at = time.time()
        warning_s = elastic.seconds_left(notice.deadline_ms, noticed_at)
        self.held_for.add(elastic.notice_key(notice))
        if self.ctx.is_main:
            logger.warning(f"node(s) of rank(s) {notice.preempted_ranks} are being preempted (deadline in "
                           f"{warning_s:.0f}s): checkpointing step {self.progress.step}")
        self.progress.preempted = True
        # val_bleu NaN: Ray Train ranks the checkpoint below every validated one; no score of it is logged.
        self.report({**self.position_metrics(), "val_bleu": float("nan"), "time": time.time(),
                     "preemption_warning_s": warning_s}, earlier, keep_snapshot=False)
        if self.ctx.is_main:
            logger.warning(f"checkpoint of step {self.progress.step} stored "
                           f"{elastic.seconds_left(notice.deadline_ms, noticed_at):.0f}s before the deadline; "
                           "waiting for Ray Train to resume the run from it")
        elastic.wait_for_restart(notice.deadline_ms, noticed_at)
        self.progress.preempted = False  # no restart came: the node stays, and so does the run


def _eta(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def _progress_line(replica: Replica, schedule: Schedule, window: Window, held: HeldReports, due: Due,
                   end_of_epoch: bool) -> None:
    """The line's metrics, then a validation and checkpoint, an early report, or the values held back."""
    progress, ctx = replica.progress, replica.ctx
    metrics = {**window.close(progress.step), "train_seconds": progress.train_seconds, **replica.position_metrics(),
               **replica.restart_metrics(), "time": time.time()}  # a restart shows in the metrics
    if ctx.is_main:
        logger.info(f"step {progress.step}/{schedule.total} epoch {progress.epoch + 1} "
                    f"loss {metrics['train_loss']:.3f} lr {metrics['lr']:.2e} {metrics['tokens_per_s']:,.0f} tok/s "
                    f"ETA {_eta(schedule.remaining_s(progress.step, progress.train_seconds))}")
    if due.validate:
        if end_of_epoch and not progress.finished:
            replica.data.next_epoch(progress)
        _validation(replica, held, metrics)
    elif due.report:
        held.flush(lambda earlier: replica.send(Report(metrics, tuple(earlier))))
    else:
        held.hold(metrics)
    window.restart(progress.step)


def _validation(replica: Replica, held: HeldReports, metrics: dict) -> None:
    """Validate, log the result, then checkpoint and report it with the values held back."""
    progress = replica.progress
    metrics.update(replica.validate(held))
    progress.history.append({k: metrics[k] for k in ("step", "val_bleu", "val_loss")})
    if replica.ctx.is_main:
        logger.info(f"validation at step {progress.step}: val_loss {metrics['val_loss']:.3f} "
                    f"val_bleu {metrics['val_bleu']:.2f} val_chrf {metrics['val_chrf']:.2f}")
    final = progress.finished and not replica.will_average()
    held.flush(lambda earlier: replica.report(metrics, earlier, final=final))


def train_loop(loop_config: dict, ctx: WorkerContext | None = None) -> None:
    """Entry point on every worker: rebuild the config, train, validate, report, until done."""
    args = LoopArgs.from_dict(loop_config)
    log.setup(args.log_level, process_stderr=True)  # a worker process of its own
    ctx = ctx or RayContext()
    replica = Replica(config_from_dict(args.config), args.data_path, ctx, args.init, args.attempt)
    replica.announce()
    progress, schedule = replica.progress, Schedule(replica.train_cfg, ctx.device)
    if progress.finished:  # a rerun of a finished run: nothing to train, nothing to average again
        return
    window, held = Window(ctx.device, progress.step), HeldReports(replica.replayed, replica.train_cfg.report_interval_s)
    if progress.validate_first:  # preempted while validating: that validation comes first
        progress.validate_first = False
        _validation(replica, held, {**replica.position_metrics(), **replica.restart_metrics(), "time": time.time()})
    while not progress.finished:
        batches = replica.epoch_batches()
        per_epoch = replica.data.full_epoch_batches()  # a segment may be an epoch's rest only
        schedule.begin_epoch(progress.step, progress.train_seconds, replica.total_steps(per_epoch))
        position = progress.batch_in_epoch
        with replica.prefetch(batches[position:]) as stream:
            while position < len(batches) and not progress.finished:
                group = list(itertools.islice(stream, replica.accumulation))
                window.add(replica.update(group))
                position += len(group)
                progress.step, progress.batch_in_epoch = progress.step + 1, position
                progress.train_seconds = schedule.train_seconds()
                replica.cool_down(progress.step, schedule.end_step)
                if schedule.notices.due(progress.step) and (notice := replica.notice()) is not None:
                    held.flush(lambda earlier: replica.checkpoint_and_hold(notice, earlier))
                due = schedule.after_update(progress, position >= len(batches), held.waited())
                if due.line:
                    _progress_line(replica, schedule, window, held, due, end_of_epoch=position >= len(batches))
        if not progress.finished and progress.batch_in_epoch >= len(batches):
            replica.data.next_epoch(progress)
    replica.average_and_report(max((h["val_bleu"] for h in progress.history), default=-1.0))


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
    try:
        cfg = load_config(args.config, args.overrides)
        root = args.checkpoints or os.path.join(cfg.train.storage_path, cfg.train.run_name or "torchrun")
        loop_args = LoopArgs(cfg.to_dict(), args.data, log.level(), attempt="")
        train_loop(loop_args.to_dict(), TorchrunContext(root, args.device))
    except UserError as err:  # a user's mistake: the message, not a traceback
        raise SystemExit(f"{parser.prog}: error: {err}") from None


if __name__ == "__main__":
    main()
