"""Which examples each rank trains on, so that an epoch sees every example once whatever its worker counts.

An epoch runs in segments, one per worker count it runs at. A segment starts from the examples the epoch
has already seen (a bitmap over corpus rows, gathered from all ranks into every checkpoint): rank r of W
takes every W-th of the examples left, in corpus order, and cuts its own batches from them. Within a
segment the batches depend only on (seed, epoch, rank, the examples left), so a restart at the same size
resumes the same batches at the same position; a restart at another size starts a new segment from the
bitmap. Either way no example is repeated or skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .batching import equalize_batch_count, shaped_batches, token_budget_batches
from .progress import Progress
from .shapes import ShapePolicy
from .shard import TokenShard, split_rows

NO_EXAMPLES = np.empty(0, np.int64)  # a rank's step without examples: its ranks' others still need one each


def pack(seen: np.ndarray) -> torch.Tensor:
    """A bool array as bits in a uint8 tensor, which a checkpoint keeps (weights_only loads it; WMT14: 560 kB)."""
    return torch.from_numpy(np.packbits(seen))


def unpack(bits: torch.Tensor, size: int) -> np.ndarray:
    """pack()'s bits as a bool array of `size` (all False for nothing())."""
    if not bits.numel():
        return np.zeros(size, bool)
    return np.unpackbits(bits.cpu().numpy(), count=size).astype(bool)


class EpochData:
    """One rank's examples and batches for the current segment of an epoch, and what the epoch has seen.

    progress: the loop's Progress (epoch, batch_in_epoch, seen, segment_seen, segment_workers), which a
    checkpoint saves. gather and largest are the ranks' collectives (all_gather_objects, an all-reduce max).
    shapes: a ShapePolicy to cut batches for (shaped_batches, fitted to each shard), else exact token-budget batches.
    """

    def __init__(self, split_dir: str, rank: int, world_size: int, max_tokens: int, seed: int,
                 gather: Callable[[object], list], largest: Callable[[int], int],
                 read: Callable[..., TokenShard] = TokenShard.read, shapes: ShapePolicy | None = None):
        self.split_dir, self.rank, self.world_size, self.max_tokens, self.seed = (
            split_dir, rank, world_size, max_tokens, seed)
        self.policy = shapes if shapes is not None and shapes.active else None
        self.shapes: ShapePolicy | None = None  # the policy fitted to the shard: collate with it
        self.gather, self.largest, self.read = gather, largest, read
        self.rows = split_rows(split_dir)
        self.size = int(self.rows[-1]) + 1 if self.rows.size else 0  # bitmaps are indexed by corpus row
        self.shard: TokenShard | None = None
        self._shard_of: tuple | None = None  # (segment_seen's bytes, world size) the shard was read for
        self.batches: list[np.ndarray] = []

    def begin(self, progress: Progress) -> list[np.ndarray]:
        """This rank's batches for the rest of the epoch, the same count on every rank (or the all-reduce hangs).

        At another worker count than the epoch's position was counted at, a new segment starts from what
        the epoch has seen; at the same count the segment's batches come back, to go on at batch_in_epoch.
        """
        progress.running_on(self.world_size)
        segment = (progress.segment_seen.cpu().numpy().tobytes(), self.world_size)
        if self._shard_of != segment:
            self.shard = None  # let go of the old shard before the new one is read
            seen = unpack(progress.segment_seen, self.size) if progress.segment_seen.numel() else None
            self.shard = self.read(self.split_dir, self.rank, self.world_size, seen=seen, rows=self.rows)
            self._shard_of = segment
        lengths = self.shard.src.lengths, self.shard.tgt.lengths
        seed = self.seed + self.rank
        if self.policy is not None:  # shapes fitted to this segment's shard, the same in each of its epochs
            self.shapes = self.policy.fitted(*lengths)
            batches = shaped_batches(*lengths, self.shapes, seed=seed, epoch=progress.epoch)
        else:
            batches = token_budget_batches(*lengths, self.max_tokens, seed=seed, epoch=progress.epoch)
        count = self.largest(len(batches))
        # A rank with fewer examples than the count (a small rest of an epoch after a resize) makes empty steps.
        cut = equalize_batch_count(batches, min(count, len(self.shard)), *lengths)
        self.batches = cut + [NO_EXAMPLES] * (count - len(cut))
        if progress.batch_in_epoch >= len(self.batches):  # an epoch's last update moves progress to the next
            raise RuntimeError(f"epoch {progress.epoch} has no batches left at batch {progress.batch_in_epoch}: "
                               "the checkpoint was saved at the end of an epoch without moving on to the next")
        return self.batches

    def seen(self, progress: Progress) -> torch.Tensor:
        """The examples the epoch has seen, all ranks together, up to batch_in_epoch (every rank calls it)."""
        mine = np.zeros(self.size, bool)
        done = self.batches[:progress.batch_in_epoch]
        if done and self.shard is not None:
            mine[self.shard.rows[np.concatenate(done)]] = True
        seen = unpack(progress.segment_seen, self.size)
        for part in self.gather(pack(mine)):
            seen |= unpack(part, self.size)
        return pack(seen)

    def full_epoch_batches(self) -> int:
        """About how many batches a whole epoch at this worker count has (the segment may be its rest only)."""
        left = len(self.shard) if self.shard is not None else 0
        counts = self.gather(left)  # every rank's examples, to scale the segment's batches up to the epoch
        return max(len(self.batches), round(len(self.batches) * self.rows.size / max(sum(counts), 1)))
