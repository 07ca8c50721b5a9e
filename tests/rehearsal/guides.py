"""The guides' command blocks, read with markdown-it-py: each fenced shell block labelled with who runs it.

A block's info string names its language, then `ROLE:NAME` (```` ```bash admin:logins ````): the role
that runs it (admin, member, promoter) and a name the rehearsal's script refers to it by. GitHub
shows the language only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

SHELLS = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    """One labelled command block of a guide."""

    page: Path
    line: int  # of the block's first command, 1-based
    role: str
    name: str
    text: str

    @property
    def label(self) -> str:
        return f"{self.role}:{self.name}"

    def __str__(self) -> str:
        return f"{self.page.name}:{self.line} ({self.label})"


def shell_blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line, info string, text) of every fenced shell block of a Markdown page, in order."""
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    return [(token.map[0] + 2, token.info.strip(), token.content) for token in tokens
            if token.type == "fence" and token.info.split(maxsplit=1)[:1] and token.info.split()[0] in SHELLS]


def labelled_blocks(page: Path) -> dict[str, Block]:
    """The page's labelled blocks by label; an unlabelled shell block or a label used twice is an error."""
    found: dict[str, Block] = {}
    for line, info, text in shell_blocks(page):
        words = info.split()
        if len(words) != 2 or ":" not in words[1]:
            raise ValueError(f"{page.name}:{line}: a command block without a ROLE:NAME label (```{info}```): "
                             "label it with who runs it, e.g. ```bash member:train```")
        role, name = words[1].split(":", 1)
        block = Block(page, line, role, name, text)
        if block.label in found:
            raise ValueError(f"{page.name}:{line}: label {block.label} is also {found[block.label]}")
        found[block.label] = block
    return found
