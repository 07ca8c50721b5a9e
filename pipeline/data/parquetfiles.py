"""Parquet corpus files checked from their footers and read by runs of rows, from the row groups that hold them.

The driver reads only footers: the row count, the schema (columns, nesting, types) and each
column chunk's null count; a row group is read there only when its footer reports missing
values (or has no statistics), to name the first one's row. Runs of rows are read in tasks. A
split may be several files (a glob such as `de-en/train-*`, as the Hugging Face hub shards its
Parquet copies); their rows follow one another in name order. Files are local paths or URIs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..common import storage
from ..common.errors import CorpusError
from ..config import DataConfig
from .corpus import field_keys, pick_columns


def _top_columns(cfg: DataConfig) -> list[str]:
    """The top-level columns that hold the source and target fields (a struct's name for "a.b")."""
    return sorted({key.split(".")[0] for key in field_keys(cfg)})


def _group_starts(metadata) -> np.ndarray:
    """The first row of each row group, and the row count at the end."""
    return np.cumsum([0] + [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)])


def check_parquet(path: str, cfg: DataConfig) -> int:
    """The file's row count, after checking its src/tgt columns exist, hold strings and miss no value."""
    if not storage.is_file(path):
        raise CorpusError(f"{path}: file not found")
    with storage.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        pick_columns(parquet.schema_arrow.empty_table(), cfg, path)  # names, nesting and types
        metadata, keys = parquet.metadata, set(field_keys(cfg))
        starts = _group_starts(metadata)
        for group in range(metadata.num_row_groups):
            chunks = [metadata.row_group(group).column(i) for i in range(metadata.num_columns)]
            counted = [c.statistics for c in chunks if c.path_in_schema in keys]
            if len(counted) < len(keys) or any(s is None or not s.has_null_count or s.null_count for s in counted):
                pick_columns(parquet.read_row_group(group, columns=_top_columns(cfg)), cfg, path, int(starts[group]))
        return metadata.num_rows


@dataclass
class ParquetReader:
    """Runs of rows of a split's Parquet files as (src, tgt) tables; picklable, so tasks can call it."""

    paths: dict[str, list[str]]  # split -> its files in order
    rows: dict[str, list[int]]  # split -> each file's row count
    cfg: DataConfig

    def __call__(self, split: str, first: int, count: int) -> pa.Table:
        starts = np.cumsum([0, *self.rows[split]])
        parts = []
        for i, path in enumerate(self.paths[split]):  # the files that overlap [first, first + count)
            lo, hi = max(first, int(starts[i])), min(first + count, int(starts[i + 1]))
            if lo < hi or (not parts and i == len(self.paths[split]) - 1):
                parts.append(self._read(path, lo - int(starts[i]), max(0, hi - lo)))
        return pa.concat_tables(parts)

    def _read(self, path: str, first: int, count: int) -> pa.Table:
        """Rows first..first+count-1 of one file, from the row groups that hold them."""
        with storage.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            starts = _group_starts(parquet.metadata)
            columns = _top_columns(self.cfg)
            lo = max(0, int(np.searchsorted(starts, first, side="right")) - 1)
            hi = max(lo + 1, int(np.searchsorted(starts, first + count, side="left")))
            groups = [g for g in range(lo, hi) if g < parquet.metadata.num_row_groups]
            table = parquet.read_row_groups(groups, columns=columns) if groups else \
                parquet.schema_arrow.empty_table().select(columns)
        rows = table.slice(first - int(starts[lo]), count)
        return pick_columns(rows, self.cfg, path, first)
