"""Score a torchrun run's newest checkpoint on a prepared split and time beam-search decoding; torch only.

    python benchmarks/gpu_eval.py --data DIR --checkpoints DIR [--train-log FILE] [--device auto] [--limit N]
        [--engines pytorch,ctranslate2]

A step of benchmarks/gpu_check.sh: no Ray, no MLflow. Prints one JSON object: lowercased
tokenized BLEU (as published Multi30k results), cased sacreBLEU and chrF, the updates the
checkpoint holds, decoding sentences/s at the given beam with each engine (CTranslate2: the
checkpoint exported as `nmt export` does, decoded as `nmt translate` does; skipped with the reason
where the package or its GPU build is missing), and, from the training log's JSON report lines,
training tokens/s per epoch (benchmarks/train_log.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.train_log import epoch_figures, progress_values  # noqa: E402
from pipeline.common import checkpoint  # noqa: E402
from pipeline.common.devices import resolve_device  # noqa: E402
from pipeline.data.manifest import load_manifest  # noqa: E402
from pipeline.text.metrics import score_with_signatures  # noqa: E402
from pipeline.text.translator import Translator  # noqa: E402


def timed(translate, sources: list[str], device: torch.device) -> tuple[list[str], float]:
    """Translations of all sources after a warm-up on 32 of them, and the seconds they took."""
    translate(sources[:32])  # warm-up: CUDA context, kernels, allocator
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    hypotheses = translate(sources)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return hypotheses, time.perf_counter() - started


def scored(hypotheses: list[str], references: list[str], seconds: float, split: str) -> dict:
    """BLEU (lowercased and cased), chrF and sentences/s of one engine's translations."""
    scores = score_with_signatures(hypotheses, references)
    return {f"{split}_bleu_lc": round(scores["bleu_lc"], 2), f"{split}_bleu": round(scores["bleu"], 2),
            f"{split}_chrf": round(scores["chrf"], 2), "bleu_signature": scores["bleu_signature"],
            "decode_sentences_per_s": round(len(hypotheses) / seconds, 1)}


def ctranslate2_figures(translator: Translator, sources, references, args, device) -> dict:
    """The checkpoint exported to CTranslate2 and decoded on the device, or why it could not be."""
    try:
        import ctranslate2

        from pipeline.text.ct2 import Ct2Translator, export
    except ImportError as err:
        return {"skipped": f"ctranslate2 is not installed ({err})"}
    if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return {"skipped": f"ctranslate2 {ctranslate2.__version__} sees no CUDA device (a CPU-only build, or its "
                           "CUDA libraries are missing)"}
    with tempfile.TemporaryDirectory() as tmp:
        directory = export(translator, Path(tmp) / "ct2", quantization=args.ct2_quantization)
        engine = Ct2Translator(directory, device=device.type, beam_size=args.beam, alpha=args.alpha)
        hypotheses, seconds = timed(lambda texts: engine.translate(texts, batch_size=256), sources, device)
    return {"quantization": args.ct2_quantization, "version": ctranslate2.__version__,
            **scored(hypotheses, references, seconds, args.split)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the prepared dataset the run trained on")
    parser.add_argument("--checkpoints", required=True, help="the run's --checkpoints directory")
    parser.add_argument("--split", default="test")
    parser.add_argument("--train-log", help="stderr of the torchrun run (its JSON report lines)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--limit", type=int, default=0, help="only the first N sentences (0: all)")
    parser.add_argument("--engines", default="pytorch", help="comma-separated: pytorch, ctranslate2")
    parser.add_argument("--ct2-quantization", default="int8", choices=["int8", "float32"])
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
    # translate_ids batches by tokens, so one call with every sentence is as nmt evaluate decodes.
    hypotheses, seconds = timed(lambda texts: translator.translate(texts, batch_size=len(texts)), sources, device)
    result = {
        "checkpoint": newest.name, "updates": metrics["step"], "averaged": metrics.get("averaged", 0),
        "val_bleu": round(metrics["val_bleu"], 2), **scored(hypotheses, references, seconds, args.split),
        "sentences": len(hypotheses), "beam": args.beam, "device": str(device),
        "examples": list(zip(sources[:3], hypotheses[:3])),
    }
    if "ctranslate2" in args.engines.split(","):
        result["ctranslate2"] = ctranslate2_figures(translator, sources, references, args, device)
    if args.train_log:
        result.update(epoch_figures(progress_values(Path(args.train_log))))
    print(json.dumps(result, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main()
