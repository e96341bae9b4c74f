"""The vendor manuals' commands and snippets, parsed from docs/manual/MANUAL_COMMANDS.md.

The file quotes every command and snippet the two manuals tell a user to type (001-xx: the
GPU vendor's reference manual; 002-xx: the accelerator suite's manual). Each block starts
with a line ``**ID · title** — where it comes from``, then its fenced code blocks and/or a
table, then notes. ``blocks()`` returns them by id, in the file's order, so tests follow the
manual's own text instead of a retyped copy. docs/manual/MANUAL_COMMANDS.md is a copy of
../shared/MANUAL_COMMANDS.md kept in the repository (a clean clone has no ../shared);
tests/unit/test_manual_commands.py keeps the two equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENDORED = REPO / "docs" / "manual" / "MANUAL_COMMANDS.md"
SHARED = REPO.parent / "shared" / "MANUAL_COMMANDS.md"
CONFORMANCE = REPO / "docs" / "manual-conformance.md"

# blocks per manual, as the file numbers them (001-01..001-44, 002-01..002-59)
COUNTS = {"001": 44, "002": 59}

_HEAD = re.compile(r"^\*\*(?P<id>00[12]-\d\d) · (?P<title>.+?)\*\*(?: — (?P<source>.*))?$")
_FENCE = re.compile(r"^```(?P<lang>[a-z]*)$")
_CHAPTER = re.compile(r"^(---|## )")


@dataclass
class Fence:
    lang: str
    text: str  # the lines between the fences, each ending in "\n"


@dataclass
class Block:
    id: str
    title: str
    source: str
    fences: list[Fence] = field(default_factory=list)
    table: list[dict[str, str]] = field(default_factory=list)  # rows of a markdown table
    notes: str = ""  # prose after the header: outside fences and tables

    @property
    def code(self) -> str:
        """The block's only fenced text (AssertionError when it has none or several)."""
        assert len(self.fences) == 1, f"{self.id}: {len(self.fences)} fences"
        return self.fences[0].text

    @property
    def refers_to(self) -> list[str]:
        """Block ids a block without a listing of its own repeats ("identical to 001-25")."""
        if self.fences or self.table:
            return []
        return re.findall(r"\*\*(00[12]-\d\d)\*\*", self.source + " " + self.notes)

    def commands(self) -> list[str]:
        """Commands of a console listing: lines after a ``$`` or a root's ``#`` prompt, or
        for a listing without prompts the first line (the rest is the sample output it
        printed)."""
        text = self.code
        prompted = [line for line in text.splitlines() if line.startswith(("$", "# "))]
        if prompted:
            return [line[1:].strip() for line in prompted]
        return [text.splitlines()[0].strip()]


def _table(lines: list[str]) -> list[dict[str, str]]:
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    header = cells(lines[0])
    return [dict(zip(header, cells(line), strict=False)) for line in lines[2:]]


def parse(text: str) -> dict[str, Block]:
    found: dict[str, Block] = {}
    block: Block | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        head = _HEAD.match(line)
        if head:
            block = Block(head["id"], head["title"], head["source"] or "")
            assert block.id not in found, f"block {block.id} twice"
            found[block.id] = block
        elif _CHAPTER.match(line):
            block = None
        elif block is not None and _FENCE.match(line):
            lang = _FENCE.match(line)["lang"]  # type: ignore[index]
            end = lines.index("```", i + 1)
            block.fences.append(Fence(lang, "".join(x + "\n" for x in lines[i + 1:end])))
            i = end
        elif block is not None and line.startswith("|"):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            block.table = _table(lines[i:end])
            i = end - 1
        elif block is not None and line.strip():
            block.notes += line + "\n"
        i += 1
    return found


@cache
def blocks() -> dict[str, Block]:
    """Every block of the vendored file, by id."""
    return parse(VENDORED.read_text(encoding="utf-8"))


def block(block_id: str) -> Block:
    return blocks()[block_id]
