"""Search a knowledge base: BM25, dense or hybrid (each route top 50, then fusion), with metadata filters.

Results are `SearchHit`s carrying everything a citation needs (chunk id, document, section and
character offsets). Filters are applied inside each route (a scope: a row mask, or a
server-side expression on Milvus), not after it, so a filtered
search still returns k hits when k matching chunks exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.index.backend import KnowledgeStore, knowledge_base_from_dict, pinned
from ebmrag.index.types import Filters, Reranker, SearchHit
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.observe.instruments import traced
from ebmrag.retrieve.focus import FocusExtractor
from ebmrag.retrieve.fusion import Ranked, fuse, top, with_focus
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.rerank import reranker_from_dict

VARIANT_WEIGHT = 0.5  # a model-written rewording counts half as much as the question itself


def _counts(lists: list[list[SearchHit]]) -> dict[str, int]:
    """What a search's span says (observe.tracing): how many queries ran and how many hits came back."""
    return {"ebmrag.search.queries": len(lists), "ebmrag.search.hits": sum(len(hits) for hits in lists)}


def _hit_counts(hits: list[SearchHit]) -> dict[str, int]:
    return _counts([hits])


class HybridRetriever:
    """Pipeline step: query text -> ranked chunks. By default each route returns 50 hits; RRF is Σ_r 1/(60 + rank_r).

    With a reranker, the top `route_depth` fused chunks are reranked and the best k returned. With
    `focus_weight` > 0, every route also runs on the question's focus (`focus.py`: the knowledge base's titles it
    names and its question type) and the focus routes take that share of the fusion weight.
    """

    def __init__(self, kb: KnowledgeStore, params: RetrievalParams | None = None, *,
                 reranker: Reranker | None = None) -> None:
        """`params`: [retrieval] mode, fusion, bm25_weight / dense_weight, route_depth, rrf_k, focus_weight
        (validated there); `reranker`: built by the composition root from the rerank_* settings."""
        self.kb, self.params, self.reranker = kb, params or RetrievalParams(), reranker
        p = self.params
        self.mode, self.fusion, self.weights = p.mode, p.fusion, p.weights
        self.route_depth, self.rrf_k, self.focus_weight = p.route_depth, p.rrf_k, p.focus_weight
        self._focus: tuple[object, FocusExtractor] | None = None

    @traced("search", _hit_counts)
    def run(self, query: str, k: int = 10, filters: Filters | None = None, variants: Sequence[str] = (),
            hypothesis: str = "") -> list[SearchHit]:
        """`variants` (query expansion) run every route again, each at VARIANT_WEIGHT of the question's weight;
        `hypothesis` (HyDE: a passage that would answer the question) moves the dense query to the mean of the
        question's and the passage's vectors. Both come from a model (`generate.query_rewrite`)."""
        if not query.strip():
            raise ValueError("the query is empty")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with pinned(self.kb):  # one generation from ranking to hits, whatever is written meanwhile
            if self.reranker is None:
                return self.hits(self.rank(query, k, filters, variants=variants, hypothesis=hypothesis))
            candidates = self.hits(self.rank(query, max(k, self.route_depth), filters, variants=variants,
                                             hypothesis=hypothesis))
        return self.reranker.rerank(query, candidates)[:k]

    @traced("search", _counts)
    def run_many(self, queries: Sequence[str], k: int = 10, filters: Filters | None = None) -> list[list[SearchHit]]:
        """One first-stage ranked list per query, never reranked: this serves the document vote, which counts
        chunks across many record sentences by their route scores (a reranker is for one question's list, and
        rescoring 20 sentences' hits would cost a cross-encoder call per pair). The dense route embeds all
        queries in one batch (the model call dominates a single search, so 20 sentences cost about what 3
        would one by one)."""
        if any(not q.strip() for q in queries):
            raise ValueError("a query is empty")
        if self.mode == "bm25" or not queries:
            with pinned(self.kb):
                return self.hits_many([self.rank(q, k, filters) for q in queries])
        vectors = self.kb.embedder.embed(list(queries))
        with pinned(self.kb):
            return self.hits_many([self.rank(q, k, filters, v) for q, v in zip(queries, vectors, strict=True)])

    @property
    def embedder(self) -> SentenceEmbedder:
        """The model queries are embedded with (the knowledge base's)."""
        return self.kb.embedder

    def prepare(self, queries: Sequence[str]) -> None:
        """Embed queries ahead of their search (into the embedder's cache); BM25 needs nothing."""
        if self.mode != "bm25" and queries:
            self.kb.embedder.embed(list(queries))

    def similarities(self, query: str, hits: Sequence[SearchHit]) -> list[float]:
        """Cosine of the query and each hit in the knowledge base's own vector space, from stored vectors:
        no chunk is embedded again (the query vector is cached from the search)."""
        indexed = [h.row for h in hits if h.row >= 0]
        with pinned(self.kb):  # the hits' rows: valid in the generation of the caller's pin (DocumentVoter.run)
            vectors = iter(self.kb.reader().dense.vectors_at(indexed) if indexed else ())
        query_vector = self.kb.embedder.embed([query])[0]
        return [float(next(vectors) @ query_vector) if h.row >= 0 else 0.0 for h in hits]

    def rank(self, query: str, k: int, filters: Filters | None = None,
             query_vector: npt.NDArray[np.float32] | None = None, variants: Sequence[str] = (),
             hypothesis: str = "") -> Ranked:
        scope = self._scope(filters)
        variants = [v for v in dict.fromkeys(v.strip() for v in variants) if v and v != query.strip()]
        fused = self.mode == "hybrid" or bool(self.focus_weight or variants)
        depth = max(self.route_depth, k) if fused else k
        if hypothesis.strip() and self.mode != "bm25":
            query_vector = self._hypothesis_vector(query, hypothesis, query_vector)
        routes = self.routes(query, depth, scope, query_vector)
        base: list[float] = list(self.weights) if self.mode == "hybrid" else [1.0]
        weights = list(base)
        focus = self.focus_query(query) if self.focus_weight else ""
        if focus:
            routes += self.routes(focus, depth, scope)
            weights = with_focus(weights, self.focus_weight)
        for variant in variants:
            routes += self.routes(variant, depth, scope)
            weights += [w * VARIANT_WEIGHT for w in base]
        if len(routes) == 1:
            return Ranked(routes[0].rows[:k], routes[0].scores[:k])
        return top(fuse(routes, weights, self.fusion, self.rrf_k), k)

    def _hypothesis_vector(self, query: str, hypothesis: str,
                           query_vector: npt.NDArray[np.float32] | None) -> npt.NDArray[np.float32]:
        """HyDE: the mean of the question's vector and the hypothetical passage's, normalised."""
        question = query_vector if query_vector is not None else self.kb.embedder.embed([query])[0]
        mean = question + self.kb.embedder.embed([hypothesis])[0]
        return np.asarray(mean / max(float(np.linalg.norm(mean)), 1e-12), dtype=np.float32)

    def routes(self, query: str, depth: int, scope: Any = None,
               query_vector: npt.NDArray[np.float32] | None = None) -> list[Ranked]:
        """This mode's routes for one query text, each its top `depth` rows."""
        reader = self.kb.reader()
        routes: list[Ranked] = []
        if self.mode in ("bm25", "hybrid"):
            routes.append(Ranked(*reader.lexical.search(self.kb.analyzer.terms(query), depth, scope)))
        if self.mode in ("dense", "hybrid"):
            vector = query_vector if query_vector is not None else self.kb.embedder.embed([query])[0]
            routes.append(Ranked(*reader.dense.search(vector, depth, scope)))
        return routes

    def focus_query(self, query: str) -> str:
        """The question's focus as a query ("" when it names no title); extractor built once per generation."""
        reader = self.kb.reader()
        if self._focus is None or self._focus[0] is not reader:
            def rarest_share(title: str) -> float:
                return min((reader.lexical.share(t) for t in self.kb.analyzer.terms(title)), default=1.0)
            self._focus = (reader, FocusExtractor(reader.titles(), rarest_share, reader.live_chunks))
        return self._focus[1].extract(query).query

    def _scope(self, filters: Filters | None) -> Any:
        """What the knowledge base makes of the filters (its routes take it as they are)."""
        return None if filters is None else self.kb.reader().scope(filters)

    def hits(self, ranked: Ranked) -> list[SearchHit]:
        return self.hits_many([ranked])[0]

    def hits_many(self, ranked: Sequence[Ranked]) -> list[list[SearchHit]]:
        """The hits of several ranked lists, their chunk rows and titles read in one pass: the record's query
        sentences share most of their chunks, and a follow-up ask's retrieval was mostly these reads."""
        reader = self.kb.reader()
        rows = reader.chunks_by_rows(list(dict.fromkeys(row for r in ranked for row in r.rows.tolist())))
        titles = reader.titles_of(list({c.doc_id for c in rows.values()}))
        return [[SearchHit(c.chunk_id, c.doc_id, float(score), c.section, c.text, c.source, c.section_id,
                           c.char_start, c.char_end, c.authority, c.date, row, title=titles.get(c.doc_id, ""))
                 for row, score in zip(r.rows.tolist(), r.scores.tolist(), strict=True) if (c := rows[row])]
                for r in ranked]

    def to_dict(self) -> dict[str, Any]:
        return {"kb": self.kb.to_dict(), "params": asdict(self.params),
                "reranker": self.reranker.to_dict() if self.reranker else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], embedder: SentenceEmbedder | None = None) -> HybridRetriever:
        """`embedder` shares a model instance the caller already holds (see `backend.knowledge_base_from_dict`)."""
        reranker = data.get("reranker")
        return cls(knowledge_base_from_dict(data["kb"], embedder), RetrievalParams(**data["params"]),
                   reranker=reranker_from_dict(reranker) if reranker else None)
