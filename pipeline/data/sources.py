"""How `nmt prepare` reads any corpus (opened by its kind, kinds/): pairs per split, a tokenizer sample, a Ray Dataset
of labeled blocks.

Files are read by Ray tasks, as runs of rows: line files (text, TSV, JSONL) through a sparse
line index that their scan tasks build, Parquet files by row group (the driver reads only
footers). Local files are read on the node that has them; storage URIs (s3://, gs://, hf://)
by tasks on any node. The demo generator and Hugging Face datasets arrive as Arrow
tables (a dataset's is memory-mapped).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .textfiles import LineFormat, LineIndex, read_pairs, run_here

# Pairs per Ray Data block (one task; a Parquet file per split in it): large, so that each
# task's fixed cost (scheduling, files) stays small; benchmarks/prepare.py measures it.
BLOCK_PAIRS = 100_000
Piece = tuple[str, int, int]  # (split, first row, rows): a run of consecutive pairs of one split


def plan_blocks(counts: dict[str, int], num_shards: int | None, num_cpus: int) -> list[list[Piece]]:
    """The Ray Data blocks (one task each) as runs of rows, every pair in exactly one, in corpus order."""
    if num_shards:  # files per split, as asked: each split is cut on its own
        return [[(split, start, size)] for split, n in counts.items() for start, size in _cuts(n, num_shards)]
    # All splits end to end in equal blocks, so the tasks take equally long and the small
    # validation and test splits share a task with training pairs instead of costing one each.
    total = sum(counts.values())
    waves = -(-total // (BLOCK_PAIRS * num_cpus))  # at most BLOCK_PAIRS per block
    blocks = []
    for start, size in _cuts(total, max(1, min(waves * num_cpus, total // 10_000))):  # not tiny
        pieces, offset = [], 0
        for split, n in counts.items():  # the part of [start, start + size) that falls in each split
            first, last = max(start, offset), min(start + size, offset + n)
            if first < last:
                pieces.append((split, first - offset, last - first))
            offset += n
        blocks.append(pieces)
    return blocks


def _cuts(n: int, count: int) -> list[tuple[int, int]]:
    """(start, size) of `count` runs of (nearly) equal size covering range(n), fewer if n is smaller."""
    size = max(1, -(-n // count))
    return [(start, min(size, n - start)) for start in range(0, n, size)]


def labeled(table: pa.Table, split: str, first: int) -> pa.Table:
    """Pairs with "split" (its name) and "row" (the pair's line in the split) columns added."""
    # "row" lets readers sort, so the order of the data (and so training) does not depend on
    # how Ray Data scheduled the blocks.
    return (table.append_column("split", pa.array([split] * table.num_rows, pa.string()))
            .append_column("row", pa.array(np.arange(first, first + table.num_rows, dtype=np.int64))))


class TableSource:
    """Splits that are Arrow tables already: the demo generator, Hugging Face datasets."""

    def __init__(self, tables: dict[str, pa.Table]):
        self.tables = tables
        self.counts = {split: table.num_rows for split, table in tables.items()}

    def described(self, split: str) -> str:
        """What a split was read from, for a message."""
        return f"{self.counts[split]:,} pairs"

    def pairs(self, split: str, first: int, count: int) -> pa.Table:
        """Rows first..first+count-1 of a split as a (src, tgt) table."""
        return self.tables[split].slice(first, count)

    def sample(self, rows: list[int]) -> pa.Table:
        """The given rows (ascending) of the training split."""
        return self.tables["train"].take(rows)

    def blocks(self, plan: list[list[Piece]]) -> list[pa.Table]:
        """The planned blocks, labeled."""
        return [pa.concat_tables(labeled(self.pairs(*piece), *piece[:2]) for piece in block) for block in plan]

    def dataset(self, plan: list[list[Piece]]):
        """The planned blocks as a Ray Dataset."""
        import ray

        return ray.data.from_arrow(self.blocks(plan))


class RangeSource:
    """A source read as runs of rows by `reader(split, first, count)`: by `run` (the sample) and in Ray Data tasks."""

    def __init__(self, reader, counts: dict[str, int], run=run_here, remote_args: dict | None = None,
                 files: dict[str, list[str]] | None = None):
        self.reader, self.counts, self.run, self.remote_args = reader, counts, run, remote_args or {}
        self.files = files or {}  # each split's files, for messages

    def described(self, split: str) -> str:
        """What a split was read from, for a message: its files and their rows."""
        paths = self.files.get(split, [])
        each = " each" if len(paths) == 2 else " in all"
        return f"{', '.join(paths) or split} ({self.counts[split]:,} {'lines' if each == ' each' else 'rows'}{each})"

    def pairs(self, split: str, first: int, count: int) -> pa.Table:
        """Rows first..first+count-1 of a split as a (src, tgt) table, read in this process."""
        return self.reader(split, first, count)

    def sample(self, rows: list[int]) -> pa.Table:
        """The given rows (ascending) of the training split, read by `run` a block at a time."""
        calls = []
        for start, size in _cuts(self.counts["train"], max(1, -(-self.counts["train"] // BLOCK_PAIRS))):
            lo, hi = np.searchsorted(rows, [start, start + size])
            if hi > lo:
                calls.append((self.reader, start, size, [r - start for r in rows[lo:hi]]))
        return pa.concat_tables(self.run(_take_pairs, calls)) if calls else self.pairs("train", 0, 0)

    def dataset(self, plan: list[list[Piece]]):
        """The planned blocks as a Ray Dataset whose read tasks run where the files are."""
        import ray

        items = [{"pieces": json.dumps(block)} for block in plan]
        return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _read_blocks, batch_size=1, batch_format="numpy", fn_kwargs={"reader": self.reader}, **self.remote_args)


@dataclass
class LineReader:
    """Runs of pairs of indexed line files; picklable, so tasks can call it."""

    indexes: dict[str, list[LineIndex]]
    fmt: LineFormat

    def __call__(self, split: str, first: int, count: int) -> pa.Table:
        return read_pairs(self.indexes[split], self.fmt, first, count)


def _take_pairs(reader, first: int, count: int, rows: list[int]) -> pa.Table:
    """Task: some rows (relative to first) of a run of pairs, so only the sample travels back."""
    return reader("train", first, count).take(rows)


def _read_blocks(batch: dict[str, np.ndarray], reader) -> pa.Table:
    """Ray Data task: the labeled pairs of one planned block."""
    return pa.concat_tables(labeled(reader(split, first, count), split, first)
                            for pieces in batch["pieces"] for split, first, count in json.loads(pieces))


def ray_tasks(here: bool) -> tuple:
    """(run, Ray Data arguments) that run tasks on Ray: on this node (the one whose disk has the files), or anywhere."""
    import ray

    # Every node carries its id as this label; Ray Data pins its own local:// reads the same way.
    where = {"label_selector": {"ray.io/node-id": ray.get_runtime_context().get_node_id()}} if here else {}

    def run(fn, calls: list[tuple]) -> list:
        task = ray.remote(fn).options(**where)
        return ray.get([task.remote(*args) for args in calls])

    return run, where


def tokenizer_sample(source, size: int, seed: int) -> tuple[list[str], list[str]]:
    """A seeded random sample of cleaned, non-empty training pairs for SentencePiece."""
    from .encode import clean_batch

    n = source.counts["train"]
    rows = sorted(random.Random(seed).sample(range(n), size)) if n > size else list(range(n))
    table = source.sample(rows)
    sample = clean_batch({"src": np.array(table.column("src").to_pylist(), dtype=object),
                          "tgt": np.array(table.column("tgt").to_pylist(), dtype=object)})
    keep = sample["drop"] == ""
    return list(sample["src"][keep]), list(sample["tgt"][keep])
