"""Reranking after retrieval: a pluggable chunk reranker and the ICA-RAG chunk-to-document vote.

A `Reranker` reorders one query's hits (any object with `rerank(query, hits)`); the shipped one is a
cross-encoder loaded from a local folder, because no reranker model ships in a pip package and a
hospital network cannot download one. `DocumentVoter` is ICA-RAG's model-free document rerank
(seed 003, §3.3 and appendix C.1): every key sentence of a record retrieves m chunks, chunks far
below that sentence's best hit are dropped, and each distinct surviving chunk is one vote for its
document. Many sentences agreeing on a document beat one sentence matching it strongly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ebmrag.errors import ModelUnavailableError
from ebmrag.index.search import Filters, HybridRetriever, Reranker, SearchHit


class CrossEncoderReranker:
    """Scores (query, chunk text) pairs with a sentence-transformers cross-encoder from a local folder."""

    def __init__(self, model_path: str | Path, batch_size: int = 16, max_length: int = 512) -> None:
        if not Path(model_path).is_dir():
            raise ModelUnavailableError(f"reranker model path is not a local directory: {model_path}")
        if batch_size < 1 or max_length < 8:
            raise ValueError(f"batch_size must be >= 1 and max_length >= 8, got {batch_size}, {max_length}")
        self.model_path, self.batch_size, self.max_length = Path(model_path), batch_size, max_length
        self._model: Any = None

    def warm_up(self) -> None:
        if self._model is not None:
            return
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise ModelUnavailableError("sentence-transformers is missing: pip install 'ebmrag[embed]'") from exc
        try:
            self._model = CrossEncoder(str(self.model_path), device="cpu", max_length=self.max_length,
                                       local_files_only=True)
        except Exception as exc:  # the library raises many types for a bad folder
            raise ModelUnavailableError(f"could not load the reranker from {self.model_path}: {exc}") from exc

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        self.warm_up()
        values = self._model.predict([(query, text) for text in texts], batch_size=self.batch_size,
                                     show_progress_bar=False, convert_to_numpy=True)
        return [float(v) for v in values.reshape(len(texts), -1)[:, -1]]

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        if not hits:
            return []
        scored = zip(self.scores(query, [h.text for h in hits]), range(len(hits)), hits, strict=True)
        return [replace(hit, score=score) for score, _, hit in sorted(scored, key=lambda t: (-t[0], t[1]))]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "cross-encoder", "model_path": str(self.model_path), "batch_size": self.batch_size,
                "max_length": self.max_length}


def reranker_from_dict(data: dict[str, Any]) -> Reranker:
    settings = dict(data)
    kind = settings.pop("type", None)
    if kind != "cross-encoder":
        raise ValueError(f"unknown reranker type {kind!r}; known: 'cross-encoder'")
    return CrossEncoderReranker(**settings)


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

    def __init__(self, retriever: HybridRetriever, chunks_per_query: int = 100, top_documents: int = 5,
                 min_relative_score: float = 0.5) -> None:
        if chunks_per_query < 1 or top_documents < 1:
            raise ValueError(f"chunks_per_query and top_documents must be >= 1, got {chunks_per_query}, "
                             f"{top_documents}")
        if not 0.0 <= min_relative_score <= 1.0:
            raise ValueError(f"min_relative_score must be in [0, 1], got {min_relative_score}")
        self.retriever, self.chunks_per_query = retriever, chunks_per_query
        self.top_documents, self.min_relative_score = top_documents, min_relative_score

    def run(self, queries: Sequence[str], filters: Filters | None = None) -> list[DocumentHit]:
        queries = [q for q in queries if q.strip()]
        if not queries:
            raise ValueError("no non-empty query sentence to vote with")
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
        return {"retriever": self.retriever.to_dict(), "chunks_per_query": self.chunks_per_query,
                "top_documents": self.top_documents, "min_relative_score": self.min_relative_score}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DocumentVoter:
        data = dict(data)
        return cls(HybridRetriever.from_dict(data.pop("retriever")), **data)
