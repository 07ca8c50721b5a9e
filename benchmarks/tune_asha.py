"""ASHA's compute against running every trial to completion, on a heads x layers x warmup grid, in one run.

    python benchmarks/tune_asha.py [--steps 1000] [--grace 0] [--reduction 4]

Runs the same grid (heads {2, 4} x layers {1, 2} x warmup {100, 200} of the demo model, 8 trials
of 2-worker Ray Train runs on a 20k-pair demo corpus, 2x2048-token batches) twice: FIFO (every
trial trains all --steps updates) and ASHA on val_bleu. As in real use, warmup is at most a fifth
of a trial, and ASHA's first rung falls where the longest warmup ends (the sweep's own rule;
--grace overrides it), so no trial is judged while its learning rate is still rising. Prints
JSON: optimizer updates each sweep spent, their ratio, the best val_bleu of the full sweep, that
of the config ASHA picked when trained to completion (target: within 1 BLEU, for at most half
the updates), the rung, and every trial's val_bleu history. About 40 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.config import load_config  # noqa: E402
from pipeline.track import tracking  # noqa: E402
from pipeline.tune.search_space import load_space  # noqa: E402
from pipeline.tune.sweep import first_rung, sweep  # noqa: E402

SPACE = ("model.num_heads: {grid: [2, 4]}\nmodel.num_layers: {grid: [1, 2]}\n"
         "train.warmup_steps: {grid: [100, 200]}\n")


def histories(uri: str, outcome) -> list:
    """[params, [[update, val_bleu], ...]] for each trial of a sweep, from its MLflow run."""
    return [[t["params"], [[step, round(bleu, 2)] for step, bleu in
                           tracking.Run(uri, t["run_id"]).metric_history("val_bleu")]] for t in outcome.trials]


def main() -> int:
    """Both sweeps, then the comparison as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="updates per full trial")
    parser.add_argument("--grace", type=int, default=0,
                        help="ASHA's first rung, in updates (default: the longest warmup, as sweeps do)")
    parser.add_argument("--val-interval", type=int, default=100, help="updates between validations")
    parser.add_argument("--reduction", type=int, default=4, help="ASHA's reduction factor")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tune-asha-"))
    (work / "space.yaml").write_text(SPACE)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    common = ["data.demo_sizes={train: 20000, validation: 300, test: 300}", "train.beam_size=1", "train.epochs=100",
              "train.max_tokens=2048", f"train.max_steps={args.steps}", f"train.val_interval={args.val_interval}",
              "train.average_last=1",
              "tune.search=grid", f"tune.grace_period={args.grace}",
              f"tune.reduction_factor={args.reduction}", "tracking.register=false",
              f"data.output_dir={work / 'data'}", f"train.storage_path={work / 'runs'}",
              f"tracking.tracking_uri={uri}"]
    results = {}
    for scheduler in ("fifo", "asha"):
        cfg = load_config(ROOT / "configs/demo.yaml", [*common, f"tune.scheduler={scheduler}",
                                                        f"tune.name=bench-{scheduler}"])
        started = time.perf_counter()
        outcome = sweep(cfg, str(work / "space.yaml"))
        results[scheduler] = {"outcome": outcome, "minutes": (time.perf_counter() - started) / 60}
    fifo, asha = results["fifo"]["outcome"], results["asha"]["outcome"]
    full = {json.dumps(t["params"], sort_keys=True): t["val_bleu"] for t in fifo.trials}
    best_full = max(full.values())
    picked = full[json.dumps(asha.best["params"], sort_keys=True)]
    updates = {name: sum(t["steps"] for t in r["outcome"].trials) for name, r in results.items()}
    ratio = updates["asha"] / updates["fifo"]
    print(json.dumps({
        "trials": len(fifo.trials), "updates_per_full_trial": args.steps,
        "asha_first_rung": first_rung(cfg, load_space(work / "space.yaml", cfg)),
        "asha_reduction_factor": args.reduction,
        "fifo_updates": updates["fifo"], "asha_updates": updates["asha"], "asha_over_fifo_updates": round(ratio, 3),
        "fifo_minutes": round(results["fifo"]["minutes"], 1), "asha_minutes": round(results["asha"]["minutes"], 1),
        "best_val_bleu_full": round(best_full, 2), "asha_pick": asha.best["params"],
        "asha_pick_val_bleu_full": round(picked, 2), "within_1_bleu": best_full - picked <= 1.0,
        "target_met": best_full - picked <= 1.0 and ratio <= 0.5,
        "stopped_early": sum(t["status"] == "STOPPED_EARLY" for t in asha.trials),
        "trials_detail": {name: [[t["params"], t["status"], t["steps"], round(t["val_bleu"], 2)]
                                 for t in r["outcome"].trials] for name, r in results.items()},
        "val_bleu_histories": {name: histories(uri, r["outcome"]) for name, r in results.items()},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
