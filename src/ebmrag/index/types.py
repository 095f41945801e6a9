"""What the index hands to the stages above it: search filters, hits with their citation fields, and
the `Reranker` contract. Kept apart from `search` so a reranker or a consumer of hits needs no retriever."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ebmrag.errors import IngestError


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
    """Reorders the hits of one query, best first; may drop hits, never invents them (see retrieve.rerank)."""

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class KnowledgeBaseStats:
    path: str
    generation: int
    documents: int
    chunks: int
    segments: int
    deleted_chunks: int
    bytes_on_disk: int
    embedding_model: str
    created: str
    by_source_type: dict[str, int]
    by_authority: dict[str, int]
    hnsw: bool

    @staticmethod
    def tally(documents: Iterable[Any]) -> tuple[dict[str, int], dict[str, int]]:
        """Documents counted by source type and by authority."""
        by_type: dict[str, int] = {}
        by_authority: dict[str, int] = {}
        for row in documents:
            by_type[row.source_type] = by_type.get(row.source_type, 0) + 1
            by_authority[row.authority] = by_authority.get(row.authority, 0) + 1
        return by_type, by_authority


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[IngestError] = field(default_factory=list)
    chunks_written: int = 0
    chunks_total: int = 0
    generation: int = 0
    seconds_embedding: float = 0.0
    seconds_indexing: float = 0.0
    segments_merged: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.deleted)
