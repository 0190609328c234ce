"""The commands and code blocks of the README and the docs, as the tests find them.

A fenced block of a command language (``sh``, ``bash``, ``console``, ``python``) is preceded by a marker line:
``<!-- run -->`` when the tests run it, ``<!-- not run: WHY -->`` when it cannot run here (a Docker engine,
a cluster, a GPU, an hour of training). Both are HTML comments: neither GitHub nor the site shows them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"sh", "bash", "console", "python"}
_FENCE = re.compile(r"^```(\S*)")
_MARKER = re.compile(r"^<!-- (run|not run: .+) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, its code, and whether the tests run it."""

    page: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    marker: str | None  # "run", "not run: ...", or None when the block has none

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README first (its blocks make the data later ones may use), then the docs' pages in order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a command language in ``page``, in order."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        language = opening.group(1).split("{")[0]
        if language in COMMANDS:
            previous = lines[i - 1] if i > 0 else ""
            marker = match.group(1) if (match := _MARKER.match(previous)) else None
            found.append(Block(page, i + 1, language, "\n".join(lines[i + 1 : end]) + "\n", marker))
        i = end + 1
    return found
