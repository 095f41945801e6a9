"""What the index hands to the stages above it: search filters, hits with their citation fields, and
the `Reranker` contract. Kept apart from `search` so a reranker or a consumer of hits needs no retriever."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Filters:
    """Each field restricts results when set: exact source / section / authority, dates as ISO prefixes."""

    source: str = ""
    section: str = ""
    authority: str = ""
    date_from: str = ""
    date_to: str = ""

    def sql(self) -> tuple[str, list[str]]:
        clauses, params = [], []
        for column in ("source", "section", "authority"):
            value = getattr(self, column)
            if value:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.date_from:
            clauses.append("date != '' AND date >= ?")
            params.append(self.date_from)
        if self.date_to:
            clauses.append("date != '' AND date <= ?")
            params.append(self.date_to + "\uffff")
        return " AND ".join(clauses), params


@dataclass(frozen=True)
class SearchHit:
    chunk_id: str
    doc_id: str
    score: float
    section: str
    text: str
    source: str
    section_id: str
    char_start: int
    char_end: int
    authority: str
    date: str
    row: int = -1  # the chunk's row in this generation's vector matrix (-1: not from an index)
    similarity: float | None = None  # cosine to a reference text (the question), when the caller asked for it
    title: str = ""  # the document's title (a reranker reads it above the text, as the index embeds it)

    def to_json(self) -> dict[str, Any]:
        return {"chunk_id": self.chunk_id, "doc_id": self.doc_id, "score": round(self.score, 6),
                "section": self.section, "text": self.text, "source": self.source}


class Reranker(Protocol):
    """Reorders the hits of one query, best first; may drop hits, never invents them (see index.rerank)."""

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]: ...

    def to_dict(self) -> dict[str, Any]: ...
