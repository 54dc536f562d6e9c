"""How the docs read: each page's sentences and their length in words, and parentheses inside
parentheses (issue 49: a mean under 22 words a sentence in every page, none nested).

    python -m tools.prose [FILE ...]     # each page's mean, 90th percentile and longest sentence

Prose only: code blocks, indented code, tables, headings and HTML comments are not sentences; an
inline code span counts as one word, a link as its text. Each paragraph and each list item is cut
into sentences at '.', '!' or '?' followed by a space and a capital, a digit, a quote, a code span
or a parenthesis; a list item or a paragraph with no end mark is one sentence.
"""

from __future__ import annotations

import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the pages a person reads: the README and every page of the site
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: the longest mean a page may have, in words a sentence
MEAN_LIMIT = 22.0
#: the longest sentence a page may have, in words (a quoted verdict line runs to about 40)
LONGEST_LIMIT = 50

_FENCE = re.compile(r"^\s*(```|~~~)")
_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")
_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'`(*\[])")
_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


@dataclass(frozen=True)
class Page:
    path: Path
    sentences: tuple[str, ...]

    @property
    def lengths(self) -> list[int]:
        return [words(s) for s in self.sentences]

    @property
    def mean(self) -> float:
        return statistics.mean(self.lengths) if self.sentences else 0.0

    def longest(self) -> str:
        return max(self.sentences, key=words, default="")

    def too_long(self) -> list[str]:
        """The sentences over :data:`LONGEST_LIMIT` words."""
        return [s for s in self.sentences if words(s) > LONGEST_LIMIT]

    def nested(self) -> list[str]:
        """The sentences with a parenthesis inside a parenthesis."""
        return [s for s in self.sentences if _depth(s) > 1]


def words(sentence: str) -> int:
    return len(sentence.split())


def _depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(depth - 1, 0)
    return deepest


@dataclass(frozen=True)
class Fenced:
    """A fenced code block of a page: its language (``python``, ``bash``; "" for a plain one),
    the line its code starts on, and its lines."""

    lang: str
    line: int
    lines: tuple[str, ...]


_OPEN = re.compile(r"^\s*```\s*([\w-]*)\s*$")


def fenced(text: str) -> list[Fenced]:
    """Every ``` fenced block of a page's text, in order."""
    out: list[Fenced] = []
    lang, start, lines = "", 0, None
    for n, line in enumerate(text.splitlines(), 1):
        if lines is None:
            m = _OPEN.match(line)
            if m:
                lang, start, lines = m.group(1), n + 1, []
        elif line.strip().startswith("```"):
            out.append(Fenced(lang, start, tuple(lines)))
            lines = None
        else:
            lines.append(line)
    return out


def _blocks(text: str) -> list[str]:
    """The page's paragraphs and list items, as one line each, with code and tables left out."""
    blocks: list[list[str]] = []
    fenced = comment = False
    current: list[str] | None = None
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced, current = not fenced, None
            continue
        if "<!--" in line:
            comment = "-->" not in line.split("<!--", 1)[1]
            current = None
            continue
        if comment:
            comment = "-->" not in line
            continue
        stripped = line.strip()
        if fenced or not stripped or stripped.startswith(("|", "#", "<", "---")):
            current = None
            continue
        if line.startswith("    ") and current is None:  # indented code
            continue
        if _ITEM.match(line):
            current = [_ITEM.sub("", line, count=1).strip()]
            blocks.append(current)
        elif current is None:
            current = [stripped]
            blocks.append(current)
        else:
            current.append(stripped)
    return [" ".join(b) for b in blocks]


def sentences(text: str) -> list[str]:
    out = []
    for block in _blocks(text):
        block = _LINK.sub(r"\1", _CODE.sub("code", block)).replace("**", "")
        out += [s.strip() for s in _END.split(block) if s.strip()]
    return out


def read(path: Path) -> Page:
    return Page(path, tuple(sentences(path.read_text())))


def main(argv: list[str] | None = None) -> int:
    paths = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or list(PAGES)
    over = 0
    for page in map(read, paths):
        lengths = sorted(page.lengths) or [0]
        p90 = lengths[int(0.9 * (len(lengths) - 1))]
        flag = " over" if page.mean >= MEAN_LIMIT or page.too_long() or page.nested() else ""
        over += bool(flag)
        name = page.path.relative_to(ROOT) if page.path.is_relative_to(ROOT) else page.path
        print(
            f"{str(name):24s} {len(lengths):4d} sentences, mean {page.mean:5.1f}, p90 {p90:3d}, "
            f"longest {max(lengths):3d}, nested {len(page.nested())}{flag}"
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
