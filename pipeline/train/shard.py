"""A worker's sentence pairs as flat token arrays, and batches cut from them without Python lists.

At WMT14 size one of eight workers holds about 560k pairs and 30M tokens; as Python lists
that costs about 15x the token bytes and seconds to build (benchmarks/scale.py).
Here each side is one array of ids in the narrowest unsigned type that holds them (uint16
for vocabularies up to 65,536) plus an int64 start and a length per example, and `collate`
pads a batch with a few vectorised NumPy calls.

Examples are numbered in corpus order ("row"), whatever order their blocks arrived in: only
the per-example starts are permuted, never the ids, which are copied into one array as the
blocks arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from ..text.tokenizer import BOS_ID, EOS_ID, PAD_ID
from .shapes import ShapePolicy

COLUMNS = ["row", "src_ids", "tgt_ids"]  # what a shard is built from


@dataclass(frozen=True)
class Side:
    """One side (source or target) of a shard: ids of every example, concatenated, with starts and lengths."""

    tokens: np.ndarray  # the ids, in the order their blocks arrived
    starts: np.ndarray  # int64: example i's ids are tokens[starts[i]: starts[i] + lengths[i]]
    lengths: np.ndarray  # int64

    def ids(self, i: int) -> np.ndarray:
        """Example i's ids (a view)."""
        start = int(self.starts[i])
        return self.tokens[start: start + int(self.lengths[i])]

    def padded(self, index: np.ndarray, width: int, pad_id: int) -> np.ndarray:
        """The examples in `index` as rows of an int64 [len(index), width] array, right-padded with pad_id."""
        positions = self.starts[index][:, None] + np.arange(width)
        if not self.tokens.size:
            return np.full(positions.shape, pad_id, dtype=np.int64)
        # Positions past an example's end may run off the array ("clip"); they are padding anyway.
        out = np.take(self.tokens, positions, mode="clip").astype(np.int64)
        out[np.arange(width) >= self.lengths[index][:, None]] = pad_id
        return out


