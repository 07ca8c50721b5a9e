"""Training pieces of Sec. 5: label-smoothed loss, the warmup schedule, checkpoint averaging."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy over [tokens, vocab] logits, forward and backward in few passes.

    loss_i = lse_i - (1 - eps) x_i[t_i] - eps mean_j(x_ij), so d loss_i / d x_ij = softmax_ij - (1 - eps)[j = t_i]
    - eps / V. Neither log-probabilities nor a one-hot are materialised, and the backward pass turns the
    forward's exponentials into the gradient in place: on CPU each fresh [tokens, vocab] tensor costs
    more than the arithmetic on it, and F.cross_entropy allocates four.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        real = target != pad_id
        target = target.masked_fill(~real, 0)  # any valid index; padded rows are weighted 0
        shift = logits.amax(dim=-1, keepdim=True)
        exp = torch.sub(logits, shift).exp_()
        total = exp.sum(dim=-1)
        lse = shift.squeeze(1) + total.log()
        nll = lse - logits.gather(1, target[:, None]).squeeze(1)
        smooth = lse - logits.mean(dim=-1)
        loss = torch.where(real, (1.0 - epsilon) * nll + epsilon * smooth, 0.0).sum()
        ctx.save_for_backward(total, target, real)
        ctx.exp, ctx.epsilon = exp, epsilon  # an intermediate, consumed by the one backward pass
        ctx.mark_non_differentiable(nll)
        return loss, torch.where(real, nll, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None, None]:
        if ctx.exp is None:
            raise RuntimeError("label_smoothed_cross_entropy supports one backward pass per forward")
        total, target, real = ctx.saved_tensors
        grad, ctx.exp = ctx.exp, None
        weight = grad_loss * real  # d(sum of losses) / d loss_i
        grad.mul_((weight / total)[:, None]).sub_((ctx.epsilon / grad.shape[-1] * weight)[:, None])
        return grad.scatter_add_(1, target[:, None], ((ctx.epsilon - 1.0) * weight)[:, None]), None, None, None


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float, pad_id: int,
                                 compute_nll: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
    """Summed label-smoothed loss, summed NLL (None unless compute_nll) and the non-pad token count (Sec. 5.4).

    Sums rather than means so that data-parallel workers can add them up and divide by the
    global token count: every token weighs the same whatever batch it fell in. The NLL comes
    almost free with the loss; compute_nll=False only leaves it out of the result.
    """
    flat_target = target.reshape(-1)
    loss, nll = _LabelSmoothedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]).float(), flat_target,
                                                 epsilon, pad_id)
    return loss, nll if compute_nll else None, (flat_target != pad_id).sum()


def transformer_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (Eq. 3), step >= 1."""
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def cooldown_factor(done: float, cooldown: float) -> float:
    """The learning rate's multiplier once `done` of the run is over: 1, then linearly to 0 over the last `cooldown`."""
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - done) / cooldown))


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
