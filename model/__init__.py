"""The Transformer of "Attention Is All You Need" in pure PyTorch (no Ray, no MLflow)."""

from .config import PRESETS, TransformerConfig
from .decoding import beam_search, greedy_search, length_penalty
from .training import (
    average_checkpoints,
    cooldown_factor,
    label_smoothed_cross_entropy,
    transformer_lr,
    warmup_schedule,
)
from .transformer import DecoderState, Transformer

__all__ = [
    "PRESETS",
    "DecoderState",
    "Transformer",
    "TransformerConfig",
    "average_checkpoints",
    "beam_search",
    "cooldown_factor",
    "greedy_search",
    "label_smoothed_cross_entropy",
    "length_penalty",
    "transformer_lr",
    "warmup_schedule",
]
