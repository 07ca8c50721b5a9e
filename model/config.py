"""The model's hyperparameters: a frozen dataclass with the paper's presets (Table 3)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

POSITIONAL_ENCODINGS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer (Vaswani et al. 2017)."""

    vocab_size: int = 37_000  # shared source/target vocabulary (or the source one)
    tgt_vocab_size: int | None = None  # None: one vocabulary shared by both sides
    d_model: int = 512  # model width
    d_ff: int = 2048  # inner size of the feed-forward layers
    num_heads: int = 8  # attention heads; must divide d_model
    num_encoder_layers: int = 6  # encoder layers
    num_decoder_layers: int = 6  # decoder layers
    dropout: float = 0.1  # P_drop: sublayer outputs and embeddings + positions
    attention_dropout: float = 0.0  # dropout on attention weights; not in the paper
    label_smoothing: float = 0.1  # epsilon_ls; used by the training loss
    max_positions: int = 1024  # longest sequence the positional encoding covers
    positional_encoding: str = "sinusoidal"  # sinusoidal | learned
    norm_first: bool = False  # true: pre-norm; false: post-norm as in the paper
    tie_embeddings: bool = True  # share embeddings and pre-softmax weights (Sec. 3.4; needs a joint vocabulary)
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self) -> None:
        positive = ("vocab_size", "d_model", "d_ff", "num_heads", "num_encoder_layers",
                    "num_decoder_layers", "max_positions")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {value!r}")
        if self.tgt_vocab_size is not None and (
            not isinstance(self.tgt_vocab_size, int) or self.tgt_vocab_size <= 0
        ):
            raise ValueError(
                f"TransformerConfig.tgt_vocab_size must be a positive integer or None (shared "
                f"vocabulary), got {self.tgt_vocab_size!r}"
            )
        if self.d_model % self.num_heads:
            raise ValueError(
                f"TransformerConfig.d_model ({self.d_model}) must be divisible by num_heads "
                f"({self.num_heads}); try num_heads in {_divisors(self.d_model)}"
            )
        for name in ("dropout", "attention_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"TransformerConfig.{name} must be in [0, 1), got {value!r}")
        if self.positional_encoding not in POSITIONAL_ENCODINGS:
            raise ValueError(
                f"TransformerConfig.positional_encoding must be one of {POSITIONAL_ENCODINGS}, "
                f"got {self.positional_encoding!r}"
            )
        if self.layer_norm_eps <= 0:
            raise ValueError(f"TransformerConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        special = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id,
                   "eos_id": self.eos_id}
        smallest_vocab = min(self.vocab_size, self.tgt_vocab_size or self.vocab_size)
        for name, value in special.items():
            if not isinstance(value, int) or not 0 <= value < smallest_vocab:
                raise ValueError(
                    f"TransformerConfig.{name} must be an id in [0, {smallest_vocab}), got {value!r}"
                )
        if len(set(special.values())) != len(special):
            raise ValueError(f"TransformerConfig special ids must be distinct, got {special}")

    @property
    def shared_vocab(self) -> bool:
        """True when source and target use one vocabulary (so all three matrices can be tied)."""
        return self.tgt_vocab_size is None or self.tgt_vocab_size == self.vocab_size

    @property
    def target_vocab_size(self) -> int:
        """Size of the target vocabulary, i.e. of the logits."""
        return self.tgt_vocab_size or self.vocab_size

    @property
    def d_k(self) -> int:
        """Per-head key/value size d_k = d_v = d_model / h."""
        return self.d_model // self.num_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        """A named preset ("tiny", "base", "big") with overrides; num_layers sets both stacks."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        values = dict(PRESETS[name])
        if "num_layers" in overrides:
            num_layers = overrides.pop("num_layers")
            values["num_encoder_layers"] = values["num_decoder_layers"] = num_layers
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig field(s) {unknown}; known: {sorted(known)}")
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field, for checkpoints and JSON files."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        """Inverse of to_dict; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig field(s) {unknown}")
        return cls(**values)


def _divisors(n: int) -> list[int]:
    return [h for h in (1, 2, 4, 8, 16, 32) if n % h == 0]


# Table 3 of the paper; "tiny" is a CPU-sized model for the demo and tests.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=128, d_ff=256, num_heads=4, num_encoder_layers=2,
                 num_decoder_layers=2, dropout=0.1, label_smoothing=0.1, vocab_size=8000),
    "base": dict(d_model=512, d_ff=2048, num_heads=8, num_encoder_layers=6,
                 num_decoder_layers=6, dropout=0.1, label_smoothing=0.1, vocab_size=37_000),
    "big": dict(d_model=1024, d_ff=4096, num_heads=16, num_encoder_layers=6,
                num_decoder_layers=6, dropout=0.3, label_smoothing=0.1, vocab_size=37_000),
}
