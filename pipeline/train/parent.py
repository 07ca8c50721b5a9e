"""Fine-tuning: `train.init_from` names a parent model whose weights and tokenizer a new run starts from.

    parent = resolve(cfg.train.init_from, uri)    # a checkpoint directory, a training run id or a models:/ URI
    check_tokenizer(parent, cfg.data)             # the corpus is tokenized with the parent's tokenizer
    path = stage(parent, storage_path)            # weights where every worker can read them
    ...
    config, weights = load_staged(path)           # in each worker; optimizer and schedule start fresh
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass

import torch

from model import Transformer, TransformerConfig

from ..common import checkpoint, storage
from ..common.errors import UserError
from ..config import DataConfig
from ..text.tokenizer import JOINT_FILE, SRC_FILE, TGT_FILE, Tokenizer
from ..text.translator import CONFIG_FILE, WEIGHTS_FILE

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
# What fine-tuning may change; every other field is the model's shape, which the weights fix.
REGULARIZATION = ("dropout", "attention_dropout", "label_smoothing")


@dataclass
class Parent:
    """A model to start from: its weights, shape and tokenizer, and what it is in words."""

    spec: str  # train.init_from as the user wrote it
    described: str  # e.g. "transformer-nmt-demo-en-de version 3 (run 1f2e...)"
    config: TransformerConfig
    tokenizer: Tokenizer
    weights: dict[str, torch.Tensor]


def resolve(spec: str, uri: str) -> Parent:
    """The parent that train.init_from names: a models:/ URI, a training run id, or a checkpoint directory."""
    if spec.startswith("models:/"):
        from ..track.registry import model_version

        version = model_version(uri, spec)
        described = f"{version.name} version {version.version} (run {version.run_id})" if version else spec
        return _from_registry(spec, spec, described, uri)
    if RUN_ID.match(spec):
        return _from_registry(spec, f"runs:/{spec}/model", f"run {spec}", uri)
    return _from_checkpoint(spec)


def _from_registry(spec: str, model_uri: str, described: str, uri: str) -> Parent:
    """A packaged model (what `nmt train` logs and registers): its weights, config and tokenizer files, read
    as they are (no model is built, no code stored with the model runs)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    from ..track.registry import TRANSLATOR_FILES, translator_files
    from ..track.tracking import error_line

    try:
        with translator_files(uri, model_uri) as files:
            config = TransformerConfig.from_dict(json.loads((files / CONFIG_FILE).read_text()))
            weights = load((files / WEIGHTS_FILE).read_bytes())  # in memory, not a map of a file about to go
            check_weights(config, weights)
            return Parent(spec, described, config, Tokenizer.load(files), weights)
    except UserError as err:
        raise UserError(f"train.init_from={spec!r}: {err}") from None
    except (ValueError, TypeError, KeyError, RuntimeError, SafetensorError) as err:
        raise UserError(f"train.init_from={spec!r}: the {TRANSLATOR_FILES}/ files of {model_uri!r} do not make a "
                        f"model: {error_line(err)}") from None


def check_weights(config: TransformerConfig, weights: dict[str, torch.Tensor]) -> None:
    """The weights are those of the config's model, name by name and shape by shape (checked without memory)."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(config).state_dict().items()}
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if found != expected:
        wrong = sorted(set(found) ^ set(expected)) or [k for k in expected if found[k] != expected[k]]
        raise ValueError(f"the weights do not fit model_config.json: {wrong[0]} "
                         f"({found.get(wrong[0])} in the weights, {expected.get(wrong[0])} in the model)")


def _from_checkpoint(spec: str) -> Parent:
    """A training checkpoint directory (a local path or a storage URI) with its tokenizer files."""
    if not storage.exists(storage.join(spec, checkpoint.MODEL_FILE)):
        raise UserError(f"train.init_from={spec!r} is not a models:/ URI, an MLflow run id (32 hex digits) "
                        f"or a training checkpoint directory (no {checkpoint.MODEL_FILE} there)")
    state = checkpoint.load(spec)
    files = {name: storage.read_bytes(path) for name in (JOINT_FILE, SRC_FILE, TGT_FILE)
             if storage.exists(path := storage.join(spec, name))}
    try:
        tokenizer = Tokenizer.from_files(files, spec)
    except UserError:
        raise UserError(f"train.init_from={spec!r}: the checkpoint holds no tokenizer (written by an older "
                        "version); start from the run's registered model (models:/NAME/VERSION) instead") from None
    return Parent(spec, f"checkpoint {spec}", TransformerConfig.from_dict(state["model_config"]), tokenizer,
                  state["model"])


def check_tokenizer(parent: Parent, data: DataConfig) -> None:
    """The run's data settings must describe the parent's tokenizer: its embeddings are bound to it."""
    have = (parent.tokenizer.src_vocab_size, parent.tokenizer.joint)
    want = (data.vocab_size, data.joint_vocab)
    if have != want:
        raise UserError(f"train.init_from {parent.described} has a {'joint' if have[1] else 'separate'} "
                        f"vocabulary of {have[0]}, but data.vocab_size={want[0]}, data.joint_vocab="
                        f"{str(want[1]).lower()}: set them to the parent's (its tokenizer is reused)")


def check_shape(parent: TransformerConfig, described: str, config: TransformerConfig) -> None:
    """Fail with both shapes named when the config's model cannot take the parent's weights."""
    mine, theirs = dataclasses.asdict(config), dataclasses.asdict(parent)
    differ = [key for key in mine if key not in REGULARIZATION and mine[key] != theirs[key]]
    if differ:
        raise UserError(f"train.init_from {described} is a Transformer with "
                        f"{', '.join(f'{k} {theirs[k]}' for k in differ)}; this run's model.* asks for "
                        f"{', '.join(f'{k} {mine[k]}' for k in differ)}: set them to the parent's")


def stage(parent: Parent, storage_path: str) -> str:
    """Write the parent's weights and shape under storage_path (content-addressed); the directory."""
    from safetensors.torch import save

    # Tied embeddings share storage, which safetensors refuses; clone each tensor on its own.
    weights = save({k: v.clone().contiguous() for k, v in parent.weights.items()})
    directory = storage.join(storage_path, "parents", hashlib.sha256(weights).hexdigest()[:16])
    if not storage.exists(storage.join(directory, WEIGHTS_FILE)):
        storage.write_bytes(storage.join(directory, CONFIG_FILE), json.dumps(parent.config.to_dict()).encode())
        storage.write_bytes(storage.join(directory, WEIGHTS_FILE), weights)  # last: its presence means complete
    return directory


def load_staged(directory: str) -> tuple[TransformerConfig, dict[str, torch.Tensor]]:
    """What stage() wrote: the parent's shape and weights (safetensors: no pickle)."""
    from safetensors.torch import load

    config = TransformerConfig.from_dict(json.loads(storage.read_bytes(storage.join(directory, CONFIG_FILE))))
    return config, load(storage.read_bytes(storage.join(directory, WEIGHTS_FILE)))
