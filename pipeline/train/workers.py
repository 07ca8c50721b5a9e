"""What a training worker needs from its launcher, behind one small interface: Ray Train or torchrun.

The worker loop (loop.py) sees only a WorkerContext: its rank, its device, its shard of
the training data, a way to wrap the model for DDP, and report(). RayContext supplies them
from Ray Train; TorchrunContext from torchrun's environment, so the same loop runs on a GPU
machine that has torch but no Ray. Either way each rank reads its own rows of the prepared
Parquet files from storage: no Ray Dataset in between, so a run starts no dataset actors and
the driver never holds the corpus.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..common import storage
from ..common.devices import resolve_device
from .shard import TokenShard


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under DDP and torch.compile wrappers (the one place that unwraps)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def all_reduce_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a device tensor over ranks in place, without a host sync (a no-op on one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def all_reduce_max(values: list[int], device: torch.device) -> list[int]:
    """Element-wise maximum over ranks (values themselves on one process)."""
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def all_gather_objects(obj: object) -> list[object]:
    """Every rank's obj, in rank order (a one-item list on one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


class WorkerContext(abc.ABC):
    """The launcher-specific services of one training worker."""

    world_rank: int = 0
    world_size: int = 1
    node: str = "node-0"  # a short name of this worker's node, as metric names show it
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that saves checkpoints and prints progress (the one gate)."""
        return self.world_rank == 0

    def train_shard(self, data_path: str) -> TokenShard:
        """This rank's training examples as flat arrays, in corpus order, read from the prepared data's storage."""
        from ..data.manifest import load_manifest

        return TokenShard.read(load_manifest(data_path).split_dir("train"), self.world_rank, self.world_size)

    @abc.abstractmethod
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move the model to this worker's device and wrap it for data parallelism."""

    @abc.abstractmethod
    def resume_candidates(self) -> Iterator[str]:
        """Local directories of this run's checkpoints, newest first: the later ones are fallbacks."""

    @abc.abstractmethod
    def report(self, metrics: dict, checkpoint_dir: str | None = None) -> None:
        """Publish metrics (and a checkpoint directory written by this rank); all ranks must call it."""

    def preemption_notice(self):
        """Ray Train's PreemptionInfo (deadline_ms, preempted ranks) once a worker's node is being drained for
        preemption, else None; all ranks must ask at the same updates. Only Ray tells of one."""
        return None


class RayContext(WorkerContext):
    """Ray Train supplies the process group, the device, checkpoints and report()."""

    def __init__(self):
        import logging

        import ray.train
        import ray.train.torch

        from ..common.compat import ray_train_report_logger

        # Ray Train logs every report's full metrics dict at INFO; our own progress line says it better.
        logging.getLogger(ray_train_report_logger()).setLevel(logging.WARNING)
        context = ray.train.get_context()
        self.world_rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.node = f"node-{ray.get_runtime_context().get_node_id()[:8]}"  # as the Ray dashboard shows nodes
        self.device = ray.train.torch.get_device()
        self._restored: tempfile.TemporaryDirectory | None = None  # the checkpoint being restored

    def prepare_model(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def resume_candidates(self) -> Iterator[str]:
        import ray.train

        latest = ray.train.get_checkpoint()
        if latest is None:
            return
        yield self._download(latest)
        # Asked for only when the latest cannot be loaded: the others Ray Train still keeps.
        older = [r for r in ray.train.get_all_reported_checkpoints() if r.checkpoint.path != latest.path]
        for reported in sorted(older, key=lambda r: r.metrics.get("step", -1), reverse=True):
            yield self._download(reported.checkpoint)

    def _download(self, checkpoint) -> str:
        storage.remove_stale(tempfile.gettempdir(), "nmt-restore-")  # what killed workers on this node left
        # The previous one is deleted; named for this process, so that a later worker removes it if this one dies.
        self._restored = tempfile.TemporaryDirectory(prefix=f"nmt-restore-{storage.owner()}-")
        return checkpoint.to_directory(self._restored.name)

    def preemption_notice(self):
        import ray.train

        return ray.train.get_preemption_info()

    def report(self, metrics: dict, checkpoint_dir: str | None = None) -> None:
        import ray.train

        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        try:
            ray.train.report(metrics, checkpoint=checkpoint)
        finally:  # uploaded to storage by now, or never will be
            if checkpoint_dir:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)


class TorchrunContext(WorkerContext):
    """torchrun (or a single plain process): env:// process group, local checkpoints."""

    def __init__(self, checkpoint_root: str, device: str = "auto"):
        self.world_rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.node = os.environ.get("HOSTNAME") or os.uname().nodename
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", local_rank)  # one GPU per process, as torchrun starts them
            torch.cuda.set_device(self.device)
        if "MASTER_ADDR" in os.environ and not dist.is_initialized():  # under torchrun, even at world size 1
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self.checkpoint_root = Path(checkpoint_root)
        self._reports = 0

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        if dist.is_initialized():
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return model

    def resume_candidates(self) -> Iterator[str]:
        found = sorted((p for p in self.checkpoint_root.glob("checkpoint_*") if p.is_dir()), reverse=True)
        yield from map(str, found)

    def report(self, metrics: dict, checkpoint_dir: str | None = None) -> None:
        if checkpoint_dir:
            target = self.checkpoint_root / f"checkpoint_{metrics.get('step', self._reports):09d}"
            target.mkdir(parents=True, exist_ok=True)
            for item in Path(checkpoint_dir).iterdir():  # ranks write distinct files
                shutil.move(str(item), target / item.name)
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        if dist.is_initialized():
            dist.barrier()  # the same barrier semantics as ray.train.report
        if self.is_main:
            print(json.dumps({"report": self._reports, **metrics}), file=sys.stderr, flush=True)
        self._reports += 1
