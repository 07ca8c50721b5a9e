"""Training checkpoints: written atomically, read with torch.load(weights_only=True), never a pickle."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import torch

from . import storage
from .errors import UserError

MODEL_FILE = "model.pt"  # model weights, optimizer, scheduler, scaler, progress (rank 0)


def rng_file(rank: int) -> str:
    """Each rank keeps its own RNG streams (dropout differs per rank) in its own file."""
    return f"rng_rank{rank}.pt"


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    storage.durable_replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """Torch (CPU and CUDA) and Python RNG states, in types that weights_only loading accepts."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: str | Path, rank: int, training_state: dict[str, Any] | None) -> None:
    """Write this rank's part of a checkpoint: its RNG, and on rank 0 the training state."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_save(rng_state(), directory / rng_file(rank))
    if training_state is not None:
        _atomic_save(training_state, directory / MODEL_FILE)


def load(directory: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The training state of a checkpoint directory, local or a storage URI; tensors and plain containers only."""
    if storage.is_uri(str(directory)):  # read whole: an object store has no file to map
        path = storage.join(str(directory), MODEL_FILE)
        source = io.BytesIO(storage.read_bytes(path)) if storage.exists(path) else None
    else:
        path = Path(directory) / MODEL_FILE
        source = path if path.is_file() else None
    if source is None:
        raise UserError(f"{directory}: not a training checkpoint (no {MODEL_FILE})")
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except Exception as err:  # a crafted pickle or a truncated file: refuse it, say which
        raise UserError(f"{path}: cannot be loaded safely ({type(err).__name__}: {str(err)[:200]})") from None


def load_rng(directory: str | Path, rank: int) -> dict[str, Any] | None:
    """This rank's RNG state in a checkpoint, if it saved one."""
    path = Path(directory) / rng_file(rank)
    return torch.load(path, weights_only=True) if path.is_file() else None
