"""What a progress line measures, and the values held back until the next report."""

from __future__ import annotations

import time

import torch

from .workers import all_reduce_


class Window:
    """Loss and target tokens since the last progress line, summed on the device: one host sync per line."""

    def __init__(self, device: torch.device, step: int):
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, target tokens
        self.restart(step)

    def add(self, sums: torch.Tensor) -> None:
        """An update's [loss sum, target tokens] on this rank."""
        self.sums += sums

    def close(self, step: int) -> dict[str, float]:
        """The window's loss per token, tokens/s and tokens per update over all ranks (an all-reduce)."""
        loss, tokens = all_reduce_(self.sums).tolist()
        self.sums.zero_()
        return {"train_loss": loss / max(tokens, 1), "tokens_per_s": tokens / (time.perf_counter() - self.start),
                "tokens_per_update": tokens / max(step - self.start_step, 1)}

    def restart(self, step: int) -> None:
        """The next window starts now (after a line's validation: windows leave validation out)."""
        self.start, self.start_step = time.perf_counter(), step


class HeldReports:
    """Progress values wait here and travel with the next report.

    ray.train.report is a barrier whose queue Ray Train's controller drains only every couple of
    seconds, so a report per progress line would stall training (2 s per report on CPU, as long on
    a GPU).
    """

    def __init__(self, replayed: list[dict], interval_s: float):
        self.values, self.interval_s, self.last = list(replayed), interval_s, time.monotonic()

    def waited(self) -> bool:
        """Whether this rank has held values for report_interval_s (the ranks then agree to send)."""
        return time.monotonic() - self.last >= self.interval_s

    def hold(self, metrics: dict) -> None:
        self.values.append(metrics)

    def take(self) -> tuple[dict, ...]:
        """The values held so far, for the report about to be sent; holding starts anew."""
        taken, self.values, self.last = tuple(self.values), [], time.monotonic()
        return taken
