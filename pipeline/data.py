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
STATS_KEYS = ["split", "drop", "src_len", "tgt_len"]  # the manifest's statistics count pairs by these
# Pairs per Ray Data block (one task; a Parquet file per split in it). Large, so that each
# task's fixed cost (scheduling, files) stays small: 100k was at least as fast as 25k and 50k.
BLOCK_PAIRS = 100_000
# Pairs per EncodeBatch call within a block: Python's lists of a few thousand strings stay in
# the CPU caches, and one call on a whole 100k block took ~15% more CPU time.
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


def _prepare_splits(tables: dict[str, pa.Table], tokenizer: Tokenizer, cfg: DataConfig, out: str) -> dict:
    """Clean, encode, filter and write every split in one Ray Data pipeline; returns the manifest entries.

    One pipeline rather than one per split: each Ray Data execution has a fixed cost (planning,
    scheduling, block metadata), which on a small corpus is more than the work itself.
    """
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = sys.stderr.isatty()  # in logs, our own lines
    num_cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    blocks = _blocks(tables, cfg.num_shards, num_cpus)
    settings = encode_settings(tokenizer, cfg)
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
        # its length counts, so writing overlaps encoding and nothing large is materialised.
        ds = ray.data.from_arrow(blocks).map_batches(encode_block, batch_format="pyarrow", batch_size=None,
                                                     fn_kwargs={"settings": settings, "out": out})
    finally:
        context.op_resource_reservation_enabled = reserve
    counts = pa.concat_tables(ray.get(ds.to_arrow_refs()), promote_options="default")  # an empty block's are null-typed
    return _split_entries(tables, counts)


def encode_settings(tokenizer: Tokenizer, cfg: DataConfig) -> dict:
    """EncodeBatch's arguments for this tokenizer and config (what encode_block's tasks get)."""
    return dict(src_proto=tokenizer.src_proto, tgt_proto=tokenizer.tgt_proto, max_len=cfg.max_len,
                max_ratio=cfg.max_len_ratio, filter_split="train")


def labeled_splits(tables: dict[str, pa.Table]) -> list[pa.Table]:
    """Each split with "split" (its name) and "row" (the pair's line in it) columns added."""
    # "row" lets readers sort, so the order of the data (and so training) does not depend on
    # how Ray Data scheduled the blocks.
    return [t.append_column("split", pa.array([split] * t.num_rows, pa.string()))
             .append_column("row", pa.array(np.arange(t.num_rows, dtype=np.int64)))
            for split, t in tables.items()]


def _blocks(tables: dict[str, pa.Table], num_shards: int | None, num_cpus: int) -> list[pa.Table]:
    """The splits, with "split" and "row" columns, sliced into the Ray Data blocks (one task each).

    Slices become the blocks directly: a repartition would be an all-to-all shuffle.
    """
    labeled = labeled_splits(tables)
    if num_shards:  # files per split, as asked: each split is sliced on its own
        return [block for t in labeled for block in _slices(t, num_shards)]
    # All splits end to end in equal blocks, so the tasks take equally long and the small
    # validation and test splits share a task with training pairs instead of costing one each.
    whole = pa.concat_tables(labeled)
    waves = -(-whole.num_rows // (BLOCK_PAIRS * num_cpus))  # at most BLOCK_PAIRS per block
    return _slices(whole, max(1, min(waves * num_cpus, whole.num_rows // 10_000)))  # not tiny


def _slices(table: pa.Table, count: int) -> list[pa.Table]:
    """`count` slices of (nearly) equal size, fewer if the table is shorter."""
    size = max(1, -(-table.num_rows // count))
    return [table.slice(start, size) for start in range(0, table.num_rows, size)]


def _prepare_deduplicated(ds, settings: dict, tables: dict[str, pa.Table], cfg: DataConfig, out: str) -> dict:
    """Encode everything, drop exact duplicates of the training split with a distributed group-by, write."""
    import pyarrow.compute as pc
    import ray
    from ray.data.expressions import col

    encoded = ds.map_batches(encode_block, batch_format="pyarrow", batch_size=None,
                             fn_kwargs={"settings": settings, "out": None}).materialize()
    # Counted where each block lives: a Ray Data pass costs about 2 s of scheduling however small the data.
    count = ray.remote(length_counts)
    counts = pa.concat_tables(ray.get([count.remote(block) for block in encoded.to_arrow_refs()]))
    train_kept = (col("split") == "train") & (col("drop") == "")
    train = (encoded.filter(expr=train_kept).groupby(["src", "tgt"])
             .map_groups(_mark_duplicates, batch_format="pandas").materialize())
    # The kept training pairs are counted again after marking, so the statistics describe what is written.
    was_kept = pc.and_(pc.equal(counts["split"], "train"), pc.equal(counts["drop"], ""))
    counts = pa.concat_tables([counts.filter(pc.invert(was_kept)),
                               *ray.get([count.remote(block) for block in train.to_arrow_refs()])],
                              promote_options="permissive")  # pandas may hand back large_string columns
    entries = _split_entries(tables, counts)
    for split in tables:
        rows = train if split == "train" else encoded.filter(expr=col("split") == split)
        rows = rows.filter(expr=col("drop") == "").drop_columns(["split", "drop"])
        if cfg.num_shards:
            rows = rows.repartition(cfg.num_shards)
        rows.write_parquet(storage.join(out, split))
    return entries


def _mark_duplicates(group):
    """A group of identical pairs with all but the earliest line marked drop = "duplicate"."""
    group = group.sort_values("row")
    group.iloc[1:, group.columns.get_loc("drop")] = "duplicate"
    return group


def _split_entries(tables: dict[str, pa.Table], counts: pa.Table) -> dict:
    """The manifest's entry per split from length_counts: pairs kept, drops per rule, token statistics."""
    import pyarrow.compute as pc

    entries = {}
    for split, raw in tables.items():
        mine = counts.filter(pc.equal(counts["split"], split))
        drops, n = mine["drop"].to_numpy(zero_copy_only=False), mine["count_all"].to_numpy()
        dropped = {rule: int(n[drops == rule].sum()) for rule in DROP_RULES}
        keep = drops == ""
        pairs = int(n[keep].sum())
        if pairs == 0:
            raise CorpusError(f"split {split!r} is empty after cleaning (dropped: {dropped}); "
                              f"relax data.max_len / data.max_len_ratio or check the corpus")
        # One value per pair again: exact statistics (a p99 too) from a few hundred counted rows.
        src_len = np.repeat(mine["src_len"].to_numpy()[keep], n[keep])
        tgt_len = np.repeat(mine["tgt_len"].to_numpy()[keep], n[keep])
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
