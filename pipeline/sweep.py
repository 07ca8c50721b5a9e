"""`nmt tune`: a Ray Tune sweep in which every trial is a Ray Train run, tracked as nested MLflow runs.

Trials run `run_trial`, which applies the sampled values to the base config and fits the
same TorchTrainer as `nmt train` (build_trainer), reporting to Tune through
TuneReportCallback and to the trial's MLflow child run through our own callback.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import checkpoint, storage, tracking
from .config import Config, config_from_dict
from .errors import UserError
from .search_space import apply, grid_size, load_space, to_tune
from .train import _log_inputs, _storage_path, build_trainer, check_capacity, publish, train_dataset

TRIAL_TAG = "nmt.trial_id"


@dataclass
class SweepOutcome:
    """A finished sweep: its trials (one dict each), the best one, and what was registered."""

    name: str
    parent_run_id: str
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    registered: Any
    path: str


def default_sweep_name(cfg: Config, space_text: str) -> str:
    """A name from the config and the space, so the same command finds the same sweep again."""
    settings = {k: v for k, v in cfg.to_dict().items() if k in ("data", "model", "train", "tune")}
    digest = hashlib.sha256((json.dumps(settings, sort_keys=True) + space_text).encode()).hexdigest()[:10]
    return f"tune-{digest}"


def max_concurrent(cfg: Config) -> int:
    """tune.max_concurrent_trials, else as many whole trials as the cluster's CPUs (and GPUs) hold."""
    import ray

    if cfg.tune.max_concurrent_trials:
        return cfg.tune.max_concurrent_trials
    resources = ray.cluster_resources()
    train = cfg.train
    fits = int(resources.get("CPU", 0) // (train.num_workers * train.cpus_per_worker))
    if train.use_gpu:
        fits = min(fits, int(resources.get("GPU", 0) // train.num_workers))
    return max(1, fits)


def _validation_reports():
    """TuneReportCallback for validation reports only: Tune schedules on val_bleu, progress lines go to MLflow."""
    from ray.tune.integration.ray_train import TuneReportCallback

    class ValidationReports(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            if metrics and "val_bleu" in metrics[0]:
                super().after_report(run_context, metrics, checkpoint)

    return ValidationReports()


def run_trial(params: dict[str, Any], setup: dict[str, Any], train_data=None) -> None:
    """One trial: the base config plus the sampled values, trained by the same TorchTrainer as `nmt train`."""
    from ray import tune

    from .data import load_manifest

    trial_id = tune.get_context().get_trial_id()
    cfg, problem = apply(config_from_dict(setup["base"]), params)
    uri = setup["uri"]
    child = tracking.start_run(uri, setup["experiment"], f"{setup['sweep']}-{trial_id}", cfg.flat(),
                               {TRIAL_TAG: trial_id, "nmt.kind": "trial", "nmt.sweep": setup["sweep"],
                                **{f"param.{k}": str(v) for k, v in params.items()}},
                               parent_run_id=setup["parent_run_id"])
    if problem:  # e.g. heads that do not divide d_model: a clean rejection, not a crashed trial
        tracking.end_run(uri, child, status="KILLED", tags={"rejected": problem})
        tune.report({"val_bleu": 0.0, "step": 0, "rejected": problem})
        return
    trainer = build_trainer(cfg, load_manifest(setup["data_path"]), trial_id, setup["train_storage"],
                            callbacks=[_validation_reports(), tracking.report_callback(uri, child)],
                            train_data=train_data)
    trainer.fit()
    tracking.end_run(uri, child)


def _scheduler(cfg: Config):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if cfg.tune.scheduler == "fifo":
        return FIFOScheduler()
    # time_attr "step": rungs are counted in optimizer updates, whatever the epoch size. max_t lies
    # beyond the last update, so a trial that reaches it ends on its own (checkpoint averaging,
    # a clean Train shutdown) instead of being stopped by ASHA at its final report.
    return ASHAScheduler(time_attr="step", max_t=(cfg.train.max_steps or 10**9) + 1,
                         grace_period=cfg.tune.grace_period, reduction_factor=cfg.tune.reduction_factor)


def _search(cfg: Config, space: dict) -> tuple[Any, dict, int]:
    """(search algorithm or None, param_space, num_samples) for tune.search."""
    param_space, samples = to_tune(space), cfg.tune.num_samples
    if cfg.tune.search == "grid":
        param_space = to_tune({k: ("grid", args) if name == "choice" else (name, args)
                               for k, (name, args) in space.items()})
        return None, param_space, 1 if all(n in ("choice", "grid") for n, _ in space.values()) else samples
    if cfg.tune.search == "optuna":
        try:
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise UserError("tune.search=optuna needs Optuna: pip install optuna") from None
        if grid_size(space) > 1:
            raise UserError("tune.search=optuna cannot sample grid keys; use choice instead of grid")
        return OptunaSearch(metric=cfg.tune.metric, mode=cfg.tune.mode), param_space, samples
    return None, param_space, samples


def sweep(cfg: Config, space_path: str, address: str | None = None, resume: bool | None = False,
          config_file: str | None = None) -> SweepOutcome:
    """Run (or resume) the sweep, then summarize it in the parent MLflow run and register the best model.

    resume: True continues an existing sweep, False refuses to touch one, None resumes one if it exists.
    """
    from ray import tune

    from .cluster import ensure_ray, state_api_problem
    from .data import prepare

    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    space = load_space(space_path, cfg)  # a bad space fails here, before MLflow, Ray or data
    tracking.check_reachable(uri)
    space_text = Path(space_path).read_text(encoding="utf-8")
    ensure_ray(address)
    if cfg.tune.scheduler == "asha" and (problem := state_api_problem()):
        _say(f"warning: Ray's State API is unavailable ({problem}); trials ASHA stops early may keep their CPUs "
             "and stall the sweep. Start Ray with its dashboard (the default of `ray start` and ray.init).")
    check_capacity(cfg, cfg.train.resource_wait_s)
    manifest = prepare(cfg.data, address=address)
    name = cfg.tune.name or default_sweep_name(cfg, space_text)
    storage = _storage_path(cfg)
    path = f"{storage}/{name}"
    exists = tune.Tuner.can_restore(path)
    if resume is None:
        resume = exists
    if exists and not resume:
        raise UserError(f"sweep {name} already exists at {path}: add --resume to continue it, "
                        f"or --set tune.name=NEW for a new one")
    if resume and not exists:
        raise UserError(f"no sweep to resume at {path}; run it once without --resume")
    tags = {"nmt.kind": "sweep", "git_commit": tracking.git_commit(), "data_manifest": manifest.sha256}
    parent = tracking.start_run(uri, cfg.tracking.experiment, name, {**cfg.flat(), "space": space_text}, tags)
    _say(f"sweep {name}: {len(space)} keys, MLflow parent run {parent}, results in {path}")
    _log_inputs(uri, parent, cfg, manifest, config_file)
    tracking.log_artifacts(uri, parent, [space_path])
    setup = {"base": cfg.to_dict(), "data_path": manifest.path, "uri": uri, "experiment": cfg.tracking.experiment,
             "parent_run_id": parent, "sweep": name, "train_storage": f"{path}/train"}
    # The trial function only drives its Train run, whose workers hold the CPUs: it reserves no
    # CPU (a bundle cannot be empty, so a little memory stands in).
    # Read once here: a Ray Data read inside a trial would be confined to the trial's (CPU-less) placement group.
    trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup, train_data=train_dataset(manifest)),
                                    {"cpu": 0, "memory": 2**26})
    search_alg, param_space, samples = _search(cfg, space)
    if exists:
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True, param_space=param_space)
    else:
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            tune_config=tune.TuneConfig(metric=cfg.tune.metric, mode=cfg.tune.mode, num_samples=samples,
                                        scheduler=_scheduler(cfg), search_alg=search_alg,
                                        max_concurrent_trials=max_concurrent(cfg)),
            run_config=tune.RunConfig(name=name, storage_path=storage, verbose=1),
        )
    handler = signal.getsignal(signal.SIGINT)
    try:
        results = tuner.fit()
        if _interrupted(handler):
            raise KeyboardInterrupt
    except BaseException as err:  # Ctrl-C marks the sweep KILLED; `nmt tune --resume` continues it
        tracking.end_run(uri, parent, status="KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
    trials = _summarize(uri, cfg, results, space)
    best = _best(trials, cfg.tune.mode)
    registered = None
    if best is not None:
        from ray.train import Checkpoint

        best_cfg = apply(cfg, best["params"])[0]
        registered = publish(best_cfg, uri, best["run_id"], Checkpoint(best["checkpoint_path"]),
                             {"val_bleu": best["val_bleu"]}, manifest, register=cfg.tracking.register)
    _log_summary(uri, parent, cfg, trials, best, space)
    tracking.end_run(uri, parent, tags={"best_trial": best["trial_id"] if best else "",
                                        "best_val_bleu": f"{best['val_bleu']:.2f}" if best else ""})
    return SweepOutcome(name, parent, trials, best, registered, path)


def _summarize(uri: str, cfg: Config, results, space: dict) -> list[dict[str, Any]]:
    """One row per trial: params, best val_bleu and its checkpoint, steps, status; early stops marked in MLflow."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    trials = []
    for result in results:
        history = result.metrics_dataframe
        trial_id = (result.metrics or {}).get("trial_id") or (
            str(history["trial_id"].iloc[-1]) if history is not None and "trial_id" in history else "?")
        found = client.search_runs([experiment.experiment_id], f"tags.`{TRIAL_TAG}` = '{trial_id}'", max_results=1)
        row: dict[str, Any] = {"trial_id": trial_id, "params": {k: result.config.get(k) for k in space},
                               "run_id": found[0].info.run_id if found else None, "val_bleu": float("nan"),
                               "checkpoint_path": None, "steps": 0, "status": "ERROR" if result.error else "OK"}
        if history is not None and "val_bleu" in history:
            scored = history.dropna(subset=["val_bleu"])
            if "checkpoint_path" in scored:  # only checkpoints Ray Train has kept (ties may name a deleted one)
                scored = scored.dropna(subset=["checkpoint_path"])
                scored = scored.loc[scored["checkpoint_path"].map(_kept).astype(bool)]
            if len(scored):
                top = scored.loc[scored["val_bleu"].idxmax() if cfg.tune.mode == "max" else scored["val_bleu"].idxmin()]
                row.update(val_bleu=float(top["val_bleu"]), checkpoint_path=top.get("checkpoint_path"))
            row["steps"] = int(history["step"].max()) if "step" in history else 0
            if "rejected" in history and history["rejected"].notna().any():
                row["status"] = "REJECTED"
        run = client.get_run(row["run_id"]) if row["run_id"] else None
        if run is not None and run.info.status == "RUNNING" and row["status"] == "OK":
            # Tune stopped the trial between reports: ASHA's early stop.
            row["status"] = "STOPPED_EARLY"
            tracking.end_run(uri, row["run_id"], status="KILLED", tags={"stopped_early": "asha"})
        elif run is not None and run.data.tags.get("stopped_early"):
            row["status"] = "STOPPED_EARLY"
        trials.append(row)
    return trials


def _interrupted(handler_before_fit) -> bool:
    """Whether Ctrl-C ended Tuner.fit early.

    Tune's Ctrl-C handler saves the sweep's state and makes fit() return its results as if the sweep
    were complete; it also puts back the handler it replaced, and that is the only trace it leaves.
    """
    return (threading.current_thread() is threading.main_thread()
            and os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") == "0"
            and signal.getsignal(signal.SIGINT) is handler_before_fit)


def _kept(checkpoint_path: str) -> bool:
    """Whether a reported checkpoint is still there (not removed by train.keep_checkpoints)."""
    return storage.exists(storage.join(checkpoint_path, checkpoint.MODEL_FILE))


def _best(trials: list[dict], mode: str) -> dict | None:
    scored = [t for t in trials if t["checkpoint_path"] and not math.isnan(t["val_bleu"])]
    if not scored:
        return None
    return (max if mode == "max" else min)(scored, key=lambda t: t["val_bleu"])


def _log_summary(uri: str, parent: str, cfg: Config, trials: list[dict], best: dict | None, space: dict) -> None:
    """trials.csv, best_config.yaml and val_bleu-per-hyperparameter plots in the parent run."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = {"num_trials": len(trials), "trials_stopped_early": sum(t["status"] == "STOPPED_EARLY" for t in trials),
               "trials_rejected": sum(t["status"] == "REJECTED" for t in trials)}
    if best:
        metrics["best_val_bleu"] = best["val_bleu"]
    tracking.log_metrics(uri, parent, metrics)
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
            files[-1].write_text(tracking.redact(yaml.safe_dump(apply(cfg, best["params"])[0].to_dict(),
                                                                sort_keys=False)))
        for key in space:
            fig, ax = plt.subplots(figsize=(4.5, 3.2))
            points = [(t["params"][key], t["val_bleu"]) for t in trials if not math.isnan(t["val_bleu"])]
            if points:
                xs, ys = zip(*points)
                ax.scatter([str(x) if isinstance(x, str) else x for x in xs], ys, color="tab:blue")
            ax.set(xlabel=key, ylabel="best val BLEU", title=f"val_bleu vs {key}")
            fig.tight_layout()
            files.append(Path(tmp) / f"val_bleu_vs_{key.replace('.', '_')}.png")
            fig.savefig(files[-1], dpi=100)
            plt.close(fig)
        tracking.log_artifacts(uri, parent, files)


def _say(message: str) -> None:
    print(f"[tune] {message}", file=sys.stderr, flush=True)
