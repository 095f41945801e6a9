"""Chunkers that keep document id, section, position and exact character offsets for citations.

Every chunk satisfies `document.text[chunk.char_start:chunk.char_end] == chunk.text`, so an answer
can quote and highlight its evidence. Four strategies:

- fixed: windows of `size` tokens with `overlap` tokens, blind to structure;
- recursive: split on "\\n\\n\\n", "\\n\\n", "\\n", ". ", " " until pieces fit, then merge;
- structure: never crosses a section (heading) boundary, merges paragraphs inside a section;
- sentence: ~200-word units of whole sentences inside a section, with sentence overlap, a short
  tail merged into the previous chunk (for semi-structured medical text such as MedQuAD).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ebmrag.ingest.documents import Document, Section
from ebmrag.text.sentences import split_sentences

Span = tuple[int, int]
Measure = Callable[[str], int]
RECURSIVE_SEPARATORS = ("\n\n\n", "\n\n", "\n", ". ", " ")
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Chunk:
    doc_id: str
    position: int
    text: str
    char_start: int
    char_end: int
    section: str = ""
    section_id: str = ""

    @property
    def chunk_id(self) -> str:
        return f"{self.doc_id}#{self.position}"


class Chunker(Protocol):
    name: str

    def chunk(self, document: Document) -> list[Chunk]: ...

    def to_dict(self) -> dict[str, Any]: ...


class TokenSplitter(Protocol):
    def count(self, text: str) -> int: ...

    def offsets(self, text: str) -> list[tuple[int, int]]: ...


def word_count(text: str) -> int:
    return len(_WORD.findall(text))


def _trim(text: str, span: Span) -> Span | None:
    start, end = span
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def _sections(document: Document) -> list[Section]:
    return list(document.sections) or [Section("", 0, len(document.text))]


def _make_chunks(document: Document, spans: Sequence[Span]) -> list[Chunk]:
    chunks: list[Chunk] = []
    for start, end in spans:
        section = document.section_at(start)
        chunks.append(Chunk(document.doc_id, len(chunks), document.text[start:end], start, end,
                            section.title if section else "", section.section_id if section else ""))
    return chunks


def merge_pieces(text: str, pieces: Sequence[Span], size: int, overlap: int, measure: Measure) -> list[Span]:
    """Greedily join consecutive pieces up to `size`; each new chunk repeats trailing pieces worth <= `overlap`."""
    lengths = [measure(text[s:e]) for s, e in pieces]
    chunks: list[Span] = []
    first = 0
    while first < len(pieces):
        last, total = first, lengths[first]
        while last + 1 < len(pieces) and total + lengths[last + 1] <= size:
            last += 1
            total += lengths[last]
        chunks.append((pieces[first][0], pieces[last][1]))
        if last + 1 >= len(pieces):
            break
        back, carried = last + 1, 0
        while back - 1 > first and carried + lengths[back - 1] <= overlap:
            back -= 1
            carried += lengths[back]
        first = back
    return [trimmed for span in chunks if (trimmed := _trim(text, span))]


def split_recursive(text: str, span: Span, size: int, measure: Measure, separators: Sequence[str],
                    hard_cut: Callable[[str, Span, int], list[Span]]) -> list[Span]:
    """Pieces of `span` that each measure <= size, cut at the coarsest separator that works."""
    start, end = span
    if measure(text[start:end]) <= size:
        return [span]
    for index, separator in enumerate(separators):
        cuts = [m.end() + start for m in re.finditer(re.escape(separator), text[start:end])]
        if cuts and cuts[-1] == end:
            cuts.pop()
        if not cuts:
            continue
        bounds = [start, *cuts, end]
        pieces: list[Span] = []
        for piece in itertools.pairwise(bounds):
            pieces.extend(split_recursive(text, piece, size, measure, separators[index + 1:], hard_cut))
        return pieces
    return hard_cut(text, span, size)


class _TokenChunker:
    def __init__(self, splitter: TokenSplitter, size: int, overlap: int) -> None:
        if size < 8:
            raise ValueError(f"chunk size must be >= 8 tokens, got {size}")
        if not 0 <= overlap < size:
            raise ValueError(f"overlap must be in [0, size), got {overlap} for size {size}")
        self.splitter, self.size, self.overlap = splitter, size, overlap

    def _hard_cut(self, text: str, span: Span, size: int) -> list[Span]:
        start, end = span
        offsets = self.splitter.offsets(text[start:end])
        return [(start + offsets[i][0], start + offsets[min(i + size, len(offsets)) - 1][1])
                for i in range(0, len(offsets), size)]

    def to_dict(self) -> dict[str, Any]:
        return {"name": getattr(self, "name", ""), "size": self.size, "overlap": self.overlap}


class FixedChunker(_TokenChunker):
    name = "fixed"

    def __init__(self, splitter: TokenSplitter, size: int = 512, overlap: int = 64) -> None:
        super().__init__(splitter, size, overlap)

    def chunk(self, document: Document) -> list[Chunk]:
        offsets = self.splitter.offsets(document.text)
        step = self.size - self.overlap
        spans = []
        for first in range(0, len(offsets), step):
            last = min(first + self.size, len(offsets)) - 1
            spans.append((offsets[first][0], offsets[last][1]))
            if last == len(offsets) - 1:
                break
        return _make_chunks(document, [t for s in spans if (t := _trim(document.text, s))])


class RecursiveChunker(_TokenChunker):
    name = "recursive"

    def __init__(self, splitter: TokenSplitter, size: int = 512, overlap: int = 64,
                 separators: Sequence[str] = RECURSIVE_SEPARATORS) -> None:
        super().__init__(splitter, size, overlap)
        self.separators = tuple(separators)

    def chunk(self, document: Document) -> list[Chunk]:
        text = document.text
        pieces = split_recursive(text, (0, len(text)), self.size, self.splitter.count, self.separators, self._hard_cut)
        return _make_chunks(document, merge_pieces(text, pieces, self.size, self.overlap, self.splitter.count))


class StructureChunker(_TokenChunker):
    """Paragraph merging inside each section; a chunk never spans two headings."""

    name = "structure"

    def __init__(self, splitter: TokenSplitter, size: int = 512, overlap: int = 64) -> None:
        super().__init__(splitter, size, overlap)

    def chunk(self, document: Document) -> list[Chunk]:
        text, spans = document.text, []
        for section in _sections(document):
            pieces = split_recursive(text, (section.start, section.end), self.size, self.splitter.count,
                                     ("\n\n", "\n", ". ", " "), self._hard_cut)
            spans.extend(merge_pieces(text, pieces, self.size, self.overlap, self.splitter.count))
        return _make_chunks(document, spans)


class SentenceChunker:
    """Whole sentences up to ~`target_words`, bounded by sections, overlapping by ~`overlap_share` of a chunk."""

    name = "sentence"

    def __init__(self, target_words: int = 200, overlap_share: float = 0.15, min_tail_share: float = 0.3) -> None:
        if target_words < 20:
            raise ValueError(f"target_words must be >= 20, got {target_words}")
        if not 0 <= overlap_share <= 0.5:
            raise ValueError(f"overlap_share must be in [0, 0.5], got {overlap_share}")
        if not 0 <= min_tail_share < 1:
            raise ValueError(f"min_tail_share must be in [0, 1), got {min_tail_share}")
        self.target_words, self.overlap_share, self.min_tail_share = target_words, overlap_share, min_tail_share

    def chunk(self, document: Document) -> list[Chunk]:
        spans: list[Span] = []
        for section in _sections(document):
            spans.extend(self._section_spans(document.text, section))
        return _make_chunks(document, spans)

    def _section_spans(self, text: str, section: Section) -> list[Span]:
        sentences = [(s.start + section.start, s.end + section.start)
                     for s in split_sentences(text[section.start:section.end])]
        pieces: list[Span] = []
        for span in sentences:  # a run-on "sentence" (a table, a list without stops) is cut into word windows
            pieces.extend(self._word_windows(text, span))
        spans = merge_pieces(text, pieces, self.target_words, int(self.target_words * self.overlap_share), word_count)
        if len(spans) >= 2 and word_count(text[spans[-1][0]:spans[-1][1]]) < self.min_tail_share * self.target_words:
            tail = spans.pop()
            spans[-1] = (spans[-1][0], tail[1])
        return spans

    def _word_windows(self, text: str, span: Span) -> list[Span]:
        words = list(_WORD.finditer(text, span[0], span[1]))
        if len(words) <= self.target_words:
            return [span]
        step = self.target_words
        return [(words[i].start(), words[min(i + step, len(words)) - 1].end()) for i in range(0, len(words), step)]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "target_words": self.target_words, "overlap_share": self.overlap_share,
                "min_tail_share": self.min_tail_share}


CHUNKER_FOR_SOURCE = {"medquad": "sentence", "judged_answer": "sentence", "pubmed_abstract": "sentence",
                      "jsonl": "sentence", "markdown": "structure", "html": "structure", "txt": "recursive",
                      "pdf": "recursive"}


def make_chunker(name: str, splitter: TokenSplitter) -> Chunker:
    if name == "fixed":
        return FixedChunker(splitter)
    if name == "recursive":
        return RecursiveChunker(splitter)
    if name == "structure":
        return StructureChunker(splitter)
    if name == "sentence":
        return SentenceChunker()
    raise ValueError(f"unknown chunker {name!r}: use fixed, recursive, structure or sentence")


class ChunkerBySource:
    """Chooses a chunker per document source type; `override` forces one chunker for everything."""

    def __init__(self, splitter: TokenSplitter, override: str = "") -> None:
        names = set(CHUNKER_FOR_SOURCE.values()) | ({override} if override else set())
        self._chunkers = {name: make_chunker(name, splitter) for name in names}
        self.override = override

    def chunk(self, document: Document) -> list[Chunk]:
        name = self.override or CHUNKER_FOR_SOURCE.get(document.source_type, "recursive")
        return self._chunkers[name].chunk(document)