def _list_parts(column) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids narrowed to the smallest unsigned type, lengths) of each chunk of an Arrow list<int> column."""
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if chunk.null_count:
            raise ValueError("a token-id column holds nulls; the prepared data is damaged: run `nmt prepare` again")
        values = chunk.flatten().to_numpy(zero_copy_only=False)
        if values.size and int(values.min()) < 0:
            raise ValueError("a token-id column holds negative ids; the prepared data is damaged")
        top = int(values.max()) if values.size else 0
        yield values.astype(np.min_scalar_type(top), copy=False), np.diff(chunk.offsets.to_numpy()).astype(np.int64)


def _concatenate(parts: list[np.ndarray], empty_dtype) -> np.ndarray:
    """np.concatenate that lets go of each part once it is copied: the peak is the result plus one part."""
    out = np.empty(sum(p.size for p in parts), np.result_type(*parts) if parts else empty_dtype)
    position = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        out[position: position + part.size] = part
        position += part.size
    return out


def _side(ids: list[np.ndarray], lengths: list[np.ndarray], order: np.ndarray) -> Side:
    """A Side from per-block parts in arrival order (the lists are emptied), examples renumbered by `order`."""
    tokens = _concatenate(ids, np.uint8)
    arrival_lengths = _concatenate(lengths, np.int64)
    arrival_starts = np.concatenate(([0], np.cumsum(arrival_lengths)[:-1])).astype(np.int64)
    return Side(tokens, arrival_starts[order], arrival_lengths[order])


def split_rows(split_dir: str) -> np.ndarray:
    """The corpus row of every example of a prepared split, ascending: only the row column is read."""
    import pyarrow.dataset as ds

    return np.sort(ds.dataset(split_dir, format="parquet").to_table(columns=["row"]).column("row").to_numpy())


@dataclass(frozen=True)
class TokenShard:
    """Sentence pairs in corpus order as two flat Sides; examples are addressed by index."""

    src: Side
    tgt: Side
    rows: np.ndarray  # int64 corpus row of each example, ascending

    @classmethod
    def from_batches(cls, batches: Iterable[pa.Table | pa.RecordBatch]) -> TokenShard:
        """A shard from Arrow batches with columns row, src_ids, tgt_ids, in any order (each block is read once)."""
        rows, src_ids, src_len, tgt_ids, tgt_len = [], [], [], [], []
        for batch in batches:
            rows.append(np.asarray(batch.column("row"), dtype=np.int64))
            for column, ids, lengths in (("src_ids", src_ids, src_len), ("tgt_ids", tgt_ids, tgt_len)):
                for part_ids, part_lengths in _list_parts(batch.column(column)):
                    ids.append(part_ids)
                    lengths.append(part_lengths)
        # The blocks are read: Arrow's allocator keeps their freed buffers cached unless told to let go.
        pa.default_memory_pool().release_unused()
        row = np.concatenate(rows) if rows else np.empty(0, np.int64)
        # Sorting by row makes the shard independent of the order in which the blocks arrived.
        order = np.argsort(row, kind="stable")
        return cls(_side(src_ids, src_len, order), _side(tgt_ids, tgt_len, order), row[order])

    @classmethod
    def read(cls, split_dir: str, rank: int = 0, world_size: int = 1, seen: np.ndarray | None = None,
             rows: np.ndarray | None = None) -> TokenShard:
        """Rank `rank`'s share of a prepared split (a directory or URI of Parquet files): every world_size-th of
        its rows that `seen` (a bool array indexed by row; None: nothing) leaves. rows: split_rows(), if known."""
        import pyarrow.dataset as ds

        split = ds.dataset(split_dir, format="parquet")
        rows = split_rows(split_dir) if rows is None else rows
        mine = (rows if seen is None else rows[~seen[rows]])[rank::world_size]

        def wanted():
            # Small batches, one in flight: Arrow's default read-ahead (16 batches of 128k rows) holds
            # more than the shard itself.
            for batch in split.to_batches(columns=COLUMNS, batch_size=16_384, batch_readahead=0,
                                          fragment_readahead=1, use_threads=False):
                found = batch.column("row").to_numpy()
                keep = np.zeros(found.size, bool)
                if mine.size:  # mine is sorted: one binary search per row
                    keep = mine[np.minimum(np.searchsorted(mine, found), mine.size - 1)] == found
                yield batch.filter(pa.array(keep))

        return cls.from_batches(wanted())

    @classmethod
    def from_lists(cls, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> TokenShard:
        """A shard of a few examples given as id lists (tests, small tools)."""
        if len(sources) != len(targets):
            raise ValueError(f"got {len(sources)} sources but {len(targets)} targets")
        as_lists = pa.list_(pa.int32())
        table = pa.table({"row": pa.array(range(len(sources)), pa.int64()),
                          "src_ids": pa.array([list(map(int, s)) for s in sources], as_lists),
                          "tgt_ids": pa.array([list(map(int, t)) for t in targets], as_lists)})
        return cls.from_batches([table])

    def __len__(self) -> int:
        return int(self.rows.size)

    def collate(self, index, pad_id: int = PAD_ID, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
                shapes: ShapePolicy | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded (src [B, S], tgt_in [B, T + 1], tgt_out [B, T + 1]) LongTensors for the examples in index.

        `tgt_in` is [bos] + target and `tgt_out` is target + [eos], so a batch costs
        B * (S + T + 1) padded tokens, as batching.batch_cost counts it. With an active `shapes`
        the widths and rows are the policy's (an empty index: one step's worth of padding rows).
        """
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        shaped = shapes is not None and shapes.active
        if index.size == 0 and not shaped:
            raise ValueError("collate needs at least one example")
        tgt_lengths = self.tgt.lengths[index]
        if shaped:
            rows, src_width, tgt_width = shapes.shape(self.src.lengths[index], tgt_lengths)
        else:
            rows, src_width, tgt_width = index.size, int(self.src.lengths[index].max()), int(tgt_lengths.max()) + 1
        src = self.src.padded(index, src_width, pad_id)
        tgt = self.tgt.padded(index, tgt_width, pad_id)  # one column more than the longest target, for eos
        tgt_out = tgt.copy()
        tgt_out[np.arange(index.size), tgt_lengths] = eos_id
        tgt_in = np.roll(tgt, 1, axis=1)  # the last column is padding in every row: it wraps to the front
        tgt_in[:, 0] = bos_id
        if rows > index.size:  # padding rows: a one-token source (no empty attention row), no targets
            extra = rows - index.size
            src = np.vstack([src, _padding_rows(extra, src_width, eos_id, pad_id)])
            tgt_in = np.vstack([tgt_in, _padding_rows(extra, tgt_width, bos_id, pad_id)])
            tgt_out = np.vstack([tgt_out, np.full((extra, tgt_width), pad_id, np.int64)])
        return torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)


def _padding_rows(count: int, width: int, first: int, pad_id: int) -> np.ndarray:
    """`count` rows of `width` ids: `first`, then padding."""
    rows = np.full((count, width), pad_id, np.int64)
    rows[:, 0] = first
    return rows
