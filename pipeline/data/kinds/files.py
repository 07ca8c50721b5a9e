"""Corpus files at data.path as kinds: text pairs, TSV or JSONL (data.format=text, tsv, jsonl: line files, read
through a line index) and Parquet (data.format=parquet, read by row group).
"""

from __future__ import annotations

import abc

from ...common import storage
from ...common.errors import CorpusError
from ...config import DataConfig
from ..corpus import field_keys, hash_files, split_files
from ..parquetfiles import ParquetReader, check_parquet
from ..sources import LineReader, RangeSource, ray_tasks
from ..textfiles import LineFormat, LineIndex, index_file, run_here
from .registry import kind


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


@kind("text", "tsv", "jsonl")
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


@kind("parquet")
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
