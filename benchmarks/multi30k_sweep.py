"""A real sweep on Multi30k en->de: random search with ASHA over tune_spaces/multi30k.yaml, in about 2 CPU-hours.

    python benchmarks/multi30k_sweep.py [--samples 8] [--steps 3500] [--data-dir DIR] [--set key=value ...]

Sweeps heads, layers, dropout, warmup and the learning-rate scale around
configs/multi30k_en_de.yaml with `nmt tune`'s code path (Ray Tune, Ray Train, MLflow). Each trial
is one Ray Train worker on one CPU (2048-token batches), two trials at a time, at most --steps
updates, validated with greedy decoding every --val-interval updates. The first trial is the
shipped config itself (tune.start_with_base), so it is judged under the same budget and
scheduler as the rest. ASHA's first rung falls where the longest warmup in the space ends.

Writes to --out: trials.csv (the parent run's table), best_config.yaml (the whole config of the
best trial) and summary.json (wall time, CPU-hours, the rung, the shipped config's and the best
trial's val_bleu, every trial's val_bleu history); the parent run's val_bleu_vs_*.png go to --plots.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mlflow.artifacts  # noqa: E402

from pipeline.common import log  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.track import tracking  # noqa: E402
from pipeline.track.plots import save_sweep_plots  # noqa: E402
from pipeline.tune.search_space import base_point, load_space  # noqa: E402
from pipeline.tune.sweep import first_rung, sweep  # noqa: E402

SPACE = ROOT / "tune_spaces/multi30k.yaml"


def _history(uri: str, run_id: str | None) -> list[list[float]]:
    """[[update, val_bleu], ...] of one trial's MLflow run."""
    if not run_id:
        return []
    return [[step, round(bleu, 2)] for step, bleu in tracking.Run(uri, run_id).metric_history("val_bleu")]


def main() -> int:
    """Run the sweep, then copy its table, plots and best config out of MLflow into --out."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=8, help="trials, the shipped config's among them")
    parser.add_argument("--steps", type=int, default=3500, help="updates of a trial ASHA does not stop")
    parser.add_argument("--val-interval", type=int, default=500, help="updates between validations")
    parser.add_argument("--data-dir", default=os.environ.get("NMT_MULTI30K_DIR",
                                                             str(ROOT.parent / "shared/data/multi30k")))
    parser.add_argument("--workdir", default=str(ROOT / "benchmarks/.multi30k_sweep"),
                        help="prepared data, checkpoints and the MLflow store")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/multi30k_sweep"), help="where the results go")
    parser.add_argument("--plots", default=str(ROOT / "docs/images/multi30k_sweep"), help="where the plots go")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--replot", action="store_true", help="only draw the plots again from --out's summary.json")
    args = parser.parse_args()
    if args.replot:  # the sweep itself takes about two CPU-hours
        trials = json.loads((Path(args.out) / "summary.json").read_text())["trials_detail"]
        Path(args.plots).mkdir(parents=True, exist_ok=True)
        save_sweep_plots(load_space(SPACE, load_config(ROOT / "configs/multi30k_en_de.yaml")), trials, Path(args.plots))
        return 0
    log.setup()
    log.configure_libraries()

    work, out = Path(args.workdir).resolve(), Path(args.out).resolve()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    cfg = load_config(ROOT / "configs/multi30k_en_de.yaml", [
        f"data.path={args.data_dir}", f"data.output_dir={work / 'data'}", f"train.storage_path={work / 'runs'}",
        f"tracking.tracking_uri={uri}", "tracking.experiment=multi30k-sweep", "tracking.register=false",
        # One worker per trial, two trials at a time: both CPUs busy, and ASHA has two trials to compare early.
        "train.num_workers=1", "train.max_tokens=2048", "tune.max_concurrent_trials=2",
        f"train.max_steps={args.steps}", "train.epochs=1000", f"train.val_interval={args.val_interval}",
        # Greedy validation: a sweep ranks configs, it needs no beam's last BLEU point.
        "train.beam_size=1", "train.average_last=1", "train.keep_checkpoints=1",
        "tune.search=random", f"tune.num_samples={args.samples}", "tune.start_with_base=true",
        "tune.reduction_factor=3", "tune.name=multi30k-sweep", *args.overrides,
    ])
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    outcome = sweep(cfg, str(SPACE), resume=None)
    wall = time.perf_counter() - started

    out.mkdir(parents=True, exist_ok=True)
    artifacts = Path(mlflow.artifacts.download_artifacts(run_id=outcome.parent_run_id, tracking_uri=uri,
                                                         dst_path=str(work / "parent")))
    Path(args.plots).mkdir(parents=True, exist_ok=True)
    for name, where in (("trials.csv", out), ("best_config.yaml", out), ("val_bleu_vs_*.png", Path(args.plots))):
        for found in artifacts.rglob(name):
            shutil.copy(found, where / found.name)
    space = load_space(SPACE, cfg)
    (base,) = [t for t in outcome.trials if t["params"] == base_point(space, cfg)]  # the shipped config's trial
    summary = {
        "wall_min": round(wall / 60, 1), "cpu_hours": round(wall / 3600 * cfg.tune.max_concurrent_trials, 2),
        "machine_cpus": os.cpu_count(), "trials": len(outcome.trials), "updates_per_full_trial": args.steps,
        "asha_first_rung": first_rung(cfg, space), "asha_reduction_factor": cfg.tune.reduction_factor,
        "updates": sum(t["steps"] for t in outcome.trials),
        "stopped_early": sum(t["status"] == "STOPPED_EARLY" for t in outcome.trials),
        "shipped_config": {"params": base["params"], "val_bleu": round(base["val_bleu"], 2), "steps": base["steps"],
                           "status": base["status"]},
        "best": {"params": outcome.best["params"], "val_bleu": round(outcome.best["val_bleu"], 2),
                 "steps": outcome.best["steps"]} if outcome.best else None,
        "trials_detail": [{"params": t["params"], "status": t["status"], "steps": t["steps"],
                           "val_bleu": round(t["val_bleu"], 2), "history": _history(uri, t["run_id"])}
                          for t in outcome.trials],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "trials_detail"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
