"""The corpus kinds by name: a config names one, and check_source, source_fingerprint and open_source ask it.

A kind is a class with check, fingerprint and open (see CorpusKind), registered with @kind("name") in
a module of this package; every module here is imported at the first lookup, so a new kind is a new
module plus its name among data.source's or data.format's choices in config.py. data.source names
the kind (demo, hf), except for files at data.path, whose data.format does (text, tsv, jsonl, parquet).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import pkgutil
import typing
from typing import Protocol

import pyarrow as pa

from ...common.errors import CorpusError
from ...config import DataConfig
from ..corpus import SPLITS
from ..sources import RangeSource, TableSource


class CorpusKind(Protocol):
    """What `nmt prepare` asks of a kind of corpus."""

    def check(self, cfg: DataConfig) -> None:
        """Raise CorpusError, naming what to fix, if the config cannot name a corpus of this kind."""

    def fingerprint(self, cfg: DataConfig, digest) -> None:
        """Feed the digest what decides the corpus's pairs (file contents, a generator's code and seed)."""

    def open(self, cfg: DataConfig, on_ray: bool = False) -> TableSource | RangeSource:
        """The corpus's splits; on_ray: scans and reads may run as Ray tasks."""


KINDS: dict[str, type[CorpusKind]] = {}


def kind(*names: str):
    """Class decorator: register a corpus kind under the names a config selects it by."""

    def register(cls: type[CorpusKind]) -> type[CorpusKind]:
        for name in names:
            if KINDS.get(name, cls) is not cls:
                raise ValueError(f"corpus kind {name!r} is registered twice: {KINDS[name]} and {cls}")
            KINDS[name] = cls
        return cls

    return register


@functools.cache
def _import_kinds() -> None:
    """Import each module of this package once (each registers its own kinds): the package is listed once."""
    for module in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
        importlib.import_module(f"{__package__}.{module.name}")


def registered() -> dict[str, type[CorpusKind]]:
    """Every kind by name."""
    _import_kinds()
    return KINDS


def configured_names() -> set[str]:
    """The kind names a config can give: data.source's choices, and for files data.format's."""
    hints = typing.get_type_hints(DataConfig)
    sources = set(typing.get_args(hints["source"])) - {"files"}
    return sources | set(typing.get_args(hints["format"]))


def name_of(cfg: DataConfig) -> str:
    """The kind a data config names: data.source, or data.format for files at data.path."""
    return cfg.format if cfg.source == "files" else cfg.source


def kind_of(cfg: DataConfig) -> CorpusKind:
    """The kind of corpus a data config names."""
    kinds = registered()
    name = name_of(cfg)
    if name not in kinds:
        raise CorpusError(f"no kind of corpus is registered as {name!r} (data.source={cfg.source}, "
                          f"data.format={cfg.format}); the registered kinds are {sorted(kinds)}")
    return kinds[name]()


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
