"""One micro-batch's forward pass and loss, eager or under torch.compile, and the optimizer it feeds.

Compiled, the model (inside DDP, so DDP's bucketing stays) and the loss are two graphs with
dynamic shapes: shaped batches (shapes.py) bring a handful of shapes per epoch, all of them met
in the first epoch, so nothing compiles again after it. The loss is then written as plain tensor
operations, which inductor fuses, in place of model.training's hand-fused autograd Function that
serves eager steps. mode "reduce-overhead" replays each graph as a CUDA graph per shape, which
takes a small model's step from hundreds of kernel launches to a few graph launches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch import Tensor, nn

from model import label_smoothed_cross_entropy

from ..common import log
from ..config import TrainConfig
from .shapes import ShapePolicy

logger = log.get("train")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the torch.compile modes that replay CUDA graphs


def adam(parameters: Iterable[nn.Parameter], device: torch.device) -> torch.optim.Adam:
    """Adam as in Sec. 5.3 (beta2 0.98, epsilon 1e-9); on a GPU fused into a few kernels per update."""
    return torch.optim.Adam(parameters, betas=(0.9, 0.98), eps=1e-9, fused=device.type == "cuda")


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and the non-pad target count, as plain operations a compiler can fuse.

    The same sum as model.label_smoothed_cross_entropy: (1 - eps) nll + eps mean_j(-log p_j) per real token.
    """
    flat = target.reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat, ignore_index=pad_id,
                           label_smoothing=epsilon, reduction="sum")
    return loss, (flat != pad_id).sum()


def compile_mode(cfg: TrainConfig, device: torch.device, accumulation: int) -> str | None:
    """The torch.compile mode of a run (None: eager). CUDA graphs need one micro-batch per update: graph replays
    overwrite the gradients an update accumulates (pytorch/pytorch#169545), so with several the mode is default."""
    if not cfg.compile:
        return None
    if cfg.compile_mode in CUDA_GRAPH_MODES and device.type == "cuda" and accumulation > 1:
        logger.warning(f"train.compile_mode={cfg.compile_mode} needs one micro-batch per update, this run has "
                       f"{accumulation}: compiling without CUDA graphs (raise train.max_tokens or lower "
                       "train.tokens_per_update to use them)")
        return "default" if cfg.compile_mode == "reduce-overhead" else "max-autotune-no-cudagraphs"
    return cfg.compile_mode


def _loss_of(epsilon: float, pad_id: int, mode: str | None) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """(logits, target) -> (summed loss, target tokens): the fused Function eager, the plain ops compiled.

    epsilon and pad_id are closed over, so the compiler sees constants, not inputs it might make symbolic.
    """
    if mode is None:
        def fused(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
            loss, _, count = label_smoothed_cross_entropy(logits, target, epsilon, pad_id, compute_nll=False)
            return loss, count
        return fused

    def plain(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        return smoothed_cross_entropy(logits, target, epsilon, pad_id)
    return torch.compile(plain, mode=mode, dynamic=True)


class TrainStep:
    """Loss sum and target count of one micro-batch (forward under autocast, then the label-smoothed loss)."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, pad_id: int, amp_dtype: torch.dtype | None,
                 device: torch.device, accumulation: int = 1):
        self.amp_dtype, self.device = amp_dtype, device
        self.mode = compile_mode(cfg, device, accumulation)
        if self.mode is not None:
            # Sizes equal in the first batch (its rows and a width, or both widths) would share one symbol
            # (duck sizing), and each later batch where they differ would compile the step again.
            fx_config.use_duck_shape = False
        self.model = model if self.mode is None else torch.compile(model, mode=self.mode, dynamic=True)
        self.loss = _loss_of(cfg.label_smoothing, pad_id, self.mode)
        self._mark_steps = self.mode in CUDA_GRAPH_MODES and device.type == "cuda"

    def described(self, shapes: ShapePolicy) -> str:
        """What the run's first line adds about compiling and batch shapes ("" when neither is on)."""
        parts = [f"compiled ({self.mode})"] if self.mode else []
        if shapes.multiple > 1:
            parts.append(f"batch widths padded to a multiple of {shapes.multiple}")
        if shapes.buckets:
            parts.append(f"batch rows to one of {shapes.buckets} sizes")
        return "".join(f", {part}" for part in parts)

    def __call__(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        """(summed loss, target tokens) of the batch, ready for backward()."""
        if self._mark_steps:  # each micro-batch is a new step: earlier graph outputs are dead by now
            torch.compiler.cudagraph_mark_step_begin()
        amp = self.amp_dtype is not None
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=amp):
            logits = self.model(src, tgt_in)
        return self.loss(logits, tgt_out)
