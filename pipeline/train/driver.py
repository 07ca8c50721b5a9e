"""`nmt train`: prepared data -> TorchTrainer(ScalingConfig, RunConfig) -> one MLflow run -> best model published."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

from ..common import log, storage
from ..config import Config
from ..data.manifest import Manifest
from ..track import reports, tracking
from ..track.publish import best_checkpoint, publish
from .run import prepare_run, start_tracked_run, tracked_fit

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


def default_run_name(cfg: Config) -> str:
    """A name derived from the config, so re-running the same command resumes the same run."""
    return f"train-{cfg.digest(('data', 'model', 'train'), leave_out=('train.run_name',))}"


def build_trainer(cfg: Config, manifest: Manifest, run_name: str, storage_path: str,
                  callbacks: list | None = None, init: dict | None = None):
    """A TorchTrainer for cfg: the single code path of `nmt train` and of every Tune trial.

    init (RunSetup.init()): the parent model's staged weights, when fine-tuning.
    """
    # Ray Train gives workers 60 s to start; importing torch on a loaded machine can take longer,
    # and a timed-out attempt can leave its placement group behind for the retry to wait on.
    # Ray propagates this variable from the process calling fit() to the controller.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from .loop import train_loop

    train = cfg.train
    # Elastic: Ray Train starts with what fits (at least min_workers) and resizes as nodes come and go.
    scaling = ScalingConfig(
        num_workers=(train.min_workers, train.num_workers) if train.elastic else train.num_workers,
        use_gpu=train.use_gpu, resources_per_worker=train.worker_bundle(),
        placement_strategy=train.placement_strategy, elastic_resize_monitor_interval_s=train.resize_interval_s,
    )
    run_config = RunConfig(
        name=run_name, storage_path=storage_path,
        # A preempted node is not a failure: its restarts count against a budget of their own.
        # Restarted before it sees the reclaimed node gone, Ray Train would count the node and wait to place a
        # worker on it: its elastic policy learns of nodes from a coordinator that refreshes every 20 s.
        failure_config=FailureConfig(max_failures=train.max_failures,
                                     max_preemption_failures=train.max_preemption_failures,
                                     preemption_grace_s=train.preemption_grace_s),
        # The best K by val_bleu; Ray Train also keeps the latest one, which resume needs.
        checkpoint_config=CheckpointConfig(num_to_keep=train.keep_checkpoints,
                                           checkpoint_score_attribute="val_bleu", checkpoint_score_order="max"),
        callbacks=callbacks or [],
        logging_config=LoggingConfig(log_level="WARNING"),  # our own progress lines say enough
    )
    # Ray's Train state API shows train_loop_config: no login of a URI in it (workers never log to MLflow).
    # attempt: this fit's id, so that a checkpoint tells the loop whether a resume is a new command's.
    loop_config = tracking.redacted({"config": cfg.to_dict(), "data_path": manifest.path, "log_level": log.level(),
                                     "init": init, "attempt": uuid.uuid4().hex})
    return TorchTrainer(train_loop, train_loop_config=loop_config,
                        scaling_config=scaling, run_config=run_config)


def train(cfg: Config, address: str | None = None, config_file: str | None = None) -> TrainOutcome:
    """Prepare (or reuse) the data, train on Ray Train, track everything in one MLflow run."""
    setup = prepare_run(cfg, address)
    run_name = cfg.train.run_name or default_run_name(cfg)
    run_id = start_tracked_run(setup, cfg, "nmt train", run_name, cfg.flat(), {}, config_file)
    logger.info(f"run {run_name} (MLflow run {run_id}, storage {setup.storage_path}/{run_name})")
    trainer = build_trainer(cfg, setup.manifest, run_name, setup.storage_path,
                            callbacks=[reports.report_callback(setup.uri, run_id, cfg.tracking.system_metrics_s)],
                            init=setup.init())
    with tracked_fit(setup.uri, run_id):
        result = trainer.fit()
    best = best_checkpoint(result)
    metrics = best[1] if best else dict(result.metrics or {})
    registered = None
    if best:
        registered = publish(cfg, setup.uri, run_id, best[0], metrics, setup.manifest, register=cfg.tracking.register)
    best_path = storage.with_scheme(best[0].path, setup.storage_path) if best else None  # s3://..., not bucket/...
    if best:  # the best validation as a metric too: the runs table and compare view show it
        reports.log_best(setup.uri, run_id, metrics["val_bleu"], int(metrics.get("step", 0)))
    tags = {"best_val_bleu": f"{metrics.get('val_bleu', float('nan')):.2f}", "best_checkpoint": best_path or ""}
    if "averaged" in metrics:  # the loop's own figure, a tag rather than a metric chart
        tags["averaged_checkpoints"] = str(metrics["averaged"])
    tracking.end_run(setup.uri, run_id, tags=tags)
    return TrainOutcome(run_name, run_id, metrics, best_path, setup.storage_path,
                        setup.manifest, registered)
