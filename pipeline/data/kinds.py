"""The kinds of corpus `nmt prepare` reads, one class each: what it checks, what its fingerprint hashes, how it opens.

demo (the built-in generator), hf (a hub dataset, or one saved with save_to_disk at data.path), and
files at data.path: text pairs, TSV or JSONL (line files, read through a line index) and Parquet
(read by row group). check_source, source_fingerprint and open_source pick the kind of a config.
"""

from __future__ import annotations

import abc
import hashlib
import json
from pathlib import Path

import pyarrow as pa

from ..common import storage
from ..common.errors import CorpusError
from ..config import DataConfig
from .corpus import SPLITS, field_keys, hash_files, pick_columns, split_files
from .parquetfiles import ParquetReader, check_parquet
from .sources import LineReader, RangeSource, TableSource, ray_tasks
from .textfiles import LineFormat, LineIndex, index_file, run_here


class DemoCorpus:
    """The built-in generator's pairs (data.demo_sizes, data.seed), made as Arrow tables in this process."""

    def check(self, cfg: DataConfig) -> None:
        """Nothing to check: the generator always has its pairs."""

    def fingerprint(self, cfg: DataConfig, digest) -> None:
        """The generator's grammar and word lists (both decide the pairs it makes), its sizes and seed."""
        from . import demo_corpus, demo_lexicon

        for module in (demo_corpus, demo_lexicon):
            digest.update(Path(module.__file__).read_bytes())
        digest.update(json.dumps([cfg.demo_sizes, cfg.seed], sort_keys=True).encode())

    def open(self, cfg: DataConfig, on_ray: bool = False) -> TableSource:
        """Every configured split as a table."""
        from .demo_corpus import demo_corpus

        sizes = {split: cfg.demo_sizes.get(split, 0) for split in SPLITS}
        pairs = demo_corpus(sizes["train"], sizes["validation"], max(sizes["test"], 1), seed=cfg.seed)
        return TableSource({split: pa.table({"src": pa.array([s for s, _ in pairs[split]], pa.string()),
                                             "tgt": pa.array([t for _, t in pairs[split]], pa.string())})
                            for split in cfg.splits})


class HubDataset:
    """A Hugging Face dataset: from the hub (data.hf_name, data.hf_config) or saved at data.path."""

    def check(self, cfg: DataConfig) -> None:
        """A hub name or a saved dataset's directory."""
        if not (cfg.hf_name or cfg.path):
            raise CorpusError("data.source=hf needs data.hf_name (a hub dataset) or data.path (a saved one)")

    def fingerprint(self, cfg: DataConfig, digest) -> None:
        """A saved dataset's files; a hub dataset's name, config and splits (the hub is not asked)."""
        if cfg.path:
            hash_files(cfg.path, [str(p) for p in sorted(Path(cfg.path).rglob("*")) if p.is_file()], digest)
        else:
            digest.update(json.dumps([cfg.hf_name, cfg.hf_config, cfg.splits]).encode())

    def open(self, cfg: DataConfig, on_ray: bool = False) -> TableSource:
        """Every configured split as the memory-mapped Arrow table under the dataset."""
        return TableSource({split: self._read(cfg, name) for split, name in cfg.splits.items()})

    @staticmethod
    def _read(cfg: DataConfig, split_name: str) -> pa.Table:
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


