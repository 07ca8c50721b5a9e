"""Corpus sources checked strictly: the table sources (demo, Hugging Face) and what all sources share.

Files are read in Ray tasks: text, TSV and JSONL by textfiles, Parquet by parquetfiles. Every
problem is a CorpusError that names the file and line (or row).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ..common import storage
from ..common.errors import CorpusError
from ..config import DataConfig

SPLITS = ("train", "validation", "test")


def _table(src: list[str], tgt: list[str]) -> pa.Table:
    return pa.table({"src": pa.array(src, pa.string()), "tgt": pa.array(tgt, pa.string())})


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


def _read_hf(cfg: DataConfig, split_name: str) -> pa.Table:
    """A split of a hub dataset (hf_name, hf_config) or of a saved dataset directory (path), read as Arrow."""
    import datasets

    if cfg.path:
        saved = datasets.load_from_disk(cfg.path)
        if split_name not in saved:
            raise CorpusError(f"{cfg.path}: no split {split_name!r}; it has {list(saved)}")
        dataset = saved[split_name]
    else:
        dataset = datasets.load_dataset(cfg.hf_name, cfg.hf_config or None, split=split_name)
    if getattr(dataset, "_indices", None) is not None:  # a selection or shuffle: make its rows real
        dataset = dataset.flatten_indices()
    # The memory-mapped Arrow table under the dataset: no Python object per record (WMT14 has 4.5M).
    return pick_columns(dataset.data.table, cfg, f"{cfg.path or cfg.hf_name}[{split_name}]")


def check_source(cfg: DataConfig) -> None:
    """Fail early, before Ray starts, on a config that names no usable source."""
    unknown = sorted(set(cfg.splits) - set(SPLITS))
    if unknown:
        raise CorpusError(f"data.splits: unknown split(s) {unknown}; use {list(SPLITS)}")
    if "train" not in cfg.splits or "validation" not in cfg.splits:
        raise CorpusError("data.splits must name at least a train and a validation split")
    if cfg.src_lang == cfg.tgt_lang or not cfg.src_lang or not cfg.tgt_lang:
        raise CorpusError(f"data.src_lang and data.tgt_lang must be two languages, got "
                          f"{cfg.src_lang!r} and {cfg.tgt_lang!r}")
    if cfg.source == "files" and not storage.is_dir(cfg.path):
        raise CorpusError(f"data.path {cfg.path!r} is not a directory; point it at the corpus files (a local "
                          f"directory, or a storage URI such as s3://bucket/corpus)")
    if cfg.source == "hf" and not (cfg.hf_name or cfg.path):
        raise CorpusError("data.source=hf needs data.hf_name (a hub dataset) or data.path (a saved one)")


def read_tables(cfg: DataConfig) -> dict[str, pa.Table]:
    """Every configured split of a table source (demo, hf) that check_source has accepted."""
    if cfg.source == "demo":
        from .demo_corpus import demo_corpus

        sizes = {split: cfg.demo_sizes.get(split, 0) for split in SPLITS}
        pairs = demo_corpus(sizes["train"], sizes["validation"], max(sizes["test"], 1), seed=cfg.seed)
        return {split: _table([s for s, _ in pairs[split]], [t for _, t in pairs[split]])
                for split in cfg.splits}
    return {split: _read_hf(cfg, name) for split, name in cfg.splits.items()}


def source_fingerprint(cfg: DataConfig) -> str:
    """A hash of the raw data: file contents for local files, the generator's inputs for the demo.

    Files behind a storage URI are not downloaded to the driver to be hashed (WMT14 is gigabytes):
    their names, sizes and modification times stand for their contents.
    """
    digest = hashlib.sha256()
    if cfg.source == "demo":
        from . import demo_corpus, demo_lexicon

        # The generator's grammar and its word lists both decide the pairs it makes.
        for module in (demo_corpus, demo_lexicon):
            digest.update(Path(module.__file__).read_bytes())
        digest.update(json.dumps([cfg.demo_sizes, cfg.seed], sort_keys=True).encode())
    elif cfg.source == "hf" and not cfg.path:
        digest.update(json.dumps([cfg.hf_name, cfg.hf_config, cfg.splits]).encode())
    else:
        root = cfg.path
        paths = [str(p) for p in sorted(Path(root).rglob("*")) if p.is_file()] if cfg.source == "hf" else \
            _source_files(cfg)
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
    return digest.hexdigest()


def split_files(root: str, stem: str) -> list[str]:
    """The Parquet files of a split: <root>/<stem>.parquet, or every match when the stem is a glob."""
    if not any(c in stem for c in "*?["):
        return [storage.join(root, f"{stem}.parquet")]
    pattern = stem if stem.endswith(".parquet") else f"{stem}.parquet"
    files = storage.glob(root, pattern)
    if not files:
        raise CorpusError(f"{storage.join(root, pattern)}: no file matches; check data.path and data.splits")
    return files


def _source_files(cfg: DataConfig) -> list[str]:
    root = cfg.path
    if cfg.format == "text":
        return [storage.join(root, f"{stem}.{lang}") for stem in cfg.splits.values()
                for lang in (cfg.src_lang, cfg.tgt_lang)]
    if cfg.format == "parquet":
        return [path for stem in cfg.splits.values() for path in split_files(root, stem)]
    return [storage.join(root, f"{stem}.{cfg.format}") for stem in cfg.splits.values()]
