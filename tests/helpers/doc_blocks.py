"""The code blocks of the repository's markdown files and the markers that say how the docs test treats each.

A marker is an HTML comment on the lines right above a fenced block (invisible once rendered); several may
stand one above the other:

    <!-- not run: REASON -->         the block is not run, for REASON (needs a GPU, downloads a model, ...)
    <!-- run by PATH -->             a test elsewhere runs it: PATH (from the repository's root) must exist and
                                     hold every command of the block, or name this markdown file
    <!-- slow -->                    run only with the slow tests (pytest -m slow, or no -m at all)
    <!-- expect: TEXT -->            the block's output must contain TEXT

Every other block is run (tests/docs/test_docs_examples.py says how).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*(not run|run by|slow|expect)\b:?\s*(.*?)\s*-->")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str  # the fence's info string's first word ("" if none)
    text: str
    not_run: str | None = None
    run_by: str | None = None
    slow: bool = False
    expect: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        try:
            name = self.path.relative_to(ROOT).as_posix()
        except ValueError:
            name = self.path.name
        return f"{name}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, every markdown file under docs/, and each package's README.md."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted(root.glob("llaisys-*/README.md"))]


def _markers(lines: list[str], fence_line: int) -> dict:
    """The markers on the comment lines right above line ``fence_line`` (0-based)."""
    found: dict = {"expect": []}
    i = fence_line - 1
    while i >= 0 and lines[i].strip().startswith("<!--") and lines[i].strip().endswith("-->"):
        match = MARKER.fullmatch(lines[i].strip())
        if match:
            kind, value = match.groups()
            if kind == "expect":
                found["expect"].append(value)
            elif kind == "slow":
                found["slow"] = True
            else:
                found[kind.replace(" ", "_")] = value
        i -= 1
    return found


def blocks(path: Path) -> tuple[list[Block], list[int]]:
    """The fenced blocks of ``path``, and the 1-based lines where an indented code block starts (which no marker
    can describe: the docs test refuses them)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found, indented = [], []
    for token in MarkdownIt("commonmark").parse(source):
        if token.type == "code_block":
            indented.append(token.map[0] + 1)
        elif token.type == "fence":
            marks = _markers(lines, token.map[0])
            found.append(Block(path, token.map[0] + 1, (token.info.split() or [""])[0], token.content,
                               not_run=marks.get("not_run"), run_by=marks.get("run_by"),
                               slow=marks.get("slow", False), expect=tuple(marks["expect"])))
    return found, indented
