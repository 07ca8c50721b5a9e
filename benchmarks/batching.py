"""Padding efficiency and build time of token-budget batches versus random batches on Multi30k, and the tensor
shapes an epoch brings with and without a ShapePolicy (widths to a multiple, rows to a few sizes).

Prints one JSON object. Needs numpy, torch and sentencepiece (no Ray, no MLflow); trains the
project's SentencePiece recipe (joint BPE, vocab 8000) on the training pairs in a temporary
directory, then batches the encoded lengths:

    python benchmarks/batching.py                                  # ../shared/data/multi30k
    python benchmarks/batching.py --data-dir /data/multi30k --max-tokens 25000
    python benchmarks/batching.py --max-tokens 8192 --shapes 8:3,16:3   # pad multiple:row buckets
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from pipeline.train.batching import (  # noqa: E402
    padding_efficiency,
    random_batches,
    shaped_batches,
    token_budget_batches,
)
from pipeline.train.shapes import ShapePolicy, batch_shapes, computed_efficiency  # noqa: E402


def default_data_dir() -> Path:
    """$NMT_MULTI30K_DIR when set, else the shared copy next to the repository."""
    return Path(os.environ.get("NMT_MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))


def encoded_lengths(
    data_dir: Path, src_lang: str, tgt_lang: str, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of every training pair under a joint BPE trained on both sides."""
    import sentencepiece as spm

    files = [data_dir / f"train.{src_lang}", data_dir / f"train.{tgt_lang}"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(
            f"Multi30k training files not found: {', '.join(missing)}; pass --data-dir or set NMT_MULTI30K_DIR"
        )
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "joint")
        spm.SentencePieceTrainer.train(
            input=[str(f) for f in files], model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
            input_sentence_size=200000, shuffle_input_sentence=True, character_coverage=1.0,
            pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
        )
        sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    lengths = []
    for f in files:
        lengths.append(np.array([len(ids) for ids in sp.encode(f.read_text(encoding="utf-8").splitlines())]))
    if lengths[0].size != lengths[1].size:
        raise SystemExit(f"{files[0]} and {files[1]} differ in line count: {lengths[0].size} vs {lengths[1].size}")
    return lengths[0], lengths[1]


def measure(builder, src, tgt, max_tokens: int, repeats: int) -> dict:
    """Efficiency, batch count and median build time of one batching strategy."""
    times = []
    for epoch in range(repeats):
        start = time.perf_counter()
        batches = builder(src, tgt, max_tokens, seed=0, epoch=epoch)
        times.append(time.perf_counter() - start)
    sizes = np.array([len(b) for b in batches])
    return {
        "padding_efficiency": round(padding_efficiency(batches, src, tgt), 4),
        "num_batches": len(batches),
        "mean_batch_size": round(float(sizes.mean()), 1),
        "build_s": round(statistics.median(times), 4),
    }


def shape_figures(src, tgt, max_tokens: int, shapes: ShapePolicy | None, epochs: int) -> dict:
    """Distinct tensor shapes per epoch and over `epochs` epochs, batches, and the share of computed tokens that
    are real, for today's token-budget batches (shapes None) or shaped ones."""
    per_epoch, union, efficiency, count = [], set(), [], []
    shapes = shapes.fitted(src, tgt) if shapes is not None else None  # as the training loop fits it to its shard
    for epoch in range(epochs):
        if shapes is None:
            batches = token_budget_batches(src, tgt, max_tokens, seed=0, epoch=epoch)
        else:
            batches = shaped_batches(src, tgt, shapes, seed=0, epoch=epoch)
        found = set(batch_shapes(batches, src, tgt, shapes))
        per_epoch.append(len(found))
        union |= found
        efficiency.append(computed_efficiency(batches, src, tgt, shapes))
        count.append(len(batches))
    return {"shapes_per_epoch": per_epoch, f"shapes_in_{epochs}_epochs": len(union),
            "batches_per_epoch": round(statistics.mean(count), 1),
            "computed_efficiency": round(statistics.mean(efficiency), 4)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir", type=Path, default=default_data_dir(),
        help="folder with train.<src> and train.<tgt> (default: $NMT_MULTI30K_DIR or ../shared/data/multi30k)",
    )
    parser.add_argument("--max-tokens", type=int, default=4096, help="padded source + target tokens per batch")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed builds per strategy, one epoch each; the median is reported"
    )
    parser.add_argument("--shapes", default="8:3,16:3",
                        help="comma-separated pad_multiple:batch_buckets settings whose shapes are counted")
    parser.add_argument("--epochs", type=int, default=3, help="epochs whose shapes are counted")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    src, tgt = encoded_lengths(args.data_dir.resolve(), args.src_lang, args.tgt_lang, args.vocab_size)
    tokenize_s = time.perf_counter() - start
    token_budget = measure(token_budget_batches, src, tgt, args.max_tokens, args.repeats)
    baseline = measure(random_batches, src, tgt, args.max_tokens, args.repeats)
    result = {
        "benchmark": "batching",
        "corpus": f"multi30k train {args.src_lang}-{args.tgt_lang}",
        "num_examples": int(src.size),
        "mean_src_tokens": round(float(src.mean()), 2),
        "mean_tgt_tokens": round(float(tgt.mean()), 2),
        "vocab_size": args.vocab_size,
        "max_tokens": args.max_tokens,
        "token_budget": token_budget,
        "random": baseline,
        "padded_tokens_saved": round(1 - baseline["padding_efficiency"] / token_budget["padding_efficiency"], 4),
        "tokenize_s": round(tokenize_s, 2),
        "shapes": {"exact": shape_figures(src, tgt, args.max_tokens, None, args.epochs)},
    }
    for setting in filter(None, args.shapes.split(",")):
        multiple, buckets = map(int, setting.split(":"))
        shaped = shape_figures(src, tgt, args.max_tokens, ShapePolicy(args.max_tokens, multiple, buckets), args.epochs)
        # What the padding costs: more computed tokens for the same real ones, as a fraction of today's.
        shaped["computed_tokens_vs_exact"] = round(
            result["shapes"]["exact"]["computed_efficiency"] / shaped["computed_efficiency"], 4)
        result["shapes"][f"pad_multiple={multiple},batch_buckets={buckets}"] = shaped
    print(json.dumps(result))


if __name__ == "__main__":
    main()
