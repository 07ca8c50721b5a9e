"""Text in, text out: a trained Transformer with its SentencePiece tokenizer.

Imports only torch, sentencepiece, safetensors and `model`, because the packaged MLflow
model ships this file and must load where neither Ray nor this repo is installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from model import Transformer, TransformerConfig, beam_search, greedy_search

from ..common.devices import resolve_device
from .tokenizer import PAD_ID, Tokenizer

WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "model_config.json"
DECODING_FILE = "decoding.json"  # the beam size and length penalty the model was validated with


class SourceTooLong(ValueError):
    """A source with more tokens than the model has positions: the caller's input, not a fault of the model."""


def write_decoding(directory: Path, beam_size: int, alpha: float) -> Path:
    """The decoding settings as JSON beside a model's files, so every engine decodes as validation did."""
    path = Path(directory) / DECODING_FILE
    path.write_text(json.dumps({"beam_size": beam_size, "length_penalty": alpha}, indent=2))
    return path


def read_decoding(directory: Path) -> dict:
    """{beam_size, alpha} stored with a model; {} for files written before settings were stored."""
    path = Path(directory) / DECODING_FILE
    if not path.is_file():
        return {}
    stored = json.loads(path.read_text())
    return {"beam_size": int(stored["beam_size"]), "alpha": float(stored["length_penalty"])}


@torch.no_grad()
def translate_ids(model: Transformer, sources: Sequence[Sequence[int]], beam_size: int = 4,
                  alpha: float = 0.6, max_tokens: int = 8000, max_len: int | None = None) -> list[list[int]]:
    """Decode source id lists in length-sorted batches of about max_tokens source tokens; input order kept."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    # An empty source has nothing to attend to (its softmax would be all -inf): it translates to nothing.
    order = sorted((i for i in range(len(sources)) if len(sources[i])), key=lambda i: len(sources[i]))
    if order and len(sources[order[-1]]) > model.cfg.max_positions:
        raise SourceTooLong(f"a source of {len(sources[order[-1]])} tokens is longer than the model's "
                            f"{model.cfg.max_positions} positions")
    outputs: list[list[int]] = [[] for _ in sources]
    start = 0
    while start < len(order):
        longest = max(1, len(sources[order[start]]))
        end = start + 1
        while end < len(order) and (end - start + 1) * max(longest, len(sources[order[end]])) <= max_tokens:
            longest = max(longest, len(sources[order[end]]))
            end += 1
        chunk = order[start:end]
        width = max(1, max(len(sources[i]) for i in chunk))
        src = torch.full((len(chunk), width), PAD_ID, dtype=torch.long)
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.as_tensor(list(sources[i]), dtype=torch.long)
        src = src.to(device)
        if beam_size == 1:
            hyps = greedy_search(model, src, max_len=max_len)
        else:
            hyps = beam_search(model, src, beam_size=beam_size, alpha=alpha, max_len=max_len)
        for i, hyp in zip(chunk, hyps):
            outputs[i] = hyp
        start = end
    model.train(was_training)
    return outputs


class Translator:
    """A model and its tokenizer on a device; translate() batches, decodes with beam search and detokenizes."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, beam_size: int = 4, alpha: float = 0.6,
                 device: str = "auto"):
        self.device = resolve_device(device)
        self.model, self.tokenizer = model.to(self.device).eval(), tokenizer
        self.beam_size, self.alpha = beam_size, alpha

    @classmethod
    def from_state(cls, state_dict: dict[str, torch.Tensor], config: TransformerConfig, tokenizer: Tokenizer,
                   **options) -> Translator:
        """A translator from weights already in memory (a checkpoint's, or an average of several)."""
        model = Transformer(config)
        model.load_state_dict(state_dict)
        return cls(model, tokenizer, **options)

    @classmethod
    def from_checkpoint(cls, directory: str | Path, tokenizer: Tokenizer, **options) -> Translator:
        """A translator from a training checkpoint directory (weights_only loading)."""
        from ..common import checkpoint

        state = checkpoint.load(directory)  # onto the CPU first: a checkpoint saved on a GPU loads anywhere
        return cls.from_state(state["model"], TransformerConfig.from_dict(state["model_config"]), tokenizer,
                              **options)

    @classmethod
    def from_files(cls, directory: str | Path, **options) -> Translator:
        """A translator from save()'s files: safetensors weights, a JSON config, SentencePiece model(s)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        config = TransformerConfig.from_dict(json.loads((directory / CONFIG_FILE).read_text()))
        options = {**read_decoding(directory), **options}
        return cls.from_state(load_file(directory / WEIGHTS_FILE), config, Tokenizer.load(directory), **options)

    def save(self, directory: str | Path) -> list[Path]:
        """Write the weights (safetensors: no pickle), the config and decoding settings (JSON) and the tokenizer."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # Tied embeddings share storage, which safetensors refuses; clone each tensor on its own.
        weights = {k: v.detach().cpu().clone().contiguous() for k, v in self.model.state_dict().items()}
        save_file(weights, directory / WEIGHTS_FILE)
        (directory / CONFIG_FILE).write_text(json.dumps(self.model.cfg.to_dict(), indent=2))
        decoding = write_decoding(directory, self.beam_size, self.alpha)
        return [directory / WEIGHTS_FILE, directory / CONFIG_FILE, decoding, *self.tokenizer.save(directory)]

    def too_long(self, texts: Sequence[str]) -> list[int]:
        """Indices of the texts whose source tokens do not fit the model's positions."""
        limit = self.model.cfg.max_positions
        return [i for i, row in enumerate(self.tokenizer.encode_src(list(texts))) if len(row) > limit]

    def translate(self, texts: Sequence[str], beam_size: int | None = None, alpha: float | None = None,
                  max_len: int | None = None, batch_size: int = 64,
                  on_progress: Callable[[int, int], None] | None = None, truncate: bool = False) -> list[str]:
        """Translations of texts, in order; on_progress(done, total) after each batch.

        A source longer than the model's positions is SourceTooLong, or with truncate translated from its
        first max_positions tokens.
        """
        beam = beam_size or self.beam_size
        alpha = self.alpha if alpha is None else alpha
        out: list[str] = []
        for start in range(0, len(texts), batch_size):
            ids = self.tokenizer.encode_src(list(texts[start: start + batch_size]))
            if truncate:
                ids = [row[: self.model.cfg.max_positions] for row in ids]
            hyps = translate_ids(self.model, ids, beam_size=beam, alpha=alpha, max_len=max_len)
            out.extend(self.tokenizer.decode_tgt(hyps))
            if on_progress:
                on_progress(len(out), len(texts))
        return out