class CorpusFiles(abc.ABC):
    """Files under data.path, local or a storage URI: split_files() names them.

    Local files' tasks are pinned to this node (ray_tasks(here=True)): another node of the cluster
    need not have them. Storage URIs are read by tasks wherever they run.
    """

    def check(self, cfg: DataConfig) -> None:
        """data.path is a directory."""
        if not storage.is_dir(cfg.path):
            raise CorpusError(f"data.path {cfg.path!r} is not a directory; point it at the corpus files (a local "
                              f"directory, or a storage URI such as s3://bucket/corpus)")

    def fingerprint(self, cfg: DataConfig, digest) -> None:
        """The split files: contents when local, names, sizes and times behind a URI."""
        hash_files(cfg.path, [path for files in split_files(cfg).values() for path in files], digest)

    def open(self, cfg: DataConfig, on_ray: bool = False) -> RangeSource:
        """The files as runs of rows; on_ray: scans and reads run as Ray tasks."""
        run, remote_args = ray_tasks(here=not storage.is_uri(cfg.path)) if on_ray else (run_here, {})
        return self.opened(cfg, run, remote_args)

    @abc.abstractmethod
    def opened(self, cfg: DataConfig, run=run_here, remote_args: dict | None = None, **settings) -> RangeSource:
        """The files checked and counted by `run`, read by Ray Data tasks with remote_args: each file kind's own."""


class LineFiles(CorpusFiles):
    """Text pairs (<stem>.<lang>, one sentence per line), TSV or JSONL (<stem>.<format>), one record per line."""

    def opened(self, cfg: DataConfig, run=run_here, remote_args: dict | None = None, **scan_settings) -> RangeSource:
        """The files indexed by `run` (scan_settings: index_file's); the two sides of a text pair line up."""
        if cfg.format == "text":
            fmt = LineFormat("text", on_bad_utf8=cfg.on_bad_utf8)
        else:
            fmt = LineFormat(cfg.format, *field_keys(cfg), cfg.on_bad_utf8)
        files = split_files(cfg)
        indexes = {}
        for split, paths in files.items():
            indexes[split] = [index_file(path, fmt, run, **scan_settings) for path in paths]
            if len(paths) == 2 and indexes[split][0].lines != indexes[split][1].lines:
                raise _mismatch(*indexes[split])
        return RangeSource(LineReader(indexes, fmt), {split: found[0].lines for split, found in indexes.items()},
                           run, remote_args, files)


class ParquetFiles(CorpusFiles):
    """A split's Parquet files (<stem>.parquet, or a glob's matches), checked from their footers."""

    def opened(self, cfg: DataConfig, run=run_here, remote_args: dict | None = None, **settings) -> RangeSource:
        """The files' rows, counted from their footers."""
        paths = split_files(cfg)
        rows = {split: [check_parquet(path, cfg) for path in files] for split, files in paths.items()}
        return RangeSource(ParquetReader(paths, rows, cfg), {split: sum(n) for split, n in rows.items()},
                           run, remote_args, paths)


def _mismatch(src: LineIndex, tgt: LineIndex) -> CorpusError:
    return CorpusError(f"parallel files differ in length: {src.path} has {src.lines} lines, {tgt.path} has "
                       f"{tgt.lines}; they must pair line by line (nothing was truncated)")


def kind_of(cfg: DataConfig) -> DemoCorpus | HubDataset | CorpusFiles:
    """The kind of corpus a data config names."""
    if cfg.source == "demo":
        return DemoCorpus()
    if cfg.source == "hf":
        return HubDataset()
    return ParquetFiles() if cfg.format == "parquet" else LineFiles()


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
    kind_of(cfg).check(cfg)


def source_fingerprint(cfg: DataConfig) -> str:
    """A hash of the raw data, as its kind decides (files: their contents, or names, sizes and times behind a URI)."""
    digest = hashlib.sha256()
    kind_of(cfg).fingerprint(cfg, digest)
    return digest.hexdigest()


def open_source(cfg: DataConfig, on_ray: bool = False) -> TableSource | RangeSource:
    """The corpus as a TableSource or RangeSource; on_ray: files are scanned and read by Ray tasks.

    The config has passed check_source.
    """
    return kind_of(cfg).open(cfg, on_ray)


def read_corpus(cfg: DataConfig) -> dict[str, pa.Table]:
    """Every configured split as a (src, tgt) table, read in this process (small corpora, tests, benchmarks)."""
    check_source(cfg)
    source = open_source(cfg)
    return {split: source.pairs(split, 0, n) for split, n in source.counts.items()}
