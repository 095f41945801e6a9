"""Sentence splitting for English and Chinese clinical text, with character offsets kept for citations.

Clinical English is full of periods that do not end a sentence ("2.8 mg/dL", "Dr. Lee", "q.d.",
"vs."), so we split only at [.!?] followed by whitespace and an upper-case letter, digit or
opening bracket, and never after a known abbreviation. Chinese ends sentences with 。！？; and the
full-width semicolon, with no space after.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ABBREVIATIONS = frozenset(
    "dr mr mrs ms prof st vs etc e.g i.e approx no fig pt pts hx dx tx rx sx q.d b.i.d t.i.d q.i.d p.o i.v i.m "
    "yr yrs wk wks mo mos jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_EN_BOUNDARY = re.compile(r"[.!?]+[\"')\]]*\s+(?=[A-Z0-9(\[\"'])")
_ZH_BOUNDARY = re.compile(r"[。！？；!?]+[”’」』）)]*")
_LINE_BREAKS = re.compile(r"\n\s*\n|\n(?=\s*[-*•]\s)")


class Sentence(NamedTuple):
    text: str
    start: int
    end: int


def _last_word(text: str, end: int) -> str:
    match = re.search(r"([A-Za-z][A-Za-z.]*)\.*[\"')\]]*\s*$", text[max(0, end - 40) : end])
    return match.group(1).lower().rstrip(".") if match else ""


def _boundaries(text: str) -> list[int]:
    cuts: list[int] = []
    for match in _EN_BOUNDARY.finditer(text):
        if text[match.start()] == "." and _last_word(text, match.start() + 1) in _ABBREVIATIONS:
            continue
        cuts.append(match.end())
    cuts.extend(match.end() for match in _ZH_BOUNDARY.finditer(text))
    cuts.extend(match.end() for match in _LINE_BREAKS.finditer(text))
    return sorted(set(cuts))


def split_sentences(text: str) -> list[Sentence]:
    """Split text into sentences; empty pieces are dropped, offsets index the original string."""
    sentences: list[Sentence] = []
    start = 0
    for cut in [*_boundaries(text), len(text)]:
        piece = text[start:cut]
        stripped = piece.strip()
        if stripped:
            offset = start + piece.index(stripped)
            sentences.append(Sentence(stripped, offset, offset + len(stripped)))
        start = cut
    return sentences
