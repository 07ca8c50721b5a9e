"""The Transformer of "Attention Is All You Need" in pure PyTorch (no Ray, no MLflow).

`model.config` (the hyperparameters) needs no torch: the other names load their modules, and
torch, on first use, so a process that only reads configs (a Ray Data worker) never imports it.
"""

import importlib

from .config import PRESETS, TransformerConfig

_MODULE_OF = {
    "beam_search": "decoding", "greedy_search": "decoding", "length_penalty": "decoding",
    "average_checkpoints": "training", "cooldown_factor": "training", "label_smoothed_cross_entropy": "training",
    "transformer_lr": "training", "warmup_schedule": "training",
    "DecoderState": "transformer", "Transformer": "transformer",
}

__all__ = ["PRESETS", "TransformerConfig", *sorted(_MODULE_OF)]


def __getattr__(name: str):
    """The torch-based names, imported when first asked for."""
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
