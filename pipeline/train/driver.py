"""`nmt train`: prepared data -> TorchTrainer (run.build_trainer) -> one MLflow run -> best model published."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common import log, storage
from ..config import Config
from ..data.manifest import Manifest
from ..track import reports
from ..track.provenance import person
from ..track.publish import best_checkpoint, kept_checkpoint, publish
from .run import build_trainer, fit_interrupts, prepare_run, tracked_run

logger = log.get("train")


@dataclass
class TrainOutcome:
    """What a finished training run left behind."""

    run_name: str
    run_id: str
    metrics: dict[str, Any]  # the best checkpoint's metrics
    checkpoint_path: str | None  # the best checkpoint (by val_bleu), in storage
    storage_path: str
    manifest: Manifest
    registered: Any = None  # registry.Registered, when the run registered a model version


def default_run_name(cfg: Config, login_user: str = "") -> str:
    """A name from the person and the config: re-running the same command resumes the same run, and two people
    with the same config never adopt each other's MLflow run or Ray Train directory."""
    return f"train-{person(login_user)}-{cfg.digest(('data', 'model', 'train'), leave_out=('train.run_name',))}"


def train(cfg: Config, address: str | None = None, config_file: str | None = None,
          adopt_run_id: str | None = None) -> TrainOutcome:
    """Prepare (or reuse) the data, train on Ray Train, track everything in one MLflow run (adopt_run_id's, if
    `mlflow run` made one for this command)."""
    setup = prepare_run(cfg, address, adopt_run_id=adopt_run_id)
    run_name = cfg.train.run_name or default_run_name(cfg, setup.target.username)
    with tracked_run(setup, cfg, "nmt train", run_name, cfg.flat(), {}, config_file) as run:
        logger.info(f"run {run_name} (MLflow run {run.id}, storage {setup.storage_path}/{run_name})")
        trainer = build_trainer(cfg, setup.manifest, run_name, setup.storage_path,
                                callbacks=[reports.report_callback(run, setup.target, cfg.tracking.system_metrics_s)],
                                init=setup.init())
        with fit_interrupts():
            result = trainer.fit()
        best = best_checkpoint(result)
        metrics = best[1] if best else dict(result.metrics or {})
        registered = None
        if best:
            registered = publish(cfg, run, best[0], metrics, setup.manifest, register=cfg.tracking.register,
                                 create_model=setup.target.login is None)
        best_path = storage.with_scheme(best[0].path, setup.storage_path) if best else None  # s3://..., not bucket/...
        if best:  # the best validation as a metric too: the runs table and compare view show it
            reports.log_best(run, metrics["val_bleu"], int(metrics.get("step", 0)))
        run.end_tags.update({"best_val_bleu": f"{metrics.get('val_bleu', float('nan')):.2f}",
                             "best_checkpoint": best_path or ""})
        if "averaged" in metrics:  # the loop's own figure, a tag rather than a metric chart
            run.end_tags["averaged_checkpoints"] = str(metrics["averaged"])
        if best:
            run.end_tags["kept_checkpoint"] = kept_checkpoint(metrics)
    return TrainOutcome(run_name, run.id, metrics, best_path, setup.storage_path, setup.manifest, registered)
