"""A finished sweep in words and pictures: one row per trial, the best one, the table and plots in MLflow."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..common import checkpoint, log, storage
from ..config import Config
from ..track import reports, tracking
from ..track.login import redacted
from ..track.target import mlflow_client
from .search_space import apply


@dataclass
class SweepOutcome:
    """A finished sweep: its trials (one dict each), the best one, and what was registered."""

    name: str
    parent_run_id: str
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    registered: Any
    path: str


def summarize(uri: str, cfg: Config, results, space: dict) -> list[dict[str, Any]]:
    """One row per trial: params, best val_bleu and its checkpoint, steps, status; early stops marked in MLflow."""

    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    trials = []
    for result in results:
        history = result.metrics_dataframe
        trial_id = (result.metrics or {}).get("trial_id") or (
            str(history["trial_id"].iloc[-1]) if history is not None and "trial_id" in history else "?")
        found = client.search_runs([experiment.experiment_id], f"tags.`{tracking.TRIAL_TAG}` = '{trial_id}'",
                                   max_results=1)
        row: dict[str, Any] = {"trial_id": trial_id, "params": {k: result.config.get(k) for k in space},
                               "run_id": found[0].info.run_id if found else None, "val_bleu": float("nan"),
                               "checkpoint_path": None, "steps": 0, "status": "ERROR" if result.error else "OK"}
        if history is not None and "val_bleu" in history:
            scored = history.dropna(subset=["val_bleu"])
            if "checkpoint_path" in scored:  # only checkpoints Ray Train has kept (ties may name a deleted one)
                scored = scored.dropna(subset=["checkpoint_path"])
                # Tune records bucket/key for s3:// storage: the scheme back, or nothing would be found.
                scored = scored.assign(checkpoint_path=scored["checkpoint_path"].map(
                    lambda path: storage.with_scheme(str(path), cfg.train.storage_path)))
                scored = scored.loc[scored["checkpoint_path"].map(_kept).astype(bool)]
            if len(scored):
                top = scored.loc[scored["val_bleu"].idxmax() if cfg.tune.mode == "max" else scored["val_bleu"].idxmin()]
                row.update(val_bleu=float(top["val_bleu"]), checkpoint_path=top.get("checkpoint_path"),
                           best_step=int(top["step"]) if "step" in top else 0)
            row["steps"] = int(history["step"].max()) if "step" in history else 0
            if "rejected" in history and history["rejected"].notna().any():
                row["status"] = "REJECTED"
        record = client.get_run(row["run_id"]) if row["run_id"] else None
        if record is not None and record.info.status in ("RUNNING", "FAILED") and row["status"] == "OK":
            # Tune stopped the trial between reports (ASHA's early stop) and saw no error. Its run did not end
            # normally: RUNNING when Tune's stop took its actor first, FAILED when it broke the Train run first.
            # A stop by the scheduler is how a sweep works, not a failure: FINISHED, and tagged.
            row["status"] = "STOPPED_EARLY"
            tracking.Run(uri, row["run_id"]).end(tags={"stopped_early": "asha"})
        elif record is not None and record.data.tags.get("stopped_early"):
            row["status"] = "STOPPED_EARLY"
        if record is not None and not math.isnan(row["val_bleu"]):  # what the runs table should compare
            reports.log_best(tracking.Run(uri, row["run_id"]), row["val_bleu"], row.get("best_step", 0))
        trials.append(row)
    return trials


def _kept(checkpoint_path: str) -> bool:
    """Whether a reported checkpoint is still there (not removed by train.keep_checkpoints)."""
    return storage.exists(storage.join(checkpoint_path, checkpoint.MODEL_FILE))


def best_trial(trials: list[dict], mode: str) -> dict | None:
    """The trial with the best val_bleu among those with a kept checkpoint, or None."""
    scored = [t for t in trials if t["checkpoint_path"] and not math.isnan(t["val_bleu"])]
    if not scored:
        return None
    return (max if mode == "max" else min)(scored, key=lambda t: t["val_bleu"])


def log_summary(parent: tracking.Run, cfg: Config, trials: list[dict], best: dict | None, space: dict) -> None:
    """trials.csv, best_config.yaml and val_bleu-per-hyperparameter plots in the parent run."""
    import csv

    from ..track.plots import save_sweep_plots

    metrics = {"num_trials": len(trials), "trials_stopped_early": sum(t["status"] == "STOPPED_EARLY" for t in trials),
               "trials_rejected": sum(t["status"] == "REJECTED" for t in trials)}
    if best:
        metrics["best_val_bleu"] = best["val_bleu"]
    reports.log_metrics(parent, metrics)
    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / "trials.csv"]
        with open(files[0], "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["trial_id", *space, "val_bleu", "steps", "status", "champion_candidate", "mlflow_run"])
            for t in trials:
                writer.writerow([t["trial_id"], *(t["params"][k] for k in space), f"{t['val_bleu']:.2f}", t["steps"],
                                 t["status"], t is best, t["run_id"]])
        if best:
            files.append(Path(tmp) / "best_config.yaml")
            files[-1].write_text(yaml.safe_dump(redacted(apply(cfg, best["params"])[0].to_dict()), sort_keys=False))
        files += save_sweep_plots(space, trials, Path(tmp))
        parent.log_artifacts(files)


def format_trials(outcome) -> str:
    """The sweep's trials as a text table, the best one marked."""
    keys = list(outcome.trials[0]["params"]) if outcome.trials else []
    header = ["trial", *(k.split(".")[-1] for k in keys), "val_bleu", "steps", "status"]
    rows = [[t["trial_id"], *(_short(t["params"][k]) for k in keys), f"{t['val_bleu']:.2f}", str(t["steps"]),
             t["status"] + (" *best*" if t is outcome.best else "")] for t in outcome.trials]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    registered = outcome.registered
    if registered is not None:
        lines.append(f"registered {registered.name} version {registered.version}"
                     + (" (champion)" if registered.champion else " (champion unchanged)"))
    lines.append(f"sweep {outcome.name}: MLflow parent run {outcome.parent_run_id}; results in {outcome.path}")
    return "\n".join(lines)


def trial_lines(max_steps: int):
    """A Tune callback that logs one line when a trial starts and one when it ends, instead of Tune's tables."""
    from ray import tune

    logger = log.get("tune")

    def params(trial) -> str:
        return ", ".join(f"{k.split('.')[-1]} {_short(v)}" for k, v in trial.config.items())

    class TrialLines(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            logger.info(f"trial {trial.trial_id} started: {params(trial)}")

        def on_trial_complete(self, iteration, trials, trial, **info):
            result = trial.last_result or {}
            if "rejected" in result:
                logger.info(f"trial {trial.trial_id} rejected: {result['rejected']}")
                return
            step = result.get("step", 0)
            planned = trial.config.get("train.max_steps", max_steps)  # a space can set each trial's length
            early = " (stopped early)" if planned and step < planned else ""
            done = 1 + sum(t.status in ("TERMINATED", "ERROR") for t in trials if t is not trial)
            # Its best, as the trial table shows: the last report can be a weaker checkpoint average.
            best = trial.metric_analysis.get("val_bleu", {}).get("max", result.get("val_bleu", float("nan")))
            logger.info(f"trial {trial.trial_id} ended at update {step}{early}: val_bleu "
                        f"{best:.2f} ({done} finished so far)")

        def on_trial_error(self, iteration, trials, trial, **info):
            logger.warning(f"trial {trial.trial_id} failed ({params(trial)}); its error is in {trial.local_path}")

    return TrialLines()


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
