"""docs/configuration.md, generated from the config's dataclasses and field comments (via pipeline/config_keys.py).

    python tools/config_reference.py          # print the markdown tables
    python tools/config_reference.py --write  # replace the block between docs/configuration.md's markers

tests/test_readme.py checks that docs/configuration.md holds exactly this output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.config_keys import sections, yaml_value  # noqa: E402

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def reference_markdown() -> str:
    """Every config key as markdown tables (key | default | meaning), section by section."""
    def escape(text: str) -> str:  # a bare | splits a table cell; <word> would be read as an HTML tag
        return text.replace("|", "\\|").replace("<", "\\<")

    def value(default: Any) -> str:
        return "`" + yaml_value(default).replace("|", "\\|") + "`"

    lines = []
    for section in sections():
        lines += [f"### `{section.name}`: {section.doc}", "", "| key | default | meaning |", "|---|---|---|"]
        lines += [f"| `{key.name}` | {value(key.default)} | {escape(key.described())} |" for key in section.keys]
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
