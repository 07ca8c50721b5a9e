"""docs/configuration.md, generated from pipeline/config.py (its dataclasses and field comments).

    python tools/config_reference.py          # print the markdown tables
    python tools/config_reference.py --write  # replace the block between docs/configuration.md's markers

tests/test_readme.py checks that docs/configuration.md holds exactly this output.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.config import Config  # noqa: E402

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def reference_markdown() -> str:
    """Every config key as markdown tables (key | default | meaning), the meaning from its field's comment."""
    def escape(text: str) -> str:  # a bare | splits a table cell; <word> would be read as an HTML tag
        return text.replace("|", "\\|").replace("<", "\\<")

    def value(default: Any) -> str:
        text = yaml.safe_dump(default, default_flow_style=True, sort_keys=False, width=1000)
        return "`" + text.removesuffix("...\n").strip().replace("|", "\\|") + "`"

    defaults, lines = Config(), []
    for section in dataclasses.fields(Config):
        values = getattr(defaults, section.name)
        source = inspect.getsource(type(values))
        comments = {token.start[0]: token.string.lstrip("#").strip()
                    for token in tokenize.generate_tokens(io.StringIO(source).readline)
                    if token.type == tokenize.COMMENT}
        # A field's comment ends its statement: for a multi-line field(...), the line of the closing ")".
        meanings = {node.target.id: comments.get(node.end_lineno, "")
                    for node in ast.parse(source).body[0].body if isinstance(node, ast.AnnAssign)}
        lines += [f"### `{section.name}`: {inspect.getdoc(type(values))}", "",
                  "| key | default | meaning |", "|---|---|---|"]
        lines += [f"| `{section.name}.{f.name}` | {value(getattr(values, f.name))} | {escape(meanings[f.name])} |"
                  for f in dataclasses.fields(values)]
        lines.append("")
    return "\n".join(lines)


def write_reference(page: Path = ROOT / "docs" / "configuration.md") -> None:
    """Put the generated reference between the page's markers."""
    text = page.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(f"{head}{START}\n{reference_markdown()}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_reference()
    else:
        print(reference_markdown())
