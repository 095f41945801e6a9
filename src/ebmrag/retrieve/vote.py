"""ICA-RAG's model-free document rerank (m = 100 chunks, k = 5 documents by default): every key sentence of a
record retrieves m chunks, chunks far below that sentence's best hit are dropped, and each distinct
surviving chunk is one vote for its document. Many sentences agreeing on a document beat one
sentence matching it strongly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ebmrag.index.backend import pinned
from ebmrag.index.types import Filters, SearchHit
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.search import HybridRetriever


@dataclass(frozen=True)
class DocumentHit:
    """A document ranked by votes; `chunks` are its voting chunks, best first, for citation."""

    doc_id: str
    votes: int
    score: float
    chunks: tuple[SearchHit, ...]

    def to_json(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "votes": self.votes, "score": round(self.score, 6),
                "chunks": [hit.to_json() for hit in self.chunks]}


class DocumentVoter:
    """Pipeline step: many sentence queries -> top documents by chunk votes (ICA-RAG: m = 100, k = 5, 50 %).

    A chunk found by several sentences is one member of the merged chunk set and votes once (the
    paper's union). Ties between documents with equal votes (common when documents are short: one
    chunk, one vote) go to the larger sum of relative scores over all sentences, i.e. to the
    document more of the record's key sentences reach. The similarity floor is relative to each
    sentence's best hit, because BM25 and fused scores have no absolute scale.
    """

    def __init__(self, retriever: HybridRetriever, params: RetrievalParams | None = None) -> None:
        """`params`: [retrieval] vote_chunks (m, chunks per sentence), vote_documents (k, documents kept),
        vote_min_score (a chunk below this share of its sentence's best score does not vote)."""
        self.retriever, self.params = retriever, params or retriever.params
        p = self.params
        self.chunks_per_query, self.top_documents, self.min_relative_score = \
            p.vote_chunks, p.vote_documents, p.vote_min_score

    def run(self, queries: Sequence[str], filters: Filters | None = None,
            similarity_to: str | None = None) -> list[DocumentHit]:
        """Top documents with their voting chunks; with `similarity_to`, each chunk also carries its cosine to
        that text, read from the knowledge base's stored vectors (nothing is embedded again)."""
        queries = [q for q in queries if q.strip()]
        if not queries:
            raise ValueError("no non-empty query sentence to vote with")
        with pinned(self.retriever.kb):  # the vote's rows and their stored vectors from one generation
            documents = self._vote(queries, filters)
            if similarity_to is None:
                return documents
            hits = [hit for document in documents for hit in document.chunks]
            sims = iter(self.retriever.similarities(similarity_to, hits))
        return [replace(d, chunks=tuple(replace(hit, similarity=next(sims)) for hit in d.chunks)) for d in documents]

    @property
    def embedder(self) -> SentenceEmbedder:
        return self.retriever.embedder

    def prepare(self, queries: Sequence[str]) -> None:
        self.retriever.prepare([q for q in queries if q.strip()])

    def _vote(self, queries: Sequence[str], filters: Filters | None) -> list[DocumentHit]:
        best: dict[str, SearchHit] = {}
        relative: dict[str, float] = {}
        for hits in self.retriever.run_many(queries, self.chunks_per_query, filters):
            for hit, share in self._surviving(hits):
                best.setdefault(hit.chunk_id, hit)
                relative[hit.chunk_id] = relative.get(hit.chunk_id, 0.0) + share
        by_document: dict[str, list[str]] = {}
        for chunk_id, hit in best.items():
            by_document.setdefault(hit.doc_id, []).append(chunk_id)
        documents = [
            DocumentHit(doc_id, len(ids), sum(relative[i] for i in ids),
                        tuple(best[i] for i in sorted(ids, key=lambda i: -relative[i])))
            for doc_id, ids in by_document.items()
        ]
        documents.sort(key=lambda d: (-d.votes, -d.score, d.doc_id))
        return documents[: self.top_documents]

    def _surviving(self, hits: list[SearchHit]) -> list[tuple[SearchHit, float]]:
        if not hits or hits[0].score <= 0:  # nothing matched this sentence
            return []
        top_score = hits[0].score
        shares = [(hit, hit.score / top_score) for hit in hits]
        return [(hit, share) for hit, share in shares if share >= self.min_relative_score]

    def to_dict(self) -> dict[str, Any]:
        return {"retriever": self.retriever.to_dict(), "params": asdict(self.params)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], embedder: SentenceEmbedder | None = None) -> DocumentVoter:
        params = RetrievalParams(**data["params"]) if data.get("params") else None
        return cls(HybridRetriever.from_dict(data["retriever"], embedder), params)
