"""The training driver: prepared data -> TorchTrainer(ScalingConfig, RunConfig) -> one MLflow run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import checkpoint, tracking
from .config import Config
from .data import Manifest, prepare
from .distributed import TRAIN_COLUMNS
from .errors import UserError


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
    settings = {k: v for k, v in cfg.to_dict().items() if k in ("data", "model", "train")}
    settings["train"] = {k: v for k, v in settings["train"].items() if k != "run_name"}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return f"train-{digest}"


def check_capacity(cfg: Config, wait_s: float) -> None:
    """Fail within wait_s, naming what is missing, when the cluster cannot place the workers."""
    import ray

    train = cfg.train
    need_cpu, need_gpu = train.num_workers * train.cpus_per_worker, train.num_workers * int(train.use_gpu)
    deadline = time.monotonic() + wait_s
    while True:
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        total_cpu = sum(n.get("CPU", 0) for n in nodes)
        total_gpu = sum(n.get("GPU", 0) for n in nodes)
        largest_cpu = max((n.get("CPU", 0) for n in nodes), default=0)
        fits = total_cpu >= need_cpu and total_gpu >= need_gpu and largest_cpu >= train.cpus_per_worker
        if fits:
            return
        if time.monotonic() >= deadline:  # an autoscaler had its chance to add nodes
            raise UserError(
                f"the cluster cannot fit {train.num_workers} training workers x {train.cpus_per_worker} CPU"
                f"{' + 1 GPU' if train.use_gpu else ''}: it has {total_cpu:g} CPUs, {total_gpu:g} GPUs, at most "
                f"{largest_cpu:g} CPUs on one node; lower train.num_workers / train.cpus_per_worker "
                f"or add nodes"
            )
        time.sleep(1.0)


def train_dataset(manifest: Manifest):
    """The train split as a materialized Ray Dataset of the columns workers read.

    Materialized up front (once per sweep, not per trial): training workers may hold every CPU
    of the cluster, and a lazy read would then wait forever for a CPU to run its read tasks on.
    """
    import ray.data

    return ray.data.read_parquet(manifest.split_dir("train")).select_columns(TRAIN_COLUMNS).materialize()


def build_trainer(cfg: Config, manifest: Manifest, run_name: str, storage_path: str,
                  callbacks: list | None = None, train_data=None):
    """A TorchTrainer for cfg: the single code path of `nmt train` and of every Tune trial."""
    # Ray Train gives workers 60 s to start; importing torch on a loaded machine can take longer,
    # and a timed-out attempt can leave its placement group behind for the retry to wait on.
    # Ray propagates this variable from the process calling fit() to the controller.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from .train_loop import train_loop

    train = cfg.train
    scaling = ScalingConfig(
        num_workers=train.num_workers, use_gpu=train.use_gpu,
        resources_per_worker={"CPU": train.cpus_per_worker, **({"GPU": 1} if train.use_gpu else {})},
        placement_strategy=train.placement_strategy,
    )
    run_config = RunConfig(
        name=run_name, storage_path=storage_path,
        failure_config=FailureConfig(max_failures=train.max_failures),
        # The best K by val_bleu; Ray Train also keeps the latest one, which resume needs.
        checkpoint_config=CheckpointConfig(num_to_keep=train.keep_checkpoints,
                                           checkpoint_score_attribute="val_bleu", checkpoint_score_order="max"),
        callbacks=callbacks or [],
        logging_config=LoggingConfig(log_level="WARNING"),  # our own progress lines say enough
    )
    return TorchTrainer(train_loop, train_loop_config={"config": cfg.to_dict(), "data_path": manifest.path},
                        scaling_config=scaling, run_config=run_config,
                        datasets={"train": train_data if train_data is not None else train_dataset(manifest)})


def _storage_path(cfg: Config) -> str:
    path = cfg.train.storage_path
    return path if "://" in path else str(Path(path).resolve())


def train(cfg: Config, address: str | None = None, config_file: str | None = None) -> TrainOutcome:
    """Prepare (or reuse) the data, train on Ray Train, track everything in one MLflow run."""
    from .cluster import ensure_ray

    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    tracking.check_reachable(uri)
    ensure_ray(address)
    check_capacity(cfg, cfg.train.resource_wait_s)
    manifest = prepare(cfg.data, address=address)
    run_name = cfg.train.run_name or default_run_name(cfg)
    storage_path = _storage_path(cfg)
    tags = {"git_commit": tracking.git_commit(), "data_manifest": manifest.sha256,
            "tokenizer_sha256": manifest.content["tokenizer"]["sha256"]}
    run_id = tracking.start_run(uri, cfg.tracking.experiment, run_name, cfg.flat(), tags)
    print(f"[train] run {run_name} (MLflow run {run_id}, storage {storage_path}/{run_name})",
          file=sys.stderr, flush=True)
    _log_inputs(uri, run_id, cfg, manifest, config_file)

    trainer = build_trainer(cfg, manifest, run_name, storage_path,
                            callbacks=[tracking.report_callback(uri, run_id)])
    handler = signal.getsignal(signal.SIGINT)
    try:
        try:
            result = trainer.fit()
        except SystemExit:  # Ray Train's Ctrl-C handler aborts the run, then exits: it was an interrupt
            raise KeyboardInterrupt from None
    except BaseException as err:  # Ctrl-C marks the run KILLED; a rerun of the command resumes it
        tracking.end_run(uri, run_id, status="KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    finally:  # Ray Train's handler outlives fit(); a later Ctrl-C (while publishing) would exit 0
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
    best = _best_checkpoint(result)
    metrics = best[1] if best else dict(result.metrics or {})
    registered = None
    if best:
        registered = publish(cfg, uri, run_id, best[0], metrics, manifest, register=cfg.tracking.register)
    tracking.end_run(uri, run_id, tags={"best_val_bleu": f"{metrics.get('val_bleu', float('nan')):.2f}",
                                        "best_checkpoint": best[0].path if best else ""})
    return TrainOutcome(run_name, run_id, metrics, best[0].path if best else None, storage_path, manifest,
                        registered)


def publish(cfg: Config, uri: str, run_id: str, checkpoint, metrics: dict, manifest: Manifest,
            register: bool = True):
    """Pictures and sample translations for the run, then (optionally) a registered model version.

    Done once per run: a rerun of a finished run finds its version and adds nothing.
    """
    from . import registry
    from .run_report import log_run_report, validation_sample
    from .translator import Translator

    name = cfg.tracking.registered_model
    existing = registry.version_of_run(uri, name, run_id)
    if existing:
        print(f"[train] run already registered as {name} version {existing}", file=sys.stderr, flush=True)
        return None
    with checkpoint.as_directory() as directory:
        translator = Translator.from_checkpoint(directory, manifest.tokenizer(), beam_size=cfg.train.beam_size,
                                                alpha=cfg.train.length_penalty)
    log_run_report(uri, run_id, translator, manifest, title=cfg.tracking.experiment)
    if not register:
        return None
    tags = {"data_manifest": manifest.sha256, "git_commit": tracking.git_commit(), "data_path": manifest.path}
    return registry.register(uri, run_id, translator, name, float(metrics["val_bleu"]), tags,
                             example=validation_sample(manifest, 1)[0][0])


def _best_checkpoint(result) -> tuple[Any, dict] | None:
    """The kept checkpoint with the highest val_bleu (the averaged one if it won) that still loads."""
    scored = [(c, m) for c, m in (result.best_checkpoints or []) if "val_bleu" in m]
    for candidate, metrics in sorted(scored, key=lambda cm: cm[1]["val_bleu"], reverse=True):
        try:
            with candidate.as_directory() as directory:
                checkpoint.load(directory)
        except UserError as err:  # damaged after it was reported: the next best one is published instead
            print(f"[train] warning: {err}; publishing the next best checkpoint", file=sys.stderr, flush=True)
            continue
        return candidate, metrics
    return None


def _log_inputs(uri: str, run_id: str, cfg: Config, manifest: Manifest, config_file: str | None) -> None:
    """The resolved config (and the file it came from) and the tokenizer, as run artifacts."""
    with tempfile.TemporaryDirectory() as tmp:
        resolved = Path(tmp) / "config.resolved.yaml"
        resolved.write_text(tracking.redact(yaml.safe_dump(cfg.to_dict(), sort_keys=False)))
        tok_dir = Path(tmp) / "tokenizer"
        tok_dir.mkdir()
        manifest.tokenizer().save(tok_dir)
        manifest_file = Path(tmp) / "manifest.json"
        manifest_file.write_text(json.dumps(manifest.content, indent=2))
        paths: list[str | Path] = [resolved, manifest_file]
        if config_file and os.path.isfile(config_file):  # a copy, with any password in a URI redacted
            paths.append(Path(tmp) / Path(config_file).name)
            paths[-1].write_text(tracking.redact(Path(config_file).read_text(encoding="utf-8")))
        tracking.log_artifacts(uri, run_id, paths)
        tracking.log_artifacts(uri, run_id, sorted(tok_dir.iterdir()), artifact_path="tokenizer")
