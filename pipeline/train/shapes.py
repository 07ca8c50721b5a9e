"""Batch shapes that torch.compile and CUDA graphs can reuse: widths rounded up, rows from a few sizes.

Token-budget batches (batching.py) come in nearly as many shapes as there are batches: every
batch has its own row count and its own longest source and target. A compiled step then meets
hundreds of shapes per epoch, and a CUDA graph is recorded per shape. A ShapePolicy pads each
side's width up to a multiple (8 or 16) and a batch's rows up to one of a few sizes per width
pair (the most that fit the budget, half of that, a quarter, ...), so an epoch has a handful of
shapes and every later epoch has the same ones. The extra rows are all padding: their targets
count for nothing and their source is one token, so no attention row is empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


def round_up(lengths, multiple: int):
    """Each length (at least 1) rounded up to a multiple of `multiple`; an int or an int64 array as given."""
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    rounded = -(-lengths // multiple) * multiple
    return int(rounded) if rounded.ndim == 0 else rounded


@dataclass(frozen=True)
class ShapePolicy:
    """How batches are padded: widths to a multiple of `multiple`, rows to one of `buckets` sizes (0: as filled).

    `max_tokens` is the padded source + target tokens a batch may hold, its rows' padding included.
    `kept`: the width pairs batches are padded to (from fitted()); empty: each batch's own.
    """

    max_tokens: int
    multiple: int = 1
    buckets: int = 0
    kept: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, cfg) -> ShapePolicy:
        """The policy a TrainConfig sets (train.max_tokens, train.pad_multiple, train.batch_buckets)."""
        return cls(cfg.max_tokens, cfg.pad_multiple, cfg.batch_buckets)

    def __post_init__(self) -> None:
        for name, minimum in (("max_tokens", 1), ("multiple", 1), ("buckets", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValueError(f"ShapePolicy.{name} must be an integer >= {minimum}, got {value!r}")

    @property
    def active(self) -> bool:
        """Whether batches are shaped at all (else batching.token_budget_batches' exact widths)."""
        return self.multiple > 1 or self.buckets > 0

    def widths(self, src_lengths, tgt_lengths):
        """The padded source width and target width (tgt_in and tgt_out: target + 1) of examples or batches."""
        return round_up(src_lengths, self.multiple), round_up(np.asarray(tgt_lengths) + 1, self.multiple)

    def full_rows(self, src_width: int, tgt_width: int) -> int:
        """The most rows of this width pair that fit the budget (at least 1: batching checks each example fits)."""
        return max(1, self.max_tokens // (int(src_width) + int(tgt_width)))

    def row_sizes(self, src_width: int, tgt_width: int) -> list[int]:
        """The row counts a batch of this width pair may have, largest first (empty: any count)."""
        full = self.full_rows(src_width, tgt_width)
        return sorted({max(1, -(-full // 2 ** j)) for j in range(self.buckets)}, reverse=True)

    def rows(self, count: int, src_width: int, tgt_width: int) -> int:
        """The rows a batch of `count` examples is padded to: the smallest allowed size that holds them."""
        sizes = self.row_sizes(src_width, tgt_width)
        fitting = [size for size in sizes if size >= count]
        return fitting[-1] if fitting else count

    def resolve(self, src_width: int, tgt_width: int) -> tuple[int, int]:
        """The kept width pair a batch of these own widths is padded to: the cheapest that holds it (ties: the
        narrowest source), or its own where none does (an unfitted policy, or a pair wider than any kept)."""
        holding = [pair for pair in self.kept if pair[0] >= src_width and pair[1] >= tgt_width]
        return min(holding, key=lambda pair: (pair[0] + pair[1], pair)) if holding else (int(src_width), int(tgt_width))

    def fitted(self, src_lengths, tgt_lengths) -> ShapePolicy:
        """This policy with `kept` fitted to a shard: every width pair that fills a batch, and the widest of the rest.

        Widest first, each pair too rare to fill one batch joins the cheapest kept pair that holds it, or
        is kept itself where none does; so the same lengths always give the same pairs.
        """
        src_width, tgt_width = self.widths(src_lengths, tgt_lengths)
        pairs, counts = np.unique(np.stack([src_width, tgt_width], axis=1), axis=0, return_counts=True)
        fitted = replace(self, kept=())
        for i in np.argsort(-pairs.sum(axis=1), kind="stable"):
            pair = (int(pairs[i, 0]), int(pairs[i, 1]))
            if counts[i] >= self.full_rows(*pair) or fitted.resolve(*pair) == pair:
                fitted = replace(fitted, kept=(*fitted.kept, pair))
        return fitted

    def shape(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> tuple[int, int, int]:
        """(rows, source width, target width) of a batch whose examples have these lengths."""
        if not src_lengths.size:  # a step without examples: one dummy row of the narrowest shape
            src_width, tgt_width = self.resolve(*self.widths(1, 0))
            return self.rows(1, src_width, tgt_width), src_width, tgt_width
        src_width, tgt_width = self.resolve(*self.widths(int(src_lengths.max()), int(tgt_lengths.max())))
        return self.rows(src_lengths.size, src_width, tgt_width), src_width, tgt_width


def batch_shapes(batches: Sequence[np.ndarray], src_lengths, tgt_lengths,
                 shapes: ShapePolicy | None = None) -> list[tuple[int, int, int]]:
    """(rows, source width, target width) of each batch as collated, shaped or not."""
    src, tgt = np.asarray(src_lengths), np.asarray(tgt_lengths)
    if shapes is None or not shapes.active:
        return [(b.size, int(src[b].max()), int(tgt[b].max()) + 1) for b in batches]
    return [shapes.shape(src[b], tgt[b]) for b in batches]


def computed_efficiency(batches: Sequence[np.ndarray], src_lengths, tgt_lengths,
                        shapes: ShapePolicy | None = None) -> float:
    """Real tokens (source + target + 1 per example) over the tokens the batches' tensors hold, padding rows too."""
    src, tgt = np.asarray(src_lengths), np.asarray(tgt_lengths)
    real = sum(int((src[b] + tgt[b] + 1).sum()) for b in batches)
    held = sum(rows * (src_width + tgt_width) for rows, src_width, tgt_width in
               batch_shapes(batches, src, tgt, shapes))
    return real / max(held, 1)
