"""What every kind of corpus shares: split names, field names, column picking, split files, file hashing.

The kinds themselves (demo, hf, line files, Parquet) are in kinds/, one module each. Every problem is a
CorpusError that names the file and line (or row).
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ..common import storage
from ..common.errors import CorpusError
from ..config import DataConfig

SPLITS = ("train", "validation", "test")


def field_keys(cfg: DataConfig) -> tuple[str, str]:
    """The source and target field (column, JSON key; dots nest): src_field / tgt_field, else the language codes."""
    return cfg.src_field or cfg.src_lang, cfg.tgt_field or cfg.tgt_lang


def pick_columns(table: pa.Table, cfg: DataConfig, where: str, first_row: int = 0) -> pa.Table:
    """The src and tgt string columns named by src_field / tgt_field (dots reach into structs), in Arrow.

    first_row: the table's first row in its file, so that a missing value is reported by its row there.
    """
    columns = []
    for key in field_keys(cfg):
        top, *rest = key.split(".")
        if top not in table.column_names:
            raise CorpusError(f"{where}: no column {top!r}; columns are {table.column_names}; "
                              "set data.src_field / data.tgt_field")
        column = table.column(top)
        for part in rest:  # struct fields, e.g. translation.en
            fields = [f.name for f in column.type] if pa.types.is_struct(column.type) else []
            if part not in fields:
                raise CorpusError(f"{where}: column {key!r} does not exist ({part!r} is not among {fields}); "
                                  "set data.src_field / data.tgt_field")
            column = pc.struct_field(column, part)
        if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
            raise CorpusError(f"{where}: column {key!r} must hold strings, has {column.type}")
        if column.null_count:
            first = pc.index(pc.is_null(column), True).as_py()
            raise CorpusError(f"{where}: column {key!r} has {column.null_count} missing values (the first "
                              f"in row {first_row + first})")
        columns.append(column.cast(pa.string()))
    return pa.table({"src": columns[0], "tgt": columns[1]})


def split_files(cfg: DataConfig) -> dict[str, list[str]]:
    """Each split's files under data.path: <stem>.<lang> per side (text), <stem>.<format> (tsv, jsonl, parquet),
    or every <stem>.parquet a glob stem matches, in name order (de-en/train-*)."""
    return {split: _files_of(cfg, stem) for split, stem in cfg.splits.items()}


def _files_of(cfg: DataConfig, stem: str) -> list[str]:
    root = cfg.path
    if cfg.format == "text":
        return [storage.join(root, f"{stem}.{lang}") for lang in (cfg.src_lang, cfg.tgt_lang)]
    if cfg.format != "parquet" or not any(c in stem for c in "*?["):
        return [storage.join(root, f"{stem}.{cfg.format}")]
    pattern = stem if stem.endswith(".parquet") else f"{stem}.parquet"
    files = storage.glob(root, pattern)
    if not files:
        raise CorpusError(f"{storage.join(root, pattern)}: no file matches; check data.path and data.splits")
    return files


def hash_files(root: str, paths: list[str], digest) -> None:
    """Add files under root to a hash: each one's name relative to root, then its contents.

    Files behind a storage URI are not downloaded to the driver to be hashed (WMT14 is gigabytes):
    their names, sizes and modification times stand for their contents.
    """
    for path in paths:
        info = storage.file_info(path)
        if info.type != pafs.FileType.File:
            raise CorpusError(f"{path}: file not found; check data.path, data.splits and the languages")
        relative = path[len(root):].lstrip("/") if storage.is_uri(path) else os.path.relpath(path, root)
        digest.update(relative.encode())
        if storage.is_uri(path):
            digest.update(json.dumps([info.size, info.mtime_ns]).encode())
            continue
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
