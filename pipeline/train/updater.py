"""A replica's optimizer updates: the model, Adam, the schedule of Eq. 3 (and its cooldown), mixed precision.

    updater = Updater(model, cfg, model_cfg, ctx)
    updater.prepare(accumulation, pad_id)    # DDP (and torch.compile) for this worker group
    sums = updater.update(micro_batches)     # one update; [loss sum, target tokens] on the device
    updater.cool_down(step, end_step)        # the learning rate of the next update
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from model import TransformerConfig, cooldown_factor, warmup_schedule

from ..config import TrainConfig
from .prefetch import Batch
from .step import TrainStep, adam
from .workers import WorkerContext, all_reduce_


def amp_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """bf16 where the GPU supports it, fp16 (with a GradScaler) otherwise, off on CPU."""
    if setting == "off" or device.type != "cuda":
        return None
    if setting == "bf16" or (setting == "auto" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return torch.float16


class Updater:
    """The model and what changes it: the optimizer, its schedule and the fp16 loss scaler."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, model_cfg: TransformerConfig, ctx: WorkerContext):
        self.model, self.cfg, self.ctx = model, cfg, ctx
        self.optimizer = adam(model.parameters(), ctx.device)
        self.scheduler = warmup_schedule(self.optimizer, model_cfg.d_model, cfg.warmup_steps, cfg.lr_scale)
        self.amp_dtype = amp_dtype(cfg.amp, ctx.device)
        self.scaler = torch.amp.GradScaler(enabled=self.amp_dtype == torch.float16)
        self.step_fn: TrainStep | None = None  # set by prepare(), once the worker count is known

    def prepare(self, accumulation: int, pad_id: int) -> None:
        """Wrap the model for this worker group (DDP, and torch.compile when asked) at its accumulation."""
        self.step_fn = TrainStep(self.ctx.prepare_model(self.model), self.cfg, pad_id, self.amp_dtype,
                                 self.ctx.device, accumulation)

    @property
    def wrapped(self) -> nn.Module:
        """The model as the step runs it (DDP, compiled or not)."""
        return self.step_fn.model

    def state(self) -> dict:
        """What a checkpoint keeps of it."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict()}

    def load(self, state: dict) -> None:
        """Its state from a checkpoint."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return self.optimizer.param_groups[0]["lr"]

    def cool_down(self, step: int, end_step: int) -> None:
        """Set the learning rate of the update after `step`: Eq. 3's, falling linearly to 0 at end_step."""
        if self.cfg.cooldown:
            factor = cooldown_factor(step / max(end_step, 1), self.cfg.cooldown)
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                group["lr"] = lr * factor  # from the schedule's value, so a factor never compounds

    def update(self, group: list[Batch]) -> torch.Tensor:
        """One optimizer update over a group of micro-batches; returns this rank's [loss sum, target tokens].

        The sums stay on the device: the loop syncs them once per log line, not per micro-batch.
        """
        wrapped, device = self.wrapped, self.ctx.device
        wrapped.train()
        sums = torch.zeros(2, dtype=torch.float64, device=device)
        for i, batch in enumerate(group):
            src, tgt_in, tgt_out = (t.to(device, non_blocking=True) for t in batch)
            last = i == len(group) - 1
            sync = contextlib.nullcontext() if last or not hasattr(wrapped, "no_sync") \
                else wrapped.no_sync()  # all-reduce gradients once per update, not per micro-batch
            with sync:
                loss, count = self.step_fn(src, tgt_in, tgt_out)
                self.scaler.scale(loss).backward()
            sums += torch.stack([loss.detach().double(), count.double()])
        self._step(all_reduce_(sums[1].clone()))
        return sums

    def _step(self, total_tokens: torch.Tensor) -> None:
        """The optimizer step. DDP averaged the per-rank gradient sums; rescaled so that every target token in
        the global batch weighs the same: grad = sum over all tokens / all tokens. The factor is a device tensor,
        so no step waits for the GPU to catch up."""
        self.scaler.unscale_(self.optimizer)
        factor = (self.ctx.world_size / total_tokens.clamp_min(1.0)).float()  # the grads' dtype: foreach's fast path
        torch._foreach_mul_([p.grad for p in self.model.parameters() if p.grad is not None], factor)
        if self.cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
