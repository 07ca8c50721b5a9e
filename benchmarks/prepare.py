"""Throughput of `nmt prepare`'s Ray Data stages versus the same work in one process, on Multi30k.

Prints one JSON object. Reads Multi30k with the shipped config (configs/multi30k_en_de.yaml),
trains its tokenizer once (untimed), then times, on the same tables and tokenizer:

- ray: pipeline.data.prepare.prepare_splits (one streaming Ray Data pass: tasks clean and encode blocks
  of up to 100k pairs with EncodeBatch, 4096 pairs per call, apply the length filters and write
  their own Parquet shards; length counts come back to the driver) on a Ray instance that is
  already started;
- single_process: the same blocks through the same task function (encode_block: encode, write
  the block's shards, count) in a loop on the driver, then the same manifest statistics;
- encode: EncodeBatch.__call__ alone, in rows (sentence pairs) per CPU-second, on the repeated
  corpus (after its first copy every word is in the encoder's word cache); encode_first_pass:
  a fresh encoder over Multi30k once, where every word is new to the cache (the worst case).

Multi30k's 29k pairs are small next to Ray's fixed cost per execution, so the training split is
also repeated --repeat times to see the throughput where parallelism can pay off. The two paths
alternate run by run, so that other load on the machine (reported as loadavg_1m) hits both:

    python benchmarks/prepare.py                                    # ../shared/data/multi30k
    python benchmarks/prepare.py --data-dir /data/multi30k --repeat 16 --runs 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from pipeline.config import load_config  # noqa: E402
from pipeline.data.encode import ENCODE_PAIRS, EncodeBatch, encode_block, encode_settings, numpy_batches  # noqa: E402
from pipeline.data.kinds.registry import read_corpus  # noqa: E402
from pipeline.data.prepare import prepare_splits, split_entries  # noqa: E402
from pipeline.data.sources import TableSource, labeled, plan_blocks, tokenizer_sample  # noqa: E402
from pipeline.text.tokenizer import train_tokenizer  # noqa: E402

TARGET_SPEEDUP, TARGET_ENCODE_PER_CORE = 1.5, 50_000


def default_data_dir() -> Path:
    """$NMT_MULTI30K_DIR when set, else the shared copy next to the repository."""
    return Path(os.environ.get("NMT_MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))


def repeated(tables: dict[str, pa.Table], times: int) -> dict[str, pa.Table]:
    """The splits with the training split concatenated `times` times (validation and test as read)."""
    return {split: pa.concat_tables([t] * times) if split == "train" else t for split, t in tables.items()}


def single_process(tables: dict[str, pa.Table], settings: dict, out: str) -> dict[str, int]:
    """The Ray tasks' work in a loop on the driver: the same blocks through encode_block; pairs kept per split."""
    source = TableSource(tables)
    counts = [encode_block(block, settings, out)
              for block in source.blocks(plan_blocks(source.counts, None, os.cpu_count() or 1))]
    entries = split_entries(source.counts, pa.concat_tables(counts))  # the manifest's statistics
    return {split: entry.pairs for split, entry in entries.items()}


def encode_only(tables: dict[str, pa.Table], encoder: EncodeBatch) -> dict:
    """EncodeBatch.__call__ alone on ready-made batches: wall and CPU seconds, rows per CPU-second."""
    batches = list(numpy_batches(pa.concat_tables([labeled(t, split, 0) for split, t in tables.items()]),
                                 ENCODE_PAIRS))
    rows = sum(len(b["src"]) for b in batches)
    wall, cpu = time.perf_counter(), time.process_time()  # process_time counts SentencePiece's threads too
    for batch in batches:
        encoder(batch)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"rows": rows, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "rows_per_s": round(rows / wall), "rows_per_s_per_core": round(rows / cpu)}


def written_pairs(out: Path, splits) -> dict[str, int]:
    """Rows in each split's Parquet files, to check that both paths wrote the same data."""
    return {split: sum(pq.read_metadata(f).num_rows for f in (out / split).glob("*.parquet")) for split in splits}


def timed(fn, args: tuple, tables: dict[str, pa.Table]) -> tuple[float, float, dict[str, int]]:
    """Wall and this process's CPU seconds of fn(*args, out) into a fresh directory, and the pairs written."""
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        out = Path(tmp) / "out"
        wall, cpu = time.perf_counter(), time.process_time()
        fn(*args, str(out))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, written_pairs(out, tables)


