"""Corpus preparation on Ray Data: read -> clean -> encode (SentencePiece) and write Parquet in Ray tasks -> manifest.

The output directory is content-addressed (a hash of the source data and the data config),
so re-running with identical inputs reuses it and any change prepares anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from . import storage
from .config import DataConfig
from .corpus import CorpusError, check_source, read_corpus, source_fingerprint
from .tokenizer import Tokenizer, train_tokenizer

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # bump when the layout of prepared data changes
DROP_RULES = ("empty", "too_long", "ratio", "duplicate")
STATS_COLUMNS = ["split", "drop", "src_len", "tgt_len"]  # what the manifest's statistics need of each pair
# Pairs per Ray Data block (one task, one Parquet file). Large, because each task waits
# ~0.2 s to be scheduled on a busy 2-core machine; 100k beat 25k and 50k at 930k pairs.
BLOCK_PAIRS = 100_000
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


def encode_block(batch: dict[str, np.ndarray], settings: dict, out: str | None) -> pa.Table:
    """Ray Data task: encode a block with this worker process's EncodeBatch, made once per tokenizer.

    A task rather than an actor pool: Ray Data starts an actor pool afresh for every execution,
    which costs several seconds per actor, while task workers are pooled and keep this encoder.
    Given `out`, the task writes the kept pairs itself and returns only the statistics columns.
    """
    global _encoder
    if _encoder is None or _encoder[0] != settings:
        _encoder = (settings, EncodeBatch(**settings))  # one at a time: a new tokenizer replaces the old
    encoded = _encoder[1](batch)
    if out is None:
        return encoded
    write_shards(encoded, out)
    return encoded.select(STATS_COLUMNS)


def write_shards(encoded: pa.Table, out: str) -> None:
    """Write the kept pairs of an encoded batch as one Parquet file per split, in <out>/<split>/.

    A file is named after its first row, so the layout does not depend on scheduling, and a
    batch that Ray Data retries after a worker failure overwrites its own file.
    """
    import pyarrow.compute as pc

    kept = encoded.filter(pc.equal(encoded["drop"], ""))
    for split in pc.unique(kept["split"]).to_pylist():
        rows = kept.filter(pc.equal(kept["split"], split)).drop_columns(["split", "drop"])
        storage.write_table(storage.join(out, split, f"part-{rows['row'][0].as_py():010d}.parquet"), rows)


@dataclass
class Manifest:
    """What a prepared dataset holds: counts, lengths, drops per rule, hashes, file layout."""

    path: str
    content: dict[str, Any]

    def split_dir(self, split: str) -> str:
        """Directory of a split's Parquet shards."""
        if split not in self.content["splits"]:
            raise CorpusError(f"{self.path}: no split {split!r}; it has {sorted(self.content['splits'])}")
        return storage.join(self.path, split)

    def tokenizer(self) -> Tokenizer:
        """The SentencePiece model(s) the data was encoded with."""
        files = [storage.read_bytes(storage.join(self.path, name)) for name in self.content["tokenizer"]["files"]]
        return Tokenizer(*files)

    @property
    def sha256(self) -> str:
        """The dataset's identity: the hash its directory is named after."""
        return self.content["fingerprint"]

    def summary(self) -> str:
        """A few human-readable lines: where the data is, counts and drops per split."""
        lines = [f"prepared data: {self.path}"]
        for split, info in self.content["splits"].items():
            dropped = ", ".join(f"{rule} {n}" for rule, n in info["dropped"].items() if n) or "none"
            lines.append(
                f"  {split:<10} {info['pairs']:>9,} pairs  src {info['src_tokens_mean']:.1f} / tgt "
                f"{info['tgt_tokens_mean']:.1f} tokens on average  dropped: {dropped}"
            )
        tok = self.content["tokenizer"]
        lines.append(f"  tokenizer  {tok['type']} {'joint' if tok['joint'] else 'separate'} "
                     f"vocab {tok['src_vocab_size']}/{tok['tgt_vocab_size']}  sha256 {tok['sha256'][:12]}")
        return "\n".join(lines)


def load_manifest(path: str) -> Manifest:
    """The manifest of a prepared dataset directory (its presence marks the data complete)."""
    manifest_path = storage.join(path, MANIFEST)
    if not storage.exists(manifest_path):
        raise CorpusError(f"{path}: not a prepared dataset (no {MANIFEST}); run `nmt prepare` first")
    return Manifest(path, json.loads(storage.read_bytes(manifest_path)))


