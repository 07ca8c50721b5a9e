"""Every config key with its type, default and meaning, read from the field comments of config.py.

One source for `nmt config --keys` and docs/configuration.md (tools/config_reference.py): a key's
meaning is the comment that ends its line in the dataclass, so code and reference cannot drift.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
from dataclasses import dataclass
from typing import Any

import yaml

from .config import Config


@dataclass(frozen=True)
class Key:
    """One config key as `--set` names it."""

    name: str  # e.g. train.warmup_steps
    type: str  # the annotation, e.g. "int" or "dict[str, int]"
    default: Any
    meaning: str


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
    """Field name -> the comment that ends its statement (for a multi-line field(...), the closing line's)."""
    source = inspect.getsource(cls)
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    return {node.target.id: comments.get(node.end_lineno, "")
            for node in ast.parse(source).body[0].body if isinstance(node, ast.AnnAssign)}


def sections() -> list[Section]:
    """The whole tree's keys with their defaults, section by section, in declaration order."""
    defaults, result = Config(), []
    for section in dataclasses.fields(Config):
        values = getattr(defaults, section.name)
        meanings = _field_comments(type(values))
        keys = [Key(f"{section.name}.{f.name}", str(f.type), getattr(values, f.name), meanings[f.name])
                for f in dataclasses.fields(values)]
        result.append(Section(section.name, inspect.getdoc(type(values)) or "", keys))
    return result
