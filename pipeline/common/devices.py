"""Which torch device a command or a model runs on: `auto` picks the GPU when torch sees one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:
    import torch

CHOICES_HELP = "auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N"


def resolve_device(setting: str = "auto") -> torch.device:
    """The device that `setting` names; a clear error for a malformed name or a GPU this machine lacks."""
    import torch  # here, not at the top: the CLI's parser imports CHOICES_HELP and stays quick to load
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(setting)
    except RuntimeError:
        raise UserError(f"device {setting!r} is not a device name: use {CHOICES_HELP}") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"device {setting!r} is not supported: use {CHOICES_HELP}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"device {setting!r} asked for, but torch {torch.__version__} sees no CUDA GPU "
                            f"(built for CUDA {torch.version.cuda or 'none: a CPU build'}); use --device cpu "
                            "or auto, or install a CUDA build of torch (see the README)")
        if device.index is not None and device.index >= count:
            raise UserError(f"device {setting!r} asked for, but this machine has {count} GPU(s): cuda:0 to "
                            f"cuda:{count - 1}")
    return device