def summary(rows: int, runs: list[tuple[float, float, dict]]) -> dict:
    """Rows, seconds of every run, of the first (what one `nmt prepare` pays) and of the best, and rows/s."""
    seconds = [wall for wall, _, _ in runs]
    best = min(seconds)
    return {"rows": rows, "seconds": [round(s, 3) for s in seconds], "first_s": round(seconds[0], 3),
            "best_s": round(best, 3), "rows_per_s": round(rows / best),
            "first_rows_per_s": round(rows / seconds[0]),
            "driver_cpu_s": [round(cpu, 3) for _, cpu, _ in runs]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir", type=Path, default=default_data_dir(),
        help="folder with the Multi30k text files (default: $NMT_MULTI30K_DIR or ../shared/data/multi30k)",
    )
    parser.add_argument("--repeat", type=int, default=32,
                        help="times the training split is repeated for the larger measurement (1: Multi30k only)")
    parser.add_argument("--runs", type=int, default=1,
                        help="timed runs per path and size; the first (cold for Ray) and the best are reported")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.runs < 1:
        parser.error("--repeat and --runs must be at least 1")
    if not (args.data_dir / "train.en").is_file():
        raise SystemExit(f"Multi30k not found at {args.data_dir}; pass --data-dir or set NMT_MULTI30K_DIR")

    cfg = load_config(REPO_ROOT / "configs" / "multi30k_en_de.yaml",
                      [f"data.path={args.data_dir.resolve()}"]).data
    if cfg.dedup:
        raise SystemExit("the single-process path has no dedup; benchmark with data.dedup false")
    tables = read_corpus(cfg)
    load_before = os.getloadavg()[0]  # other work on the machine skews both paths, Ray's more
    start = time.perf_counter()
    tokenizer = train_tokenizer(*tokenizer_sample(TableSource(tables), cfg.tokenizer_sample, cfg.seed),
                                vocab_size=cfg.vocab_size, model_type=cfg.tokenizer_type,
                                joint=cfg.joint_vocab, character_coverage=cfg.character_coverage)
    tokenizer_s = time.perf_counter() - start
    settings = encode_settings(tokenizer, cfg)
    encoder = EncodeBatch(**settings)
    sizes = sorted({1, args.repeat})

    # Encoding alone goes first, before Ray's processes share the cores. A fresh encoder on
    # Multi30k once is the worst case (every word new to its cache); then the repeated corpus.
    encode_first_pass = encode_only(tables, EncodeBatch(**settings))
    encode = encode_only(repeated(tables, sizes[-1]), encoder)

    import ray

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False

    @ray.remote(num_cpus=1)
    def ready():
        return os.getpid()

    ray.get([ready.remote() for _ in range(cpus)])  # worker processes are up: start-up is not timed
    local, distributed = {}, {}
    for times in sizes:
        data = repeated(tables, times)
        local[times], distributed[times] = [], []
        for _ in range(args.runs):  # alternate, so that other load on the machine hits both paths alike
            local[times].append(timed(single_process, (data, settings), tables))
            distributed[times].append(timed(prepare_splits, (TableSource(data), tokenizer, cfg), tables))
    ray.shutdown()

    results = {}
    for times in sizes:
        rows = sum(t.num_rows for t in repeated(tables, times).values())
        ray_pairs, local_pairs = distributed[times][-1][2], local[times][-1][2]
        if ray_pairs != local_pairs:
            raise SystemExit(f"the two paths wrote different data: ray {ray_pairs}, single process {local_pairs}")
        ray_sum, local_sum = summary(rows, distributed[times]), summary(rows, local[times])
        results[f"repeat_{times}"] = {
            "train_rows": repeated(tables, times)["train"].num_rows, "rows": rows, "pairs_written": ray_pairs,
            "ray": ray_sum, "single_process": local_sum,
            "speedup": round(local_sum["best_s"] / ray_sum["best_s"], 3),
            "speedup_first_run": round(local_sum["first_s"] / ray_sum["first_s"], 3),
            # Each run against the single-process run just before it: less swayed by one lucky run.
            "speedup_median_of_pairs": round(float(np.median(
                [one[0] / many[0] for one, many in zip(local[times], distributed[times])])), 3),
        }
    largest = results[f"repeat_{sizes[-1]}"]
    print(json.dumps({
        "benchmark": "prepare",
        "corpus": f"multi30k {cfg.src_lang}-{cfg.tgt_lang} (train, validation, test)",
        "row": "one sentence pair", "batch_size": ENCODE_PAIRS, "runs": args.runs, "cpu_count": cpus,
        "sentencepiece_threads": 1,  # EncodeBatch asks for one: Ray runs an encoder per CPU already
        "ray_version": ray.__version__, "tokenizer_train_s": round(tokenizer_s, 2),
        "loadavg_1m": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)},
        **results,
        "encode": encode, "encode_first_pass": encode_first_pass,
        "targets": {
            "ray_speedup_min": TARGET_SPEEDUP, "ray_speedup": largest["speedup"],
            "ray_speedup_met": largest["speedup"] >= TARGET_SPEEDUP,
            "encode_rows_per_s_per_core_min": TARGET_ENCODE_PER_CORE,
            "encode_rows_per_s_per_core": encode["rows_per_s_per_core"],
            "encode_met": encode["rows_per_s_per_core"] >= TARGET_ENCODE_PER_CORE,
            "encode_first_pass_rows_per_s_per_core": encode_first_pass["rows_per_s_per_core"],
            "encode_first_pass_met": encode_first_pass["rows_per_s_per_core"] >= TARGET_ENCODE_PER_CORE,
        },
    }))


if __name__ == "__main__":
    main()