def config_fingerprint(cfg: DataConfig) -> str:
    """Hash of every data setting that changes the prepared output (not where it is written)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("output_dir", "path")}
    return hashlib.sha256(json.dumps([FORMAT_VERSION, settings], sort_keys=True).encode()).hexdigest()


def prepared_path(cfg: DataConfig) -> tuple[str, str, str]:
    """(directory, source hash, config hash): the directory is named after both hashes."""
    src_hash, cfg_hash = source_fingerprint(cfg), config_fingerprint(cfg)
    fingerprint = hashlib.sha256(f"{src_hash}:{cfg_hash}".encode()).hexdigest()[:16]
    name = f"{cfg.source}-{cfg.src_lang}-{cfg.tgt_lang}-{fingerprint}"
    return storage.join(cfg.output_dir, name), src_hash, cfg_hash


def _log(message: str) -> None:
    print(f"[prepare] {message}", file=sys.stderr, flush=True)


def _tokenizer_sample(table: pa.Table, size: int, seed: int) -> tuple[list[str], list[str]]:
    """A seeded random sample of cleaned, non-empty training pairs for SentencePiece."""
    rows = list(range(table.num_rows))
    if len(rows) > size:
        rows = sorted(random.Random(seed).sample(rows, size))
    sample = clean_batch({"src": np.array(table.column("src").take(rows).to_pylist(), dtype=object),
                          "tgt": np.array(table.column("tgt").take(rows).to_pylist(), dtype=object)})
    keep = sample["drop"] == ""
    return list(sample["src"][keep]), list(sample["tgt"][keep])


def prepare(cfg: DataConfig, address: str | None = None, force: bool = False) -> Manifest:
    """Prepare the corpus (or reuse an identical earlier preparation) and return its manifest."""
    check_source(cfg)
    final, src_hash, cfg_hash = prepared_path(cfg)
    if not force and storage.exists(storage.join(final, MANIFEST)):
        _log(f"reusing {final} (same source data and data config)")
        return load_manifest(final)
    started = time.perf_counter()
    tables = read_corpus(cfg)
    for split, table in tables.items():
        if table.num_rows == 0:
            raise CorpusError(f"split {split!r} of the corpus is empty; check data.path and data.splits")
    _log(", ".join(f"{split}: {t.num_rows:,} pairs read" for split, t in tables.items()))

    tokenizer = train_tokenizer(*_tokenizer_sample(tables["train"], cfg.tokenizer_sample, cfg.seed),
                                vocab_size=cfg.vocab_size, model_type=cfg.tokenizer_type,
                                joint=cfg.joint_vocab, character_coverage=cfg.character_coverage)
    _log(f"SentencePiece {cfg.tokenizer_type}: vocabulary {tokenizer.src_vocab_size}"
         f"{'' if tokenizer.joint else f' / {tokenizer.tgt_vocab_size}'}")

    from .cluster import ensure_ray

    ensure_ray(address)
    out = final if storage.is_uri(final) else storage.temporary_sibling(final)
    try:
        splits = _prepare_splits(tables, tokenizer, cfg, out)
        files = [path.rsplit("/", 1)[-1] for path in _save_tokenizer(tokenizer, out)]
        content = {
            "format_version": FORMAT_VERSION, "fingerprint": final.rstrip("/").rsplit("-", 1)[-1],
            "source": cfg.source, "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang,
            "source_sha256": src_hash, "config_sha256": cfg_hash, "data_config": dataclasses.asdict(cfg),
            "splits": splits,
            "tokenizer": {"type": cfg.tokenizer_type, "joint": tokenizer.joint, "files": files,
                          "src_vocab_size": tokenizer.src_vocab_size, "tgt_vocab_size": tokenizer.tgt_vocab_size,
                          "sha256": tokenizer.sha256(), "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3},
            "created_s": round(time.time(), 3), "seconds": round(time.perf_counter() - started, 2),
        }
        storage.write_bytes(storage.join(out, MANIFEST), json.dumps(content, indent=2).encode())
    except BaseException:
        if not storage.is_uri(final):
            storage.remove_dir(out)  # nothing half-written is left behind
        raise
    if not storage.is_uri(final):
        storage.publish_dir(out, final)
    manifest = load_manifest(final)
    _log(f"done in {time.perf_counter() - started:.1f}s")
    return manifest


def _save_tokenizer(tokenizer: Tokenizer, directory: str) -> list[str]:
    paths = []
    for name, proto in tokenizer.files().items():  # through storage: the directory may be a URI
        paths.append(storage.join(directory, name))
        storage.write_bytes(paths[-1], proto)
    return paths


def _stats_columns(block: pa.Table) -> pa.Table:
    """What the manifest's statistics need of a block of encoded pairs."""
    return block.select(STATS_COLUMNS)


