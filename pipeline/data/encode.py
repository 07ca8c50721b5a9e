"""Cleaning and encoding of sentence pairs: what each Ray Data task of `nmt prepare` runs on its block.

Every pair is normalised, encoded with SentencePiece and marked with the rule that drops it
("" = kept); a task writes its kept pairs as Parquet and returns only their length counts.
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa

from ..common import storage
from ..config import DataConfig
from ..text.tokenizer import Tokenizer

DROP_RULES = ("empty", "too_long", "ratio", "duplicate")
STATS_KEYS = ["split", "drop", "src_len", "tgt_len"]  # the manifest's statistics count pairs by these
# Pairs per EncodeBatch call within a block: Python's lists of a few thousand strings stay in
# the CPU caches (benchmarks/prepare.py measures the alternatives).
ENCODE_PAIRS = 4096
WORD_CACHE = 200_000  # words whose ids an encoder keeps (a few tens of MB); rarer ones are encoded each time


def normalize(text: str) -> str:
    """Unicode NFC, whitespace runs collapsed to one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())  # str.split: the same whitespace as \s


def clean_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Normalise both sides and mark empty pairs (drop = "empty"); nothing is removed yet."""
    src = [normalize(s) for s in batch["src"]]
    tgt = [normalize(t) for t in batch["tgt"]]
    empty = np.array([not s or not t for s, t in zip(src, tgt)], dtype=bool)
    return {"src": np.array(src, dtype=object), "tgt": np.array(tgt, dtype=object),
            "drop": np.where(empty, "empty", "").astype(object)}


class EncodeBatch:
    """Cleans and encodes a batch of pairs and marks what to drop; SentencePiece loads once per instance.

    Length and ratio filters apply to filter_split only (training data); validation and test
    sets are kept whole, so scores stay comparable with published ones.
    """

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None, max_len: int, max_ratio: float,
                 filter_split: str):
        # One thread: Ray runs one encoder per CPU already, and SentencePiece's default (every
        # core for each list) would oversubscribe the machine.
        self.tokenizer = Tokenizer(src_proto, tgt_proto, num_threads=1, word_cache=WORD_CACHE)
        self.max_len, self.max_ratio, self.filter_split = max_len, max_ratio, filter_split

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        """Every pair of the batch, cleaned and encoded, with its drop rule ("" = kept) and lengths."""
        batch = {**batch, **clean_batch(batch)}
        src_ids = self.tokenizer.encode_src_array(batch["src"].tolist())
        tgt_ids = self.tokenizer.encode_tgt_array(batch["tgt"].tolist())
        src_len = np.diff(src_ids.offsets.to_numpy()).astype(np.int32)
        tgt_len = np.diff(tgt_ids.offsets.to_numpy()).astype(np.int32)
        drop = batch["drop"]
        candidates = (drop == "") & (batch["split"] == self.filter_split)
        too_long = candidates & ((src_len > self.max_len) | (tgt_len > self.max_len))
        drop[too_long] = "too_long"
        ratio = np.maximum(src_len, tgt_len) / np.maximum(np.minimum(src_len, tgt_len), 1)
        drop[candidates & ~too_long & (ratio > self.max_ratio)] = "ratio"
        # A Table, not a dict: Ray Data converts a dict's list<int32> columns element by element,
        # which costs more than the encoding itself.
        return pa.table({
            "split": batch["split"], "row": batch["row"], "src": batch["src"], "tgt": batch["tgt"], "drop": drop,
            "src_ids": src_ids, "tgt_ids": tgt_ids, "src_len": src_len, "tgt_len": tgt_len,
        })


_encoder: tuple[dict, EncodeBatch] | None = None  # this process's encoder and the settings it was made with


def numpy_batches(table: pa.Table, size: int):
    """Slices of `size` rows as dicts of NumPy arrays, the form EncodeBatch takes."""
    for start in range(0, max(table.num_rows, 1), size):  # an empty table makes one empty batch
        chunk = table.slice(start, size)
        yield {name: chunk.column(name).to_numpy(zero_copy_only=False) for name in chunk.column_names}


def encode_table(table: pa.Table, encoder: EncodeBatch) -> pa.Table:
    """Every pair of the table cleaned, encoded and marked, ENCODE_PAIRS at a time."""
    return pa.concat_tables(encoder(batch) for batch in numpy_batches(table, ENCODE_PAIRS))


def length_counts(encoded: pa.Table) -> pa.Table:
    """Pairs per (split, drop rule, source length, target length): what the manifest needs, in few rows."""
    return encoded.group_by(STATS_KEYS, use_threads=False).aggregate([([], "count_all")])


def encode_block(block: pa.Table, settings: dict, out: str | None) -> pa.Table:
    """Ray Data task: encode a block with this worker process's EncodeBatch, made once per tokenizer.

    A task rather than an actor pool: Ray Data starts an actor pool afresh for every execution,
    which costs several seconds per actor, while task workers are pooled and keep this encoder.
    Given `out`, the task writes the kept pairs itself and returns only their length_counts.
    """
    global _encoder
    if _encoder is None or _encoder[0] != settings:
        _encoder = (settings, EncodeBatch(**settings))  # one at a time: a new tokenizer replaces the old
    encoded = encode_table(block, _encoder[1])
    if out is None:
        return encoded
    write_shards(encoded, out)
    return length_counts(encoded)


def write_shards(encoded: pa.Table, out: str) -> None:
    """Write the kept pairs of an encoded batch as one Parquet file per split, in <out>/<split>/.

    A file is named after its first kept row, so the layout does not depend on scheduling, and a
    batch that Ray Data retries after a worker failure overwrites its own file.
    """
    import pyarrow.compute as pc

    kept = encoded.filter(pc.equal(encoded["drop"], ""))
    for split in pc.unique(kept["split"]).to_pylist():
        rows = kept.filter(pc.equal(kept["split"], split)).drop_columns(["split", "drop"])
        storage.write_table(storage.join(out, split, f"part-{rows['row'][0].as_py():010d}.parquet"), rows)


def encode_settings(tokenizer: Tokenizer, cfg: DataConfig) -> dict:
    """EncodeBatch's arguments for this tokenizer and config (what encode_block's tasks get)."""
    return dict(src_proto=tokenizer.src_proto, tgt_proto=tokenizer.tgt_proto, max_len=cfg.max_len,
                max_ratio=cfg.max_len_ratio, filter_split="train")
