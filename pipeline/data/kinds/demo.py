"""The built-in demo corpus as a kind: data.source=demo (data.demo_sizes, data.seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from ...config import DataConfig
from ..corpus import SPLITS
from ..sources import TableSource
from .registry import kind


@kind("demo")
class DemoCorpus:
    """The built-in generator's pairs (data.demo_sizes, data.seed), made as Arrow tables in this process."""

    def check(self, cfg: DataConfig) -> None:
        """Nothing to check: the generator always has its pairs."""

    def fingerprint(self, cfg: DataConfig, digest) -> None:
        """The generator's grammar and word lists (both decide the pairs it makes), its sizes and seed."""
        from .. import demo_corpus, demo_lexicon

        for module in (demo_corpus, demo_lexicon):
            digest.update(Path(module.__file__).read_bytes())
        digest.update(json.dumps([cfg.demo_sizes, cfg.seed], sort_keys=True).encode())

    def open(self, cfg: DataConfig, on_ray: bool = False) -> TableSource:
        """Every configured split as a table."""
        from ..demo_corpus import demo_corpus

        sizes = {split: cfg.demo_sizes.get(split, 0) for split in SPLITS}
        pairs = demo_corpus(sizes["train"], sizes["validation"], max(sizes["test"], 1), seed=cfg.seed)
        return TableSource({split: pa.table({"src": pa.array([s for s, _ in pairs[split]], pa.string()),
                                             "tgt": pa.array([t for _, t in pairs[split]], pa.string())})
                            for split in cfg.splits})