def _prepare_splits(tables: dict[str, pa.Table], tokenizer: Tokenizer, cfg: DataConfig, out: str) -> dict:
    """Clean, encode, filter and write every split in one Ray Data pipeline; returns the manifest entries.

    One pipeline rather than one per split: each Ray Data execution has a fixed cost (planning,
    scheduling, block metadata), which on a small corpus is more than the work itself.
    """
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = sys.stderr.isatty()  # in logs, our own lines
    num_cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    blocks = []
    for split, t in tables.items():
        # "row" is the pair's line in its split: readers sort by it, so the order of the data
        # (and so training) does not depend on how Ray Data scheduled the blocks.
        t = (t.append_column("split", pa.array([split] * t.num_rows, pa.string()))
              .append_column("row", pa.array(np.arange(t.num_rows, dtype=np.int64))))
        # Slices become the blocks directly (a repartition would be an all-to-all shuffle); a
        # block holds one split, so that it makes one Parquet file.
        size = -(-t.num_rows // (cfg.num_shards or _num_blocks(t.num_rows, num_cpus)))
        blocks += [t.slice(start, size) for start in range(0, t.num_rows, size)]
    settings = dict(src_proto=tokenizer.src_proto, tgt_proto=tokenizer.tgt_proto, max_len=cfg.max_len,
                    max_ratio=cfg.max_len_ratio, filter_split="train")
    if cfg.dedup:
        return _prepare_deduplicated(ray.data.from_arrow(blocks), settings, tables, cfg, out)
    # Ray Data reserves resources per operator so that the stages of a longer pipeline do not
    # starve one another; in this one-stage pass it only holds the second task back at the
    # start (about 1 s on 2 cores). A Dataset keeps a copy of the context it was made with,
    # so the setting is changed for this one and put back at once.
    context = ray.data.DataContext.get_current()
    reserve, context.op_resource_reservation_enabled = context.op_resource_reservation_enabled, False
    try:
        # One streaming pass: each task writes its block's shard itself and hands back only
        # the statistics columns, so writing overlaps encoding and nothing large is materialised.
        ds = ray.data.from_arrow(blocks).map_batches(encode_block, batch_format="numpy", batch_size=None,
                                                     fn_kwargs={"settings": settings, "out": out})
    finally:
        context.op_resource_reservation_enabled = reserve
    stats = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    return _split_entries(tables, stats, duplicates=0)


def _num_blocks(rows: int, num_cpus: int) -> int:
    """Blocks for a split: at most BLOCK_PAIRS each, a whole number of waves over the CPUs, not tiny."""
    waves = -(-rows // (BLOCK_PAIRS * num_cpus)) * num_cpus
    return max(1, min(waves, rows // 10_000))


def _prepare_deduplicated(ds, settings: dict, tables: dict[str, pa.Table], cfg: DataConfig, out: str) -> dict:
    """Encode everything, drop exact duplicates of the training split with a distributed group-by, write."""
    import ray
    from ray.data.expressions import col

    encoded = ds.map_batches(encode_block, batch_format="numpy", batch_size=None,
                             fn_kwargs={"settings": settings, "out": None}).materialize()
    # The few columns the manifest needs, cut from each block where it lives: a Ray Data pass
    # (select_columns) costs about 2 s of scheduling however small the data.
    select = ray.remote(_stats_columns)
    stats = pa.concat_tables(ray.get([select.remote(block) for block in encoded.to_arrow_refs()]))
    kept = encoded.filter(expr=col("drop") == "").drop_columns(["drop"])
    train = (kept.filter(expr=col("split") == "train").groupby(["src", "tgt"])
             .map_groups(lambda group: group.head(1), batch_format="pandas").materialize())
    train_kept = int(((stats["split"].to_numpy(zero_copy_only=False) == "train")
                      & (stats["drop"].to_numpy(zero_copy_only=False) == "")).sum())
    entries = _split_entries(tables, stats, duplicates=train_kept - train.count())
    for split in tables:
        rows = (train if split == "train" else kept.filter(expr=col("split") == split)).drop_columns(["split"])
        if cfg.num_shards:
            rows = rows.repartition(cfg.num_shards)
        rows.write_parquet(storage.join(out, split))
    return entries


def _split_entries(tables: dict[str, pa.Table], stats: pa.Table, *, duplicates: int) -> dict:
    """The manifest's entry per split: pairs kept, drops per rule, token statistics."""
    import pyarrow.compute as pc

    entries = {}
    for split, raw in tables.items():
        mine = stats.filter(pc.equal(stats["split"], split))
        drops = mine["drop"].to_numpy(zero_copy_only=False)
        dropped = {rule: int((drops == rule).sum()) for rule in DROP_RULES}
        dropped["duplicate"] = duplicates if split == "train" else 0
        keep = drops == ""
        pairs = int(keep.sum()) - dropped["duplicate"]
        if pairs == 0:
            raise CorpusError(f"split {split!r} is empty after cleaning (dropped: {dropped}); "
                              f"relax data.max_len / data.max_len_ratio or check the corpus")
        src_len, tgt_len = mine["src_len"].to_numpy()[keep], mine["tgt_len"].to_numpy()[keep]
        _log(f"{split}: kept {pairs:,} of {raw.num_rows:,} pairs (dropped "
             f"{', '.join(f'{k} {v}' for k, v in dropped.items() if v) or 'none'})")
        entries[split] = {
            "pairs": pairs, "read": int(raw.num_rows), "dropped": dropped,
            "src_tokens": int(src_len.sum()), "tgt_tokens": int(tgt_len.sum()),
            "src_tokens_mean": float(src_len.mean()), "tgt_tokens_mean": float(tgt_len.mean()),
            "src_tokens_max": int(src_len.max()), "tgt_tokens_max": int(tgt_len.max()),
            "tgt_tokens_p99": float(np.percentile(tgt_len, 99)),
        }
    return entries
