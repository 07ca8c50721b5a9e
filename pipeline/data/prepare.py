"""`nmt prepare` on Ray Data: read -> clean -> encode (SentencePiece) and write Parquet in Ray tasks -> manifest.

The output directory is content-addressed (a hash of the source data and the data config),
so re-running with identical inputs reuses it and any change prepares anew.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..common import log, storage
from ..common.errors import CorpusError, UserError
from ..config import DataConfig
from ..text.tokenizer import SPECIAL_IDS, Tokenizer, train_tokenizer
from .encode import DROP_RULES, encode_block, encode_settings, length_counts
from .kinds.registry import check_source, open_source, source_fingerprint
from .manifest import FORMAT_VERSION, MANIFEST, Manifest, SplitStats, TokenizerInfo, list_files, load_manifest
from .publish import destination_for
from .sources import TableSource, plan_blocks, tokenizer_sample

logger = log.get("prepare")


def config_fingerprint(cfg: DataConfig) -> str:
    """Hash of every data setting that changes the prepared output (not where it is written)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("output_dir", "path")}
    return hashlib.sha256(json.dumps([FORMAT_VERSION, settings], sort_keys=True).encode()).hexdigest()


def prepared_path(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> tuple[str, str, str]:
    """(directory, source hash, config hash): the directory is named after both (and a given tokenizer's)."""
    src_hash, cfg_hash = source_fingerprint(cfg), config_fingerprint(cfg)
    given = f":{tokenizer.sha256()}" if tokenizer is not None else ""  # a fine-tuned model's parent's
    fingerprint = hashlib.sha256(f"{src_hash}:{cfg_hash}{given}".encode()).hexdigest()[:16]
    name = f"{cfg.source}-{cfg.src_lang}-{cfg.tgt_lang}-{fingerprint}"
    return storage.join(cfg.output_dir, name), src_hash, cfg_hash


def prepare(cfg: DataConfig, address: str | None = None, force: bool = False,
            tokenizer: Tokenizer | None = None) -> Manifest:
    """Prepare the corpus (or reuse an identical earlier preparation) and return its manifest.

    A given tokenizer (the parent model's, when fine-tuning) is used instead of training one.
    """
    check_source(cfg)
    final, src_hash, cfg_hash = prepared_path(cfg, tokenizer)
    given = tokenizer is not None
    if not force and storage.exists(storage.join(final, MANIFEST)):
        logger.info(f"reusing {final} (same source data and data config)")
        manifest = load_manifest(final)
        manifest.check_files()
        return manifest
    started = time.perf_counter()
    from ..common.cluster import ensure_ray

    ensure_ray(address)  # line files are checked and read in Ray tasks
    source = open_source(cfg, on_ray=True)
    for split, count in source.counts.items():
        if count == 0:
            raise CorpusError(f"split {split!r} of the corpus is empty: read {source.described(split)}; "
                              "check data.path and data.splits")
    logger.info(", ".join(f"{split}: {count:,} pairs read" for split, count in source.counts.items()))

    if tokenizer is None:
        tokenizer = fit_tokenizer(source, cfg)
    logger.info(f"SentencePiece {cfg.tokenizer_type}: vocabulary {tokenizer.src_vocab_size}"
                f"{'' if tokenizer.joint else f' / {tokenizer.tgt_vocab_size}'}"
                f"{' from the parent model' if given else ''}")

    destination = destination_for(final, replace=force)  # --force replaces; else a concurrent twin's copy stays
    out = destination.staging()
    try:
        splits = prepare_splits(source, tokenizer, cfg, out)
        for split, files in list_files(out, list(splits)).items():
            rows = sum(f["rows"] for f in files.values())
            if rows != splits[split].pairs:  # a shard lost or written twice: never publish it
                raise CorpusError(f"{storage.join(out, split)}: {rows:,} rows written, {splits[split].pairs:,} "
                                  f"pairs counted; run `nmt prepare --force` again")
            splits[split] = dataclasses.replace(splits[split], files=files)
        files = [path.rsplit("/", 1)[-1] for path in save_tokenizer(tokenizer, out)]
        written = Manifest(
            out, fingerprint=final.rstrip("/").rsplit("-", 1)[-1], source=cfg.source, src_lang=cfg.src_lang,
            tgt_lang=cfg.tgt_lang, source_sha256=src_hash, config_sha256=cfg_hash,
            data_config=dataclasses.asdict(cfg), splits=splits,
            tokenizer_info=TokenizerInfo(cfg.tokenizer_type, tokenizer.joint, files, tokenizer.src_vocab_size,
                                         tokenizer.tgt_vocab_size, tokenizer.sha256(), **SPECIAL_IDS),
            created_s=round(time.time(), 3), seconds=round(time.perf_counter() - started, 2))
        written.write()
    except BaseException:
        destination.discard(out)
        raise
    destination.publish(written, out)
    manifest = load_manifest(final)
    logger.info(f"done in {time.perf_counter() - started:.1f}s")
    return manifest


def fit_tokenizer(source, cfg: DataConfig) -> Tokenizer:
    """SentencePiece on a seeded sample of the training split; for files, sampled and trained in a Ray task.

    At WMT14's size the sample is 2M pairs, held several times over while SentencePiece trains:
    that belongs on a worker, not on the driver (a cluster's head, sized to coordinate). A corpus
    that is an Arrow table in the driver's memory already (demo, data.source=hf) trains here.
    """
    def fit(source) -> dict[str, bytes]:
        src, tgt = tokenizer_sample(source, cfg.tokenizer_sample, cfg.seed)
        if not src:
            raise CorpusError(f"cannot train the tokenizer: no training pair sampled from "
                              f"{source.described('train')} has text on both sides; "
                              "check data.path, data.splits and the field names")
        return train_tokenizer(src, tgt, vocab_size=cfg.vocab_size, model_type=cfg.tokenizer_type,
                               joint=cfg.joint_vocab, character_coverage=cfg.character_coverage).files()

    if isinstance(source, TableSource):
        return Tokenizer.from_files(fit(source), "the tokenizer")
    import ray
    from ray.exceptions import RayTaskError

    try:
        return Tokenizer.from_files(ray.get(ray.remote(fit).remote(source)), "the tokenizer task")
    except RayTaskError as err:  # a user's mistake found in the task is still one line, not a traceback
        if isinstance(err.cause, UserError):
            raise err.cause from None
        raise


def save_tokenizer(tokenizer: Tokenizer, directory: str) -> list[str]:
    paths = []
    for name, proto in tokenizer.files().items():  # through storage: the directory may be a URI
        paths.append(storage.join(directory, name))
        storage.write_bytes(paths[-1], proto)
    return paths


def prepare_splits(source, tokenizer: Tokenizer, cfg: DataConfig, out: str) -> dict[str, SplitStats]:
    """Clean, encode, filter and write every split in one Ray Data pipeline; returns the manifest entries.

    One pipeline rather than one per split: each Ray Data execution has a fixed cost (planning,
    scheduling, block metadata), which on a small corpus is more than the work itself.
    """
    import ray

    if not log.verbose():  # Ray Data's INFO lines (execution plan, "finished in") with `nmt -v` only
        logging.getLogger("ray.data").setLevel(logging.WARNING)
    num_cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    plan = plan_blocks(source.counts, cfg.num_shards, num_cpus)
    settings = encode_settings(tokenizer, cfg)
    # Progress bars on a terminal only (in logs, our own lines). Ray Data reserves resources per operator
    # so that the stages of a longer pipeline do not starve one another; in this pass (at most a read,
    # then the encoding) it only holds the second task back at the start. A Dataset keeps a copy of the
    # context it was made with, so the settings are this pass's and put back after.
    with data_context(enable_progress_bars=sys.stderr.isatty(), op_resource_reservation_enabled=cfg.dedup):
        if cfg.dedup:
            return _prepare_deduplicated(source.dataset(plan), settings, source.counts, cfg, out)
        # One streaming pass: each task writes its block's shard itself and hands back only
        # its length counts, so writing overlaps encoding and nothing large is materialised.
        ds = source.dataset(plan).map_batches(encode_block, batch_format="pyarrow", batch_size=None,
                                              fn_kwargs={"settings": settings, "out": out})
        refs = ds.to_arrow_refs()
    counts = pa.concat_tables(ray.get(refs), promote_options="default")  # an empty block's are null-typed
    return split_entries(source.counts, counts)


@contextlib.contextmanager
def data_context(**settings) -> Iterator[None]:
    """Ray Data's DataContext with these settings for the block, the earlier values put back after."""
    import ray

    context = ray.data.DataContext.get_current()
    earlier = {name: getattr(context, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(context, name, value)
        yield
    finally:
        for name, value in earlier.items():
            setattr(context, name, value)


def _prepare_deduplicated(ds, settings: dict, read: dict[str, int], cfg: DataConfig, out: str) -> dict[str, SplitStats]:
    """Encode everything, drop exact duplicates of the training split with a distributed group-by, write."""
    import pyarrow.compute as pc
    import ray
    from ray.data.expressions import col

    context = ray.data.DataContext.get_current()
    encoded = ds.map_batches(encode_block, batch_format="pyarrow", batch_size=None,
                             fn_kwargs={"settings": settings, "out": None}).materialize()
    # Counted where each block lives: a Ray Data pass has a fixed scheduling cost however small the data.
    count = ray.remote(length_counts)
    counts = pa.concat_tables(ray.get([count.remote(block) for block in encoded.to_arrow_refs()]))
    train_kept = (col("split") == "train") & (col("drop") == "")
    # Hash-partitioned on the pair, so every copy of a pair is in one block, then marked a block at a time
    # (map_groups would call Python once per distinct pair: 4.5M calls for WMT14, an hour on 2 cores).
    partitions = context.default_hash_shuffle_parallelism
    train = (encoded.filter(expr=train_kept).repartition(partitions, keys=["src", "tgt"])
             .map_batches(_mark_duplicates, batch_format="pyarrow", batch_size=None).materialize())
    # The kept training pairs are counted again after marking, so the statistics describe what is written.
    was_kept = pc.and_(pc.equal(counts["split"], "train"), pc.equal(counts["drop"], ""))
    counts = pa.concat_tables([counts.filter(pc.invert(was_kept)),
                               *ray.get([count.remote(block) for block in train.to_arrow_refs()])],
                              promote_options="permissive")  # pandas may hand back large_string columns
    entries = split_entries(read, counts)
    for split in read:
        rows = train if split == "train" else encoded.filter(expr=col("split") == split)
        rows = rows.filter(expr=col("drop") == "").drop_columns(["split", "drop"])
        if cfg.num_shards:
            rows = rows.repartition(cfg.num_shards)
        rows.write_parquet(storage.join(out, split))
    return entries


def _mark_duplicates(block: pa.Table) -> pa.Table:
    """The block with all but the earliest line of each pair marked drop = "duplicate" (it holds every copy)."""
    import pyarrow.compute as pc

    firsts = block.group_by(["src", "tgt"], use_threads=False).aggregate([("row", "min")])
    earliest = firsts["row_min"].combine_chunks()
    drop = pc.if_else(pc.is_in(block["row"], value_set=earliest), block["drop"], "duplicate")
    return block.set_column(block.schema.get_field_index("drop"), "drop", drop)


def split_entries(read: dict[str, int], counts: pa.Table) -> dict[str, SplitStats]:
    """The manifest's entry per split from length_counts (and pairs read): kept, drops per rule, token statistics."""
    import pyarrow.compute as pc

    entries = {}
    for split, raw in read.items():
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
        logger.info(f"{split}: kept {pairs:,} of {raw:,} pairs (dropped "
                    f"{', '.join(f'{k} {v}' for k, v in dropped.items() if v) or 'none'})")
        entries[split] = SplitStats(
            pairs=pairs, read=int(raw), dropped=dropped, src_tokens=int(src_len.sum()), tgt_tokens=int(tgt_len.sum()),
            src_tokens_mean=float(src_len.mean()), tgt_tokens_mean=float(tgt_len.mean()),
            src_tokens_max=int(src_len.max()), tgt_tokens_max=int(tgt_len.max()),
            tgt_tokens_p99=float(np.percentile(tgt_len, 99)))
    return entries
