"""What a WMT14-sized corpus costs: `nmt prepare` at two sizes, one worker's shard, batches and steps from it.

Prints one JSON object on one line (and writes it indented with --out). The corpus is the built-in demo generator
at --pairs training pairs (4.5M, WMT14 En-De's size) and a tenth of that, both seeded: a
repeated Multi30k would be unrealistically cheap because the tokenizer caches every word
it has seen, so the distinct-word count of the large corpus is reported too.

- prepare: `nmt prepare` in a subprocess per size: wall time, pairs/s, the driver's peak RSS
  (os.wait4) and the peak of the Ray workers' RSS summed (sampled every 0.2 s).
- shard: one of --workers workers' shard of the large corpus, read from Parquet as training
  reads it (TokenShard, flat arrays), against the list-of-lists the loop held before
  (to_pylist), each in a fresh process: load seconds and peak RSS over the process's RSS
  before loading, next to the shard's token bytes as int32.
- collate: host milliseconds per batch of --batch-tokens tokens from the shard, TokenShard.collate
  against the former list-based collate (kept below as the baseline), on the same batches.
- step: training tokens/s of the demo config's model over --updates updates on batches from the
  whole shard against batches from its first 29,000 examples (Multi30k's size), alternating blocks.

    python benchmarks/scale.py                                  # 4.5M pairs: about 15 min on 2 cores
    python benchmarks/scale.py --pairs 450000 --out /tmp/s.json # a quicker look
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
MULTI30K_PAIRS = 29_000


def ray_workers() -> list[psutil.Process]:
    """Every Ray worker process on this machine."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            command = " ".join(proc.info["cmdline"] or [])
            if (proc.info["name"] or "").startswith("ray::") or "default_worker.py" in command:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _ray_worker_rss() -> int:
    """Bytes of resident memory of every Ray worker process on this machine, summed."""
    total = 0
    for proc in ray_workers():
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def run_measured(command: list[str], cwd: Path = REPO_ROOT) -> dict:
    """Run a command; its wall time, its own peak RSS and the peak of Ray workers' RSS summed meanwhile."""
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(0.2):
            peak[0] = max(peak[0], _ray_worker_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if status:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr.read()[-3000:]}")
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024),
            "ray_workers_peak_rss_mib": round(peak[0] / 2**20)}


def prepare(pairs: int, output_dir: str) -> tuple[dict, str]:
    """`nmt prepare` of the demo corpus at `pairs` training pairs: its figures and the prepared directory."""
    command = [sys.executable, "-m", "pipeline", "prepare", "--config", "configs/demo.yaml", "-q",
               "--set", f"data.demo_sizes={{train: {pairs}, validation: 1000, test: 1000}}",
               "--set", f"data.output_dir={output_dir}"]
    figures = run_measured(command)
    figures["pairs_per_s"] = round(pairs / figures["seconds"])
    (manifest,) = glob.glob(os.path.join(output_dir, "*", "manifest.json"))
    return figures, os.path.dirname(manifest)


