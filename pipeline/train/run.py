"""What `nmt train` and `nmt tune` share around a fit: the start-up, the tracked MLflow run, the trainer, Ctrl-C.

    setup = prepare_run(cfg, address)              # MLflow answers, Ray is up and big enough, data prepared
    with tracked_run(setup, cfg, "nmt train", name, ...) as run:   # found again on resume; inputs logged
        trainer = build_trainer(cfg, setup.manifest, name, ...)    # the one TorchTrainer of train and tune
        with fit_interrupts():                     # Ray's Ctrl-C exit becomes KeyboardInterrupt
            result = trainer.fit()
        ...                                        # publish; run.end_tags
    # the run is FINISHED with its end_tags, KILLED on Ctrl-C, FAILED on an error
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..common import log, storage
from ..common.cluster import ensure_ray
from ..common.environment import default_for_process
from ..common.messages import LoopArgs, ParentInit
from ..config import Config
from ..data.manifest import Manifest
from ..data.prepare import prepare
from ..track import tracking
from ..track.login import redacted
from ..track.provenance import git_commit
from ..track.publish import log_inputs
from ..track.target import TrackingTarget, connect
from . import parent
from .capacity import check_capacity
from .parent import Parent


@dataclass
class RunSetup:
    """Where a run logs and writes, and the data it trains on."""

    target: TrackingTarget  # where the run logs: the tracking URI, checked to answer, and its login
    manifest: Manifest
    storage_path: str  # train.storage_path, absolute: Ray Train's storage for runs and sweeps
    parent: Parent | None = None  # train.init_from's model, when fine-tuning
    init_path: str | None = None  # where the workers read the parent's weights (under storage_path)
    # A run `mlflow run` made for this command (MLFLOW_RUN_ID where the command started): it becomes the run.
    adopt_run_id: str | None = None

    @property
    def uri(self) -> str:
        """The tracking URI (without a login)."""
        return self.target.uri

    def init(self) -> ParentInit | None:
        """What the training loop needs to start from the parent: where its weights are, what it is."""
        return ParentInit(self.init_path, self.parent.described) if self.parent else None


def prepare_run(cfg: Config, address: str | None = None, on_ray: Callable[[], None] | None = None,
                adopt_run_id: str | None = None) -> RunSetup:
    """Check MLflow, connect to Ray (then call on_ray), check the cluster fits the workers, prepare the data.

    adopt_run_id: a run `mlflow run` made for this command, which becomes its run (RunSetup.adopt_run_id).
    """
    target = connect(cfg.tracking.tracking_uri)
    cfg.tracking.experiment = cfg.tracking.experiment_for(target.username)  # what every later stage logs to
    ensure_ray(address)
    if on_ray is not None:
        on_ray()
    # A local instance nmt started has all the resources it will ever have: only a cluster is worth waiting for.
    connected = bool(address or os.environ.get("RAY_ADDRESS"))
    check_capacity(cfg.train, cfg.train.resource_wait_s if connected else 0.0)
    storage_path = storage.absolute(cfg.train.storage_path)
    if not cfg.train.init_from:
        return RunSetup(target, prepare(cfg.data, address=address), storage_path, adopt_run_id=adopt_run_id)
    # Fine-tuning: the parent's shape and vocabulary are checked before any data is prepared.
    found = parent.resolve(cfg.train.init_from, target.uri)
    parent.check_tokenizer(found, cfg.data)
    tokenizer = found.tokenizer
    vocab = tokenizer.src_vocab_size, None if tokenizer.joint else tokenizer.tgt_vocab_size
    parent.check_shape(found.config, found.described, cfg.transformer_config(*vocab))
    manifest = prepare(cfg.data, address=address, tokenizer=tokenizer)
    return RunSetup(target, manifest, storage_path, found, parent.stage(found, storage_path), adopt_run_id)


@contextlib.contextmanager
def tracked_run(setup: RunSetup, cfg: Config, source: str, name: str, params: dict, tags: dict[str, str],
                config_file: str | None, extra_files: tuple[str, ...] = ()) -> Iterator[tracking.Run]:
    """The MLflow run called `name` (the existing one when resuming) of command `source`, its inputs logged,
    for the block: FINISHED with run.end_tags when it ends, KILLED on Ctrl-C, FAILED on an error."""
    manifest = setup.manifest
    tags = {"git_commit": git_commit(), "data_manifest": manifest.sha256,
            "tokenizer_sha256": manifest.tokenizer_info.sha256, **tags}
    if setup.parent is not None:  # a fine-tuned run names the model it started from
        tags.update({"parent_model": setup.parent.described, "init_from": setup.parent.spec})
    with tracking.mlflow_run(setup.uri, cfg.tracking.experiment, name, params, tags, source=source,
                             adopt_run_id=setup.adopt_run_id, user=setup.target.username) as run:
        log_inputs(run, cfg, manifest, config_file, extra_files)
        yield run


def build_trainer(cfg: Config, manifest: Manifest, run_name: str, storage_path: str,
                  callbacks: list | None = None, init: ParentInit | None = None):
    """A TorchTrainer for cfg: the single code path of `nmt train` and of every Tune trial.

    init (RunSetup.init()): the parent model's staged weights, when fine-tuning.
    """
    # Ray Train gives workers 60 s to start; importing torch on a loaded machine can take longer,
    # and a timed-out attempt can leave its placement group behind for the retry to wait on.
    # Ray propagates this variable from the process calling fit() to the controller.
    default_for_process({"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "600"})
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
    loop_config = redacted(LoopArgs(cfg.to_dict(), manifest.path, log.level(), uuid.uuid4().hex, init).to_dict())
    return TorchTrainer(train_loop, train_loop_config=loop_config,
                        scaling_config=scaling, run_config=run_config)


@contextlib.contextmanager
def fit_interrupts():
    """Around Trainer.fit() or Tuner.fit(): Ray Train's Ctrl-C exit becomes KeyboardInterrupt (the run: KILLED).

    Yields the SIGINT handler from before the fit (a sweep compares it to tell Ctrl-C from the end) and puts
    it back after: Ray Train's handler outlives fit(), and a later Ctrl-C (while publishing) would exit 0.
    """
    handler = signal.getsignal(signal.SIGINT)
    try:
        yield handler
    except SystemExit:  # Ray Train's Ctrl-C handler aborts the run, then exits: it was an interrupt
        raise KeyboardInterrupt from None
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
