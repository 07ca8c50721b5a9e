"""What `nmt train` and `nmt tune` share around a fit: the start-up, the tracked MLflow run, Ctrl-C.

    setup = prepare_run(cfg, address)              # MLflow answers, Ray is up and big enough, data prepared
    run_id = start_tracked_run(setup, cfg, "nmt train", name, ...)  # the MLflow run (found again on resume)
    with tracked_fit(setup.uri, run_id):           # Ctrl-C -> KILLED, an error -> FAILED
        result = trainer.fit()
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..common import storage
from ..common.cluster import ensure_ray
from ..config import Config
from ..data.manifest import Manifest
from ..data.prepare import prepare
from ..track import tracking
from ..track.publish import log_inputs
from . import parent
from .capacity import check_capacity
from .parent import Parent


@dataclass
class RunSetup:
    """Where a run logs and writes, and the data it trains on."""

    uri: str  # the MLflow tracking URI, checked to answer
    manifest: Manifest
    storage_path: str  # train.storage_path, absolute: Ray Train's storage for runs and sweeps
    parent: Parent | None = None  # train.init_from's model, when fine-tuning
    init_path: str | None = None  # where the workers read the parent's weights (under storage_path)

    def init(self) -> dict | None:
        """What the training loop needs to start from the parent: where its weights are, what it is."""
        return {"path": self.init_path, "described": self.parent.described} if self.parent else None


def prepare_run(cfg: Config, address: str | None = None, on_ray: Callable[[], None] | None = None) -> RunSetup:
    """Check MLflow, connect to Ray (then call on_ray), check the cluster fits the workers, prepare the data."""
    uri = tracking.connect(cfg.tracking.tracking_uri)
    ensure_ray(address)
    if on_ray is not None:
        on_ray()
    check_capacity(cfg.train, cfg.train.resource_wait_s)
    storage_path = storage.absolute(cfg.train.storage_path)
    if not cfg.train.init_from:
        return RunSetup(uri, prepare(cfg.data, address=address), storage_path)
    # Fine-tuning: the parent's shape and vocabulary are checked before any data is prepared.
    found = parent.resolve(cfg.train.init_from, uri)
    parent.check_tokenizer(found, cfg.data)
    tokenizer = found.tokenizer
    vocab = tokenizer.src_vocab_size, None if tokenizer.joint else tokenizer.tgt_vocab_size
    parent.check_shape(found.config, found.described, cfg.transformer_config(*vocab))
    manifest = prepare(cfg.data, address=address, tokenizer=tokenizer)
    return RunSetup(uri, manifest, storage_path, found, parent.stage(found, storage_path))


def start_tracked_run(setup: RunSetup, cfg: Config, source: str, name: str, params: dict, tags: dict[str, str],
                      config_file: str | None, extra_files: tuple[str, ...] = ()) -> str:
    """The MLflow run called `name` (the existing one when resuming) of command `source`, inputs logged."""
    manifest = setup.manifest
    tags = {"git_commit": tracking.git_commit(), "data_manifest": manifest.sha256,
            "tokenizer_sha256": manifest.content["tokenizer"]["sha256"], **tags}
    if setup.parent is not None:  # a fine-tuned run names the model it started from
        tags.update({"parent_model": setup.parent.described, "init_from": setup.parent.spec})
    # Under `mlflow run`, MLflow has made this command's run already: it becomes the run (the first
    # one only: `nmt demo` starts a sweep, then a training run).
    run_id = tracking.start_run(setup.uri, cfg.tracking.experiment, name, params, tags, source=source,
                                adopt_run_id=os.environ.pop("MLFLOW_RUN_ID", None))
    log_inputs(setup.uri, run_id, cfg, manifest, config_file, extra_files)
    return run_id


@contextlib.contextmanager
def tracked_fit(uri: str, run_id: str):
    """Around Trainer.fit() or Tuner.fit(): Ctrl-C marks the run KILLED (a rerun resumes it), an error FAILED.

    Yields the SIGINT handler from before the fit (a sweep compares it to tell Ctrl-C from the end) and puts
    it back after:
    Ray Train's handler outlives fit(), and a later Ctrl-C (while publishing) would exit 0.
    """
    handler = signal.getsignal(signal.SIGINT)
    try:
        try:
            yield handler
        except SystemExit:  # Ray Train's Ctrl-C handler aborts the run, then exits: it was an interrupt
            raise KeyboardInterrupt from None
    except BaseException as err:
        tracking.end_run(uri, run_id, status="KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
