"""Every config key with its type, default and meaning, read from the field comments of config.py.

One source for `nmt config --keys` and docs/configuration.md (tools/config_reference.py): a key's
meaning is the comment that ends its line in the dataclass (for the model section, derived from
TransformerConfig, the comment in model/config.py), so code and reference cannot drift.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
import typing
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from model.config import TransformerConfig

from .config import Config, ModelConfig, ModelPreset, field_type


@dataclass(frozen=True)
class Key:
    """One config key as `--set` names it."""

    name: str  # e.g. train.warmup_steps
    type: str  # e.g. "int" or "dict[str, int]"
    default: Any
    meaning: str
    allowed: str = ""  # the values the annotation allows, e.g. "one of: bpe, unigram" or "> 0"

    def described(self) -> str:
        """The meaning, with the allowed values when the key has a fixed set or a bound."""
        return f"{self.meaning} ({self.allowed})" if self.allowed else self.meaning


@dataclass(frozen=True)
class Section:
    """One section of the tree (data, model, ...) and its keys."""

    name: str
    doc: str
    keys: list[Key]


def yaml_value(value: Any) -> str:
    """A default as one line of YAML, as it would be written after --set."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).removesuffix("...\n").strip()


def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment that ends its statement (for a multi-line field(...), the closing line's).

    ModelConfig is made from TransformerConfig: its overrides mean what the model's fields' comments say.
    """
    if cls is ModelConfig:
        return {**_field_comments(TransformerConfig), **_field_comments(ModelPreset)}
    source = inspect.getsource(cls)
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    return {node.target.id: comments.get(node.end_lineno, "")
            for node in ast.parse(source).body[0].body if isinstance(node, ast.AnnAssign)}


def _type_and_allowed(cls: type, name: str) -> tuple[str, str]:
    """A key's type as written in the reference, and the values its annotation allows."""
    hint, limits = field_type(cls, name)
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        return type(choices[0]).__name__, "one of: " + ", ".join(map(str, choices))
    shown = getattr(hint, "__name__", None) if typing.get_origin(hint) is None else None
    return shown or str(hint).replace("typing.", ""), ", ".join(limit.shown for limit in limits)


def sections() -> list[Section]:
    """The whole tree's keys with their defaults, section by section, in declaration order."""
    defaults, result = Config(), []
    for section in dataclasses.fields(Config):
        values = getattr(defaults, section.name)
        meanings = _field_comments(type(values))
        keys = []
        for f in dataclasses.fields(values):
            shown, allowed = _type_and_allowed(type(values), f.name)
            keys.append(Key(f"{section.name}.{f.name}", shown, getattr(values, f.name), meanings[f.name], allowed))
        result.append(Section(section.name, inspect.getdoc(type(values)) or "", keys))
    return result
