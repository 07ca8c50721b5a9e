"""Translation quality on Multi30k en->de: train within a wall-clock budget, score the final and averaged models.

    python benchmarks/multi30k_quality.py --budget-min 90 [--data-dir DIR] [--set key=value ...]

Trains configs/multi30k_en_de.yaml with `nmt train`'s code path (Ray Train, MLflow), then
translates test_2016_flickr with the last checkpoint and with the average of the last
train.average_last checkpoints, and prints JSON: cased detokenized sacreBLEU, chrF,
lowercased tokenized BLEU (as published Multi30k results are scored), training time,
tokens/s and the parameter count. Beam size and length penalty are chosen on the validation
split (--beams x --alphas, by cased BLEU) for each model; test_2016_flickr is decoded once, with
that choice. Writes the learning curve to --plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.common import checkpoint, log  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.text.metrics import score_with_signatures  # noqa: E402
from pipeline.text.translator import Translator  # noqa: E402
from pipeline.track import tracking  # noqa: E402
from pipeline.track.plots import learning_curves  # noqa: E402
from pipeline.track.target import resolve  # noqa: E402
from pipeline.train.driver import train  # noqa: E402


def _checkpoints(run_dir: Path) -> list[dict]:
    """Every kept checkpoint of the run: its directory and the metrics it was reported with."""
    found = []
    for model_file in run_dir.glob("checkpoint_*/model.pt"):
        state = checkpoint.load(model_file.parent)
        found.append({"path": str(model_file.parent), "model_config": state["model_config"], **state["metrics"]})
    return sorted(found, key=lambda c: (c["step"], "averaged" in c))


def _scores(path: str, manifest, split: str, beam: int, alpha: float) -> dict:
    """BLEU (cased, lowercased) and chrF of one checkpoint on one split, decoded with this beam and alpha."""
    table = pq.read_table(manifest.split_dir(split), columns=["row", "src", "tgt"]).sort_by("row")
    translator = Translator.from_checkpoint(path, manifest.tokenizer(), beam_size=beam, alpha=alpha)
    started = time.perf_counter()
    hyps = translator.translate(table.column("src").to_pylist())
    scores = score_with_signatures(hyps, table.column("tgt").to_pylist())
    return {**scores, "sentences": len(hyps), "decode_s": round(time.perf_counter() - started, 1),
            "examples": list(zip(table.column("src").to_pylist()[:3], hyps[:3]))}


def _evaluate(path: str, manifest, beams: list[int], alphas: list[float]) -> dict:
    """Beam and alpha chosen by validation BLEU, then test scores with them (test is decoded once)."""
    settings = {(b, a if b > 1 else alphas[0]) for b in beams for a in alphas}  # greedy has no length penalty
    tried = {(b, a): _scores(path, manifest, "validation", b, a)["bleu"] for b, a in sorted(settings)}
    beam, alpha = max(tried, key=tried.get)
    return {"beam": beam, "alpha": alpha, "val_bleu_by_decoding": {f"beam {b}, alpha {a}": round(v, 2)
                                                                     for (b, a), v in tried.items()},
            **_scores(path, manifest, "test", beam, alpha)}


def main() -> int:
    """Train within the budget, evaluate on test_2016_flickr, print and save JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-min", type=float, default=90.0, help="training wall-clock budget in minutes")
    parser.add_argument("--data-dir", default=os.environ.get("NMT_MULTI30K_DIR",
                                                             str(ROOT.parent / "shared/data/multi30k")))
    parser.add_argument("--config", default=str(ROOT / "configs/multi30k_en_de.yaml"))
    parser.add_argument("--workdir", default=str(ROOT / "benchmarks/.multi30k"), help="data, checkpoints, MLflow store")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/multi30k_quality.json"))
    parser.add_argument("--plot", default=str(ROOT / "benchmarks/multi30k_quality.png"))
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="beam sizes tried on validation")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.6, 1.0],
                        help="length penalties tried on validation")
    args = parser.parse_args()
    log.setup()  # the run's progress lines (steps, loss, tokens/s, ETA), as `nmt train` prints them

    work = Path(args.workdir).resolve()
    cfg = load_config(args.config, [
        f"data.path={args.data_dir}", f"data.output_dir={work / 'data'}", f"train.storage_path={work / 'runs'}",
        f"train.time_budget_s={args.budget_min * 60}", "train.epochs=1000",
        f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}", "tracking.experiment=multi30k-quality",
        *args.overrides,
    ])
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    outcome = train(cfg, config_file=args.config)
    wall = time.perf_counter() - started
    uri = resolve(cfg.tracking.tracking_uri).uri
    history = {k: tracking.Run(uri, outcome.run_id).metric_history(k)
               for k in ("train_loss", "val_loss", "val_bleu", "val_seconds", "tokens_per_s", "train_seconds")}
    kept = _checkpoints(Path(outcome.storage_path) / outcome.run_name)
    final = [c for c in kept if "averaged" not in c][-1]
    averaged = [c for c in kept if "averaged" in c]
    training = max(v for _, v in history["train_seconds"])
    validating = sum(v for _, v in history["val_seconds"])
    model = final["model_config"]
    result = {
        "config": args.config, "overrides": args.overrides, "model": model,
        "recipe": {k: getattr(cfg.train, k) for k in ("max_tokens", "update_freq", "warmup_steps", "lr_scale",
                                                      "label_smoothing", "average_last", "val_interval")},
        "budget_min": args.budget_min, "wall_min": round(wall / 60, 1),
        "train_min": round(training / 60, 1),
        # Validations run inside the training time (beam search over the validation split).
        "validation_min": round(validating / 60, 1),
        "validation_share": round(validating / training, 3),
        "updates": final["step"], "epochs": final["epoch"],
        "tokens_per_s": round(sum(v for _, v in history["tokens_per_s"]) / max(len(history["tokens_per_s"]), 1)),
        "parameters": Translator.from_checkpoint(final["path"], outcome.manifest.tokenizer()).model.num_parameters(),
        "workers": cfg.train.num_workers, "validation_beam": cfg.train.val_beam_size or cfg.train.beam_size,
        "final": {"val_bleu": final["val_bleu"], **_evaluate(final["path"], outcome.manifest, args.beams, args.alphas)},
    }
    if averaged:
        result["averaged"] = {"checkpoints": averaged[-1]["averaged"], "val_bleu": averaged[-1]["val_bleu"],
                              **_evaluate(averaged[-1]["path"], outcome.manifest, args.beams, args.alphas)}
    result["val_bleu_curve"] = [(s, round(v, 2)) for s, v in history["val_bleu"]]
    result["val_seconds_curve"] = [(s, round(v, 1)) for s, v in history["val_seconds"]]
    figure = learning_curves(history, f"Multi30k en-de, d_model {model['d_model']}, {model['num_encoder_layers']}"
                                      f"+{model['num_decoder_layers']} layers, {model['num_heads']} heads, "
                                      f"{cfg.train.num_workers} {'GPU' if cfg.train.use_gpu else 'CPU'} workers")
    figure.savefig(args.plot, dpi=110)
    text = json.dumps(result, indent=1, default=str)
    Path(args.out).write_text(text + "\n")
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
