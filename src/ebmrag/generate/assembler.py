"""Context assembly for retrieved evidence: dedup, per-source cap, sentence-end cut, ordering.

Hits are taken best first; a hit whose words overlap an already kept hit by Jaccard ≥ 0.8 is a
near-duplicate and dropped; at most 3 chunks come from one document, so one long source cannot fill
the window; the last chunk that does not fit is cut at a sentence end found in its last 10 % of the
room left (a cut mid-sentence would hand the model a half-claim), or left out. The result keeps the
fixed dict shape {"context_text", "metadata", "selected_chunks"} (`to_json`) and the reason every hit was left out.
Ordering: relevance_first, or edges_first (best at both ends, weakest in the middle, against
"lost in the middle").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.index.types import SearchHit
from ebmrag.protocols import TokenCounter
from ebmrag.text.sentences import split_sentences

ORDERINGS = ("relevance_first", "edges_first")
_WORD = re.compile(r"\w+", re.UNICODE)


def word_set(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORD.findall(text))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def edges_first(items: Sequence[Any]) -> list[Any]:
    """Ranks 1, 3, 5, ... then ..., 6, 4, 2: the best at the start and the end."""
    return [*items[0::2], *reversed(items[1::2])]


@dataclass(frozen=True)
class SelectedChunk:
    number: int
    hit: SearchHit
    text: str  # the chunk text as placed, possibly cut at a sentence end
    truncated: bool


@dataclass(frozen=True)
class AssembledContext:
    context_text: str
    selected: tuple[SelectedChunk, ...]
    skipped: tuple[tuple[str, str], ...]  # (chunk id, reason)
    total_retrieved: int
    unique_after_dedup: int
    estimated_tokens: int

    def to_json(self) -> dict[str, Any]:
        sources = Counter(s.hit.doc_id for s in self.selected)
        return {
            "context_text": self.context_text,
            "metadata": {"total_chunks_retrieved": self.total_retrieved,
                         "unique_chunks_after_dedup": self.unique_after_dedup,
                         "chunks_selected": len(self.selected), "estimated_tokens": self.estimated_tokens,
                         "chunk_sources": dict(sources)},
            "selected_chunks": [{**s.hit.to_json(), "n": s.number, "text": s.text, "truncated": s.truncated}
                                for s in self.selected],
        }


class ContextAssembler:
    """Pipeline step: ranked hits -> a cited evidence block within a token budget."""

    def __init__(self, token_counter: TokenCounter, budget_tokens: int, dedup_jaccard: float = 0.8,
                 max_per_source: int = 3, ordering: str = "relevance_first", cut_zone: float = 0.1) -> None:
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens must be >= 1, got {budget_tokens}")
        if not 0 < dedup_jaccard <= 1 or max_per_source < 1 or not 0 < cut_zone <= 1:
            raise ValueError("dedup_jaccard and cut_zone must be in (0, 1], max_per_source >= 1")
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS}, got {ordering!r}")
        self.token_counter, self.budget_tokens = token_counter, budget_tokens
        self.dedup_jaccard, self.max_per_source = dedup_jaccard, max_per_source
        self.ordering, self.cut_zone = ordering, cut_zone

    def run(self, hits: Sequence[SearchHit]) -> AssembledContext:
        ranked = sorted(hits, key=lambda h: -h.score)
        unique, skipped = self._dedupe(ranked)
        chosen: list[tuple[SearchHit, str, bool]] = []
        per_source: Counter[str] = Counter()
        used = 0
        for hit in unique:
            if per_source[hit.doc_id] >= self.max_per_source:
                skipped.append((hit.chunk_id, f"already {self.max_per_source} chunks from {hit.doc_id}"))
                continue
            room = self.budget_tokens - used
            line = self._line(len(chosen) + 1, hit.text)
            cost = self.token_counter.count(line)
            text, truncated = hit.text, False
            if cost > room:
                text = self._cut(len(chosen) + 1, hit.text, room)
                if not text:
                    skipped.append((hit.chunk_id, "no room left for a whole sentence"))
                    continue
                truncated, cost = True, self.token_counter.count(self._line(len(chosen) + 1, text))
            chosen.append((hit, text, truncated))
            per_source[hit.doc_id] += 1
            used += cost
        ordered = edges_first(chosen) if self.ordering == "edges_first" else chosen
        selected = tuple(SelectedChunk(n, hit, text, cut) for n, (hit, text, cut) in enumerate(ordered, 1))
        context = "\n".join(self._line(s.number, s.text) for s in selected)
        return AssembledContext(context, selected, tuple(skipped), len(hits), len(unique),
                                self.token_counter.count(context) if context else 0)

    def _dedupe(self, ranked: Sequence[SearchHit]) -> tuple[list[SearchHit], list[tuple[str, str]]]:
        kept: list[tuple[SearchHit, frozenset[str]]] = []
        skipped: list[tuple[str, str]] = []
        for hit in ranked:
            words = word_set(hit.text)
            twin = next((k for k, w in kept if jaccard(words, w) >= self.dedup_jaccard), None)
            if twin is not None:
                skipped.append((hit.chunk_id, f"near-duplicate of {twin.chunk_id}"))
                continue
            kept.append((hit, words))
        return [hit for hit, _ in kept], skipped

    @staticmethod
    def _line(number: int, text: str) -> str:
        return f"[{number}] {text}"

    def _cut(self, number: int, text: str, room: int) -> str:
        """The longest sentence-aligned prefix that fits, if it ends in the last `cut_zone` of what fits."""
        ends = [s.end for s in split_sentences(text)]
        fitting = [end for end in ends if self.token_counter.count(self._line(number, text[:end])) <= room]
        if not fitting:
            return ""
        limit = max(fitting)
        fits_chars = self._chars_that_fit(number, text, room)
        return text[:limit].rstrip() if limit >= (1 - self.cut_zone) * fits_chars else ""

    def _chars_that_fit(self, number: int, text: str, room: int) -> int:
        low, high = 0, len(text)
        while low < high:
            middle = (low + high + 1) // 2
            if self.token_counter.count(self._line(number, text[:middle])) <= room:
                low = middle
            else:
                high = middle - 1
        return low

    def to_dict(self) -> dict[str, Any]:
        return {"budget_tokens": self.budget_tokens, "dedup_jaccard": self.dedup_jaccard,
                "max_per_source": self.max_per_source, "ordering": self.ordering, "cut_zone": self.cut_zone}
