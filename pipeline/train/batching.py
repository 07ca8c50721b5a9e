"""Token-budget batching for training: length-bucketed batches, equal counts per rank.

An example is a pair of id arrays (source ids, target ids) without bos/eos. The model sees
`src` = source ids, `tgt_in` = [bos] + target ids and `tgt_out` = target ids + [eos], so a
batch of B examples costs B * (max source length + max target length + 1) padded tokens,
and every batch keeps that cost within `max_tokens` (the paper's ~25k-token batches).

Batches are numpy index arrays into the caller's examples; shard.TokenShard.collate turns one
into tensors. shaped_batches cuts them for a shapes.ShapePolicy instead: a handful of tensor
shapes per epoch, for a compiled step.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from .shapes import ShapePolicy

# The first window a batch search looks at; it doubles while every example in it still fits.
_MIN_WINDOW = 64


def _as_lengths(src_lengths, tgt_lengths) -> tuple[np.ndarray, np.ndarray]:
    """Both length arrays as 1-D int64, checked to be non-negative and of equal size."""
    src = np.asarray(src_lengths)
    tgt = np.asarray(tgt_lengths)
    for name, arr in (("src_lengths", src), ("tgt_lengths", tgt)):
        if arr.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array of lengths, got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
        if arr.size and arr.min() < 0:
            raise ValueError(f"{name} holds a negative length at index {int(np.argmin(arr))}")
    if src.shape != tgt.shape:
        raise ValueError(
            f"src_lengths and tgt_lengths differ in size ({src.size} vs {tgt.size}): "
            "they must describe the same examples, one entry per sentence pair"
        )
    return src.astype(np.int64, copy=False), tgt.astype(np.int64, copy=False)


def _check_int(name: str, value, minimum: int) -> int:
    """`value` as an int no smaller than `minimum`, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_fits(src: np.ndarray, tgt: np.ndarray, max_tokens: int, cost: np.ndarray | None = None) -> None:
    """Raise if any single example costs more than the whole budget (cost: each one's padded width, if shaped)."""
    alone = src + tgt + 1 if cost is None else cost
    too_long = np.flatnonzero(alone > max_tokens)
    if too_long.size:
        i = int(too_long[0])
        others = f" (and {too_long.size - 1} more)" if too_long.size > 1 else ""
        raise ValueError(
            f"example {i} (source length {int(src[i])}, target length {int(tgt[i])}) needs "
            f"{int(alone[i])} tokens alone, over max_tokens={max_tokens}{others}: "
            "raise max_tokens or lower data.max_len"
        )


def _cost(src: np.ndarray, tgt: np.ndarray, idx: np.ndarray) -> int:
    """batch_cost without the checks, for callers that have validated the lengths once."""
    return int(idx.size * (src[idx].max() + tgt[idx].max() + 1)) if idx.size else 0


def batch_cost(src_lengths, tgt_lengths, indices) -> int:
    """Padded tokens of one batch: size * (max source length + max target length + 1)."""
    src, tgt = _as_lengths(src_lengths, tgt_lengths)
    return _cost(src, tgt, np.asarray(indices, dtype=np.int64))


