"""`[retrieval]`: how the knowledge base is searched (routes, fusion, reranking, query rewriting, the vote)."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("bm25", "dense", "hybrid")
FUSIONS = ("rrf", "score")


@dataclass(frozen=True)
class RetrievalParams:
    """The retriever's, the reranker's, the query rewriter's and the document vote's settings: one table, one
    name and one default per setting. `k` is what a plain search (`ebmrag kb search`) returns."""

    mode: str = "hybrid"
    fusion: str = "score"
    bm25_weight: float = 0.3
    dense_weight: float = 0.7
    route_depth: int = 50
    rrf_k: int = 60
    focus_weight: float = 0.0  # the share of fusion weight for the routes run on the question's focus (focus.py)
    k: int = 10
    rerank_model: str = ""  # a local cross-encoder folder or a .npz delta over the bundled MiniLM; empty = none
    rerank_depth: int = 0  # the reranker rescores this many best hits of the first stage (0: all of them)
    rerank_mix: float = 1.0  # share of the reranker's score in the final one (the rest: the first stage's)
    rerank_max_tokens: int = 512  # question + chunk length the reranker reads
    query_variants: int = 0  # > 0: a model rewords the question this many times; each rewording also searches
    hyde: bool = False  # a model writes a passage answering the question; the dense route searches with it too
    vote_chunks: int = 100  # ICA-RAG document vote: chunks per sentence (m)
    vote_documents: int = 5  # documents kept (k)
    vote_min_score: float = 0.5  # chunks below this share of the sentence's best score do not vote

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, got {self.fusion!r}")
        if min(self.bm25_weight, self.dense_weight) < 0 or self.bm25_weight + self.dense_weight <= 0:
            raise ValueError(f"bm25_weight and dense_weight must be >= 0 and not both 0, got "
                             f"{self.bm25_weight}, {self.dense_weight}")
        if self.route_depth < 1 or self.rrf_k < 1 or self.k < 1:
            raise ValueError("route_depth, rrf_k and k must be >= 1")
        if not 0.0 <= self.focus_weight < 1.0:
            raise ValueError(f"focus_weight must be in [0, 1), got {self.focus_weight}")
        if self.vote_chunks < 1 or self.vote_documents < 1:
            raise ValueError(f"vote_chunks and vote_documents must be >= 1, got {self.vote_chunks}, "
                             f"{self.vote_documents}")
        if not 0.0 <= self.vote_min_score <= 1.0:
            raise ValueError(f"vote_min_score must be in [0, 1], got {self.vote_min_score}")
        if self.query_variants < 0:
            raise ValueError(f"query_variants must be >= 0, got {self.query_variants}")

    @property
    def weights(self) -> tuple[float, float]:
        return (self.bm25_weight, self.dense_weight)