def prepare_figures(result: dict, pairs: int, tmp: str) -> str:
    """`nmt prepare` at a tenth of `pairs` and at `pairs`, into result["prepare"]; the large one's directory."""
    result["prepare"] = {}
    for size in (pairs // 10, pairs):
        figures, data_dir = prepare(size, os.path.join(tmp, str(size)))
        result["prepare"][str(size)] = figures
        print(f"prepare {size:,} pairs: {figures}", file=sys.stderr)
    small, large = (result["prepare"][str(n)] for n in (pairs // 10, pairs))
    result["prepare"]["time_ratio_10x"] = round(large["seconds"] / small["seconds"], 2)
    result["prepare"]["driver_rss_ratio_10x"] = round(large["peak_rss_mib"] / small["peak_rss_mib"], 2)
    return data_dir


def distinct_words(data_dir: str) -> int:
    """Distinct whitespace-separated words on the source side of the prepared training split."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    seen = pa.array([], pa.string())
    for batch in ds.dataset(os.path.join(data_dir, "train"), format="parquet").to_batches(columns=["src"]):
        words = pc.list_flatten(pc.utf8_split_whitespace(batch.column("src")))
        seen = pc.unique(pa.concat_arrays([seen, pc.unique(words)]))
    return len(seen)


def _load(data_dir: str, workers: int, mode: str) -> None:
    """(In a fresh process) load rank 0's shard as `mode` and print the figures as JSON."""
    import pipeline.train.workers  # noqa: F401  (torch and the reader imported before measuring)
    from pipeline.data.manifest import load_manifest
    from pipeline.train.shard import COLUMNS

    before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    if mode == "flat":
        shard = _shard(data_dir, workers)
        pairs, tokens = len(shard), int(shard.src.lengths.sum() + shard.tgt.lengths.sum())
    else:  # the former path: the shard as an Arrow table, then a Python list per sentence
        table = load_manifest(data_dir).read_split("train", COLUMNS)
        table = table.take(np.arange(0, table.num_rows, workers))
        src, tgt = table.column("src_ids").to_pylist(), table.column("tgt_ids").to_pylist()
        del table
        pairs, tokens = len(src), sum(map(len, src)) + sum(map(len, tgt))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": round(seconds, 2), "pairs": pairs, "token_bytes_int32_mib": round(4 * tokens / 2**20),
                      "rss_growth_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                                              - before / 2**20)}))


def load_figures(data_dir: str, workers: int, mode: str) -> dict:
    """_load in a fresh process, so that each path's peak RSS is its own."""
    out = subprocess.run([sys.executable, __file__, "--load", data_dir, "--workers", str(workers), "--mode", mode],
                         check=True, capture_output=True, text=True, cwd=REPO_ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def list_collate(src_list, tgt_list, pad_id=0, bos_id=2, eos_id=3):
    """The baseline: the list-based collate the training loop used before TokenShard."""
    import torch

    def pad_rows(rows, width, offset=0):
        lengths = np.array([r.size for r in rows], dtype=np.int64)
        out = np.full((len(rows), width), pad_id, dtype=np.int64)
        columns = np.arange(width)
        out[(columns >= offset) & (columns < (lengths + offset)[:, None])] = np.concatenate(rows)
        return out

    srcs = [np.asarray(x, dtype=np.int64).reshape(-1) for x in src_list]
    tgts = [np.asarray(y, dtype=np.int64).reshape(-1) for y in tgt_list]
    src = pad_rows(srcs, max(x.size for x in srcs))
    width = max(y.size for y in tgts) + 1
    tgt_in = pad_rows(tgts, width, offset=1)
    tgt_in[:, 0] = bos_id
    tgt_out = pad_rows(tgts, width)
    tgt_out[np.arange(len(tgts)), [y.size for y in tgts]] = eos_id
    return torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)


def _shard(data_dir: str, workers: int):
    """Rank 0's shard of `workers`, read as torchrun workers read it (no process group needed)."""
    from pipeline.train.workers import TorchrunContext

    context = TorchrunContext.__new__(TorchrunContext)
    context.world_rank, context.world_size = 0, workers
    return context.train_shard(data_dir)


def collate_figures(shard, batch_tokens: int, batches: int = 200) -> dict:
    """Milliseconds per batch: TokenShard.collate against list_collate, on the same batches, alternating."""
    from pipeline.train.batching import token_budget_batches

    chosen = token_budget_batches(shard.src.lengths, shard.tgt.lengths, batch_tokens)[:batches]
    lists = [([shard.src.ids(i).tolist() for i in b], [shard.tgt.ids(i).tolist() for i in b]) for b in chosen]
    flat_s = listed_s = 0.0
    for batch, (src, tgt) in zip(chosen, lists):
        start = time.perf_counter()
        flat = shard.collate(batch)
        middle = time.perf_counter()
        listed = list_collate(src, tgt)
        flat_s, listed_s = flat_s + middle - start, listed_s + time.perf_counter() - middle
        assert all(a.equal(b) for a, b in zip(flat, listed)), "the two collates disagree"
    return {"batch_tokens": batch_tokens, "batches": len(chosen), "flat_ms": round(1000 * flat_s / len(chosen), 3),
            "lists_ms": round(1000 * listed_s / len(chosen), 3), "speedup": round(listed_s / flat_s, 2)}


def step_figures(shard, updates: int, block: int = 10) -> dict:
    """Training tokens/s on batches from the whole shard against batches from its first 29,000 examples."""
    import torch

    from model import Transformer, label_smoothed_cross_entropy
    from pipeline.config import load_config
    from pipeline.train.batching import token_budget_batches

    cfg = load_config(str(REPO_ROOT / "configs" / "demo.yaml"), [])
    torch.manual_seed(0)
    vocab = int(max(shard.src.tokens.max(), shard.tgt.tokens.max())) + 1
    model = Transformer(cfg.transformer_config(vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    lengths = shard.src.lengths, shard.tgt.lengths
    sources = {"full": token_budget_batches(*lengths, cfg.train.max_tokens),
               "multi30k_sized": token_budget_batches(*(x[:MULTI30K_PAIRS] for x in lengths), cfg.train.max_tokens)}
    tokens, seconds = dict.fromkeys(sources, 0), dict.fromkeys(sources, 0.0)
    for start in range(0, updates, block):  # alternating blocks: load on the machine hits both alike
        for name, batches in sources.items():
            begin = time.perf_counter()
            for index in batches[start: start + block]:
                src, tgt_in, tgt_out = shard.collate(index)
                loss, _, count = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, 0.1, 0,
                                                              compute_nll=False)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                tokens[name] += int(count)
            seconds[name] += time.perf_counter() - begin
    rates = {name: round(tokens[name] / seconds[name]) for name in sources}
    return {"updates": updates, "max_tokens": cfg.train.max_tokens, "tokens_per_s": rates,
            "full_over_multi30k_sized": round(rates["full"] / rates["multi30k_sized"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4_500_000, help="training pairs of the large corpus")
    parser.add_argument("--workers", type=int, default=2, help="training workers the corpus is sharded over")
    parser.add_argument("--batch-tokens", type=int, default=25_000, help="tokens per batch for the collate figure")
    parser.add_argument("--updates", type=int, default=100, help="updates per side for the step figure")
    parser.add_argument("--data", help="a prepared corpus to measure the shard on, skipping the prepare figures")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--load", help=argparse.SUPPRESS)  # internal: one _load in this process
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        _load(args.load, args.workers, args.mode)
        return
    import logging

    logging.disable(logging.WARNING)
    result = {"pairs": args.pairs, "workers": args.workers, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="nmt-scale-") as tmp:
        data_dir = args.data or prepare_figures(result, args.pairs, tmp)
        result["distinct_source_words"] = distinct_words(data_dir)
        result["shard"] = {mode: load_figures(data_dir, args.workers, mode) for mode in ("flat", "lists")}
        print(f"shard: {result['shard']}", file=sys.stderr)
        shard = _shard(data_dir, args.workers)
        result["collate"] = collate_figures(shard, args.batch_tokens)
        result["step"] = step_figures(shard, args.updates)
    print(json.dumps(result))  # one line: benchmarks/run_all.py collects it
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
