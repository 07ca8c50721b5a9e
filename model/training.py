"""Training pieces of Sec. 5: label-smoothed loss, the warmup schedule, checkpoint averaging."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float, pad_id: int,
                                 compute_nll: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
    """Summed label-smoothed loss, summed NLL (None unless compute_nll) and the non-pad token count (Sec. 5.4).

    Sums rather than means so that data-parallel workers can add them up and divide by the
    global token count: every token weighs the same whatever batch it fell in. The NLL is a
    second pass over the vocabulary, so training steps skip it.
    """
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_target = target.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_target, ignore_index=pad_id,
                           label_smoothing=epsilon, reduction="sum")
    with torch.no_grad():
        nll = F.cross_entropy(flat_logits, flat_target, ignore_index=pad_id, reduction="sum") \
            if compute_nll else None
        num_tokens = (flat_target != pad_id).sum()
    return loss, nll, num_tokens


def transformer_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (Eq. 3), step >= 1."""
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def warmup_schedule(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int,
                    scale: float = 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following Eq. 3; the optimizer's lr must be 1.0 (the schedule is the lr)."""
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps must be positive, got {warmup_steps}")
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] = 1.0
    # LambdaLR counts from 0 while Eq. 3 counts updates from 1.
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: transformer_lr(index + 1, d_model, warmup_steps, scale)
    )


def average_checkpoints(state_dicts: Iterable[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Element-wise mean of model state dicts, as the paper averages its last checkpoints (Sec. 6.1)."""
    total: dict[str, Tensor] = {}
    count = 0
    for state in state_dicts:
        if count and state.keys() != total.keys():
            missing = sorted(set(total) ^ set(state))
            raise ValueError(f"checkpoints to average have different parameters: {missing[:5]}")
        for name, tensor in state.items():
            if count == 0:
                total[name] = tensor.detach().clone().double() if tensor.is_floating_point() else tensor.clone()
            elif tensor.is_floating_point():
                total[name] += tensor.detach().double()
        count += 1
    if count == 0:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    reference = state  # the last one gives the dtypes back
    return {
        name: (value / count).to(reference[name].dtype) if value.is_floating_point() else value
        for name, value in total.items()
    }
