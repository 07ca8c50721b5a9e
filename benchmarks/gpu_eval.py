"""Score a torchrun run's newest checkpoint on a prepared split and time beam-search decoding; torch only.

    python benchmarks/gpu_eval.py --data DIR --checkpoints DIR [--train-log FILE] [--device auto] [--limit N]

The third and fourth steps of benchmarks/gpu_check.sh: no Ray, no MLflow. Prints one JSON
object: lowercased tokenized BLEU (as published Multi30k results), cased sacreBLEU and chrF,
the updates the checkpoint holds, decoding sentences/s at the given beam, and, from the
training log's JSON report lines, the mean target tokens/s of training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.common import checkpoint  # noqa: E402
from pipeline.common.devices import resolve_device  # noqa: E402
from pipeline.data.manifest import load_manifest  # noqa: E402
from pipeline.text.metrics import score_with_signatures  # noqa: E402
from pipeline.text.translator import Translator  # noqa: E402


def training_figures(log_file: Path) -> dict:
    """Mean tokens/s and the last train_seconds over the JSON report lines torchrun's rank 0 printed."""
    values = []
    for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith('{"report"'):
            report = json.loads(line)
            values += [v for v in (*report.get("progress_values", []), report) if "tokens_per_s" in v]
    if not values:
        return {}
    return {"train_tokens_per_s": round(statistics.mean(v["tokens_per_s"] for v in values)),
            "train_seconds": round(max(v["train_seconds"] for v in values), 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the prepared dataset the run trained on")
    parser.add_argument("--checkpoints", required=True, help="the run's --checkpoints directory")
    parser.add_argument("--split", default="test")
    parser.add_argument("--train-log", help="stdout of the torchrun run (its JSON report lines)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--limit", type=int, default=0, help="only the first N sentences (0: all)")
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    newest = sorted(Path(args.checkpoints).glob("checkpoint_*"))[-1]
    metrics = checkpoint.load(newest)["metrics"]
    manifest = load_manifest(args.data)
    split = manifest.read_split(args.split, ["src", "tgt"])
    sources, references = split.column("src").to_pylist(), split.column("tgt").to_pylist()
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    translator = Translator.from_checkpoint(newest, manifest.tokenizer(), beam_size=args.beam, alpha=args.alpha,
                                            device=str(device))
    translator.translate(sources[:32])  # warm-up: CUDA context, kernels, allocator
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    hypotheses = translator.translate(sources, batch_size=len(sources))  # translate_ids batches by tokens
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    scores = score_with_signatures(hypotheses, references)
    result = {
        "checkpoint": newest.name, "updates": metrics["step"], "averaged": metrics.get("averaged", 0),
        "val_bleu": round(metrics["val_bleu"], 2),
        f"{args.split}_bleu_lc": round(scores["bleu_lc"], 2), f"{args.split}_bleu": round(scores["bleu"], 2),
        f"{args.split}_chrf": round(scores["chrf"], 2), "bleu_signature": scores["bleu_signature"],
        "sentences": len(hypotheses), "beam": args.beam, "device": str(device),
        "decode_sentences_per_s": round(len(hypotheses) / seconds, 1),
        "examples": list(zip(sources[:3], hypotheses[:3])),
    }
    if args.train_log:
        result.update(training_figures(Path(args.train_log)))
    print(json.dumps(result, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main()