def _greedy_fill(order: np.ndarray, src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Cut `order` into consecutive batches, each as long as the budget allows."""
    s, t = src[order], tgt[order]
    n = order.size
    batches = []
    start, previous = 0, _MIN_WINDOW
    while start < n:
        # No batch holds more than max_tokens // (cost of its first example) examples, so that
        # bounds the window; starting near the previous batch's size keeps the scans short.
        bound = min(n - start, max_tokens // int(s[start] + t[start] + 1))
        window = min(bound, max(_MIN_WINDOW, 2 * previous))
        while True:
            end = start + window
            widths = np.maximum.accumulate(s[start:end]) + np.maximum.accumulate(t[start:end]) + 1
            # Nondecreasing in the batch size, so the examples that fit are a prefix.
            costs = widths * np.arange(1, window + 1)
            size = int(np.searchsorted(costs, max_tokens, side="right"))
            if size < window or window == bound:
                break
            window = min(bound, 2 * window)
        assert size >= 1, "an example over the budget slipped past _check_fits"
        batches.append(order[start:start + size])
        start += size
        previous = size
    return batches


def _checked(src_lengths, tgt_lengths, max_tokens) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated lengths and budget, with every example known to fit the budget alone."""
    src, tgt = _as_lengths(src_lengths, tgt_lengths)
    max_tokens = _check_int("max_tokens", max_tokens, 1)
    _check_fits(src, tgt, max_tokens)
    return src, tgt, max_tokens


def _rng(seed, epoch) -> np.random.Generator:
    """The generator for one (seed, epoch): every epoch reshuffles, and reruns repeat exactly."""
    return np.random.default_rng([_check_int("seed", seed, 0), _check_int("epoch", epoch, 0)])


def token_budget_batches(
    src_lengths, tgt_lengths, max_tokens: int, seed: int = 0, epoch: int = 0
) -> list[np.ndarray]:
    """Length-homogeneous batches within `max_tokens`, in a shuffled order seeded by (seed, epoch)."""
    src, tgt, max_tokens = _checked(src_lengths, tgt_lengths, max_tokens)
    rng = _rng(seed, epoch)
    # Sort by target length, then by source length, ascending for even target lengths and
    # descending for odd ones: a batch that straddles two target lengths then joins examples
    # of similar source length (on Multi30k at 4096 tokens: 0.97 padding efficiency vs 0.95).
    # A random permutation before the stable sort breaks ties at random, so examples of equal
    # lengths meet different partners every epoch while each batch stays length-homogeneous.
    top = int(src.max(initial=0))
    key = tgt * (top + 1) + np.where(tgt % 2 == 0, src, top - src)
    # The narrowest unsigned type lets numpy radix-sort, which is faster (benchmarks/batching.py).
    key = key.astype(np.min_scalar_type(int(key.max(initial=0))))
    perm = rng.permutation(src.size)
    order = perm[np.argsort(key[perm], kind="stable")]
    batches = _greedy_fill(order, src, tgt, max_tokens)
    # Shuffle the batches so that training does not walk from short sentences to long ones.
    return [batches[i] for i in rng.permutation(len(batches))]


def shaped_batches(src_lengths, tgt_lengths, shapes: ShapePolicy, seed: int = 0, epoch: int = 0) -> list[np.ndarray]:
    """Batches of examples that share one padded width pair, at most its full rows each, in a shuffled order.

    Each width pair's examples (in a random order seeded by (seed, epoch)) are cut into batches of
    shapes.full_rows; only its last batch is short, and collate pads that one's rows to a bucket.
    With a policy fitted to these lengths (ShapePolicy.fitted), the pairs are its kept ones.
    """
    src, tgt = _as_lengths(src_lengths, tgt_lengths)
    src_width, tgt_width = shapes.widths(src, tgt)
    _check_fits(src, tgt, shapes.max_tokens, cost=src_width + tgt_width)
    if shapes.kept:  # a fitted policy: each example takes the kept pair its own widths resolve to
        pairs, inverse = np.unique(np.stack([src_width, tgt_width], axis=1), axis=0, return_inverse=True)
        resolved = np.array([shapes.resolve(*pair) for pair in pairs], dtype=np.int64)[inverse.reshape(-1)]
        src_width, tgt_width = resolved[:, 0], resolved[:, 1]
    rng = _rng(seed, epoch)
    key = tgt_width * (int(src_width.max(initial=0)) + 1) + src_width
    perm = rng.permutation(src.size)
    order = perm[np.argsort(key[perm], kind="stable")]
    starts = np.flatnonzero(np.diff(key[order], prepend=-1))  # where each width pair's run begins
    batches = []
    for start, end in zip(starts, [*starts[1:], order.size]):
        full = shapes.full_rows(src_width[order[start]], tgt_width[order[start]])
        batches += [order[i: min(i + full, end)] for i in range(start, end, full)]
    return [batches[i] for i in rng.permutation(len(batches))]


def random_batches(
    src_lengths, tgt_lengths, max_tokens: int, seed: int = 0, epoch: int = 0
) -> list[np.ndarray]:
    """The baseline: examples in random order, cut greedily into batches within `max_tokens`."""
    src, tgt, max_tokens = _checked(src_lengths, tgt_lengths, max_tokens)
    return _greedy_fill(_rng(seed, epoch).permutation(src.size), src, tgt, max_tokens)


def equalize_batch_count(
    batches: Sequence[np.ndarray], count: int, src_lengths, tgt_lengths
) -> list[np.ndarray]:
    """Split the costliest batches in two until there are exactly `count` of them."""
    src, tgt = _as_lengths(src_lengths, tgt_lengths)
    count = _check_int("count", count, 0)
    batches = [np.asarray(b, dtype=np.int64) for b in batches]
    if count < len(batches):
        raise ValueError(f"cannot equalize {len(batches)} batches down to {count}: splitting only adds batches")
    num_examples = sum(b.size for b in batches)
    if count > num_examples:
        raise ValueError(
            f"cannot make {count} batches from {num_examples} examples: each batch needs at least one; "
            "use fewer replicas or more data"
        )
    # A heap of (-cost, -size, position) picks the costliest splittable batch; positions are
    # tuples so that a split batch's halves sort where the batch was and the order stays stable.
    heap = [(-_cost(src, tgt, b), -b.size, (i,), b) for i, b in enumerate(batches)]
    heapq.heapify(heap)
    done = []  # batches of one example, which cannot be split further
    for _ in range(count - len(batches)):
        while heap[0][3].size < 2:
            done.append(heapq.heappop(heap))
        _, _, position, batch = heapq.heappop(heap)
        half = batch.size // 2
        for j, part in enumerate((batch[:half], batch[half:])):
            heapq.heappush(heap, (-_cost(src, tgt, part), -part.size, (*position, j), part))
    return [entry[3] for entry in sorted(heap + done, key=lambda entry: entry[2])]


def padding_efficiency(batches: Sequence[np.ndarray], src_lengths, tgt_lengths) -> float:
    """Real tokens over padded tokens across `batches`, both counting src + tgt + 1 per example."""
    src, tgt = _as_lengths(src_lengths, tgt_lengths)
    batches = [np.asarray(b, dtype=np.int64) for b in batches]
    batches = [b for b in batches if b.size]
    if not batches:
        raise ValueError("padding_efficiency needs at least one non-empty batch")
    sizes = np.array([b.size for b in batches])
    flat = np.concatenate(batches)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    widths = np.maximum.reduceat(src[flat], starts) + np.maximum.reduceat(tgt[flat], starts) + 1
    real = int((src[flat] + tgt[flat] + 1).sum())
    return real / int((sizes * widths).sum())
