"""Retrieval quality on public benchmarks: Recall@10, MRR and nDCG@10 for BM25, dense and hybrid.

The unit of relevance differs per dataset and chunks are mapped to it, each unit ranked by its
best chunk: LiveQA-Med judges answer sections (MedQuAD answer ids, graded 1-4, gain = grade - 1),
MedQuAD asks each section's own question, PubMedQA asks for the question's own abstract. Files are
found in the data folder by pattern, so a held-out folder of the same layout runs unchanged.
Both routes are computed once per query; fusion variants (the ablation) are re-fused from them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ebmrag.errors import EbmragError
from ebmrag.index.backend import KnowledgeStore
from ebmrag.index.types import Reranker
from ebmrag.retrieve.fusion import Ranked, fuse, top, with_focus
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.query_rewrite import Rewrite
from ebmrag.retrieve.search import HybridRetriever

DATASETS = ("liveqa", "pubmedqa", "medquad")
CHUNK_DEPTH = 100


@dataclass(frozen=True)
class Query:
    query_id: str
    text: str
    gains: dict[str, float]  # unit id -> gain > 0


@dataclass(frozen=True)
class Scores:
    recall_at_10: float
    mrr: float
    ndcg_at_10: float

    def to_json(self) -> dict[str, float]:
        return {"recall@10": round(self.recall_at_10, 4), "mrr": round(self.mrr, 4),
                "ndcg@10": round(self.ndcg_at_10, 4)}


def _find(data_dir: Path, pattern: str) -> Path:
    matches = sorted(data_dir.glob(pattern))
    if not matches:
        raise EbmragError(f"{data_dir}: no file matches {pattern!r}")
    return matches[0]


def _jsonl(path: Path) -> Iterable[dict[str, object]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def liveqa_queries(data_dir: Path) -> list[Query]:
    """The consumer's own words (subject + message), not the NIST paraphrase: that is what a user types."""
    gains: dict[str, dict[str, float]] = {}
    for row in _jsonl(_find(data_dir, "*qrels*.jsonl")):
        gain = float(row["grade"]) - 1  # type: ignore[arg-type]
        if gain > 0:
            gains.setdefault(str(row["qnum"]), {})[str(row["answer_id"])] = gain
    queries = []
    for row in _jsonl(_find(data_dir, "*questions*.jsonl")):
        qnum = str(row["qnum"])
        if qnum in gains:
            text = ". ".join(str(part).strip() for part in (row.get("subject"), row.get("message")) if part)
            queries.append(Query(str(row["qid"]), text, gains[qnum]))
    return queries


def pubmedqa_queries(data_dir: Path) -> list[Query]:
    records = json.loads(_find(data_dir, "ori_pqal*.json").read_text(encoding="utf-8"))
    return [Query(pmid, str(r["QUESTION"]), {pmid: 1.0}) for pmid, r in records.items()]


def medquad_queries(corpus: Sequence[Path]) -> list[Query]:
    queries = []
    for path in corpus:
        for record in _jsonl(path):
            for qa in record.get("qa", []):  # type: ignore[attr-defined]
                if qa.get("answer", "").strip() and qa.get("question"):
                    queries.append(Query(str(qa["answer_id"]), str(qa["question"]), {str(qa["answer_id"]): 1.0}))
    return queries


def load_queries(dataset: str, data_dir: Path, corpus: Sequence[Path], limit: int = 0) -> list[Query]:
    if dataset == "liveqa":
        queries = liveqa_queries(data_dir)
    elif dataset == "pubmedqa":
        queries = pubmedqa_queries(data_dir)
    elif dataset == "medquad":
        queries = medquad_queries(corpus or sorted(data_dir.glob("*.jsonl")))
    else:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if limit:  # a deterministic sample, not the first N (files are often sorted by topic)
        queries = sorted(queries, key=lambda q: hashlib.sha256(q.query_id.encode()).hexdigest())[:limit]
    if not queries:
        raise EbmragError(f"{data_dir}: no {dataset} queries with relevance judgements")
    return queries


def score_ranking(units: Sequence[str], gains: dict[str, float], k: int = 10) -> Scores:
    dcg = sum(gains.get(u, 0.0) / math.log2(i + 2) for i, u in enumerate(units[:k]))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(gains.values(), reverse=True)[:k]))
    first = next((i for i, u in enumerate(units) if u in gains), None)
    recall = len(set(units[:k]) & set(gains)) / len(gains)
    return Scores(recall, 0.0 if first is None else 1.0 / (first + 1), dcg / ideal if ideal else 0.0)


def mean(scores: Sequence[Scores]) -> Scores:
    return Scores(*(float(np.mean([getattr(s, f) for s in scores])) for f in ("recall_at_10", "mrr", "ndcg_at_10")))


SPLITS = ("all", "tune", "check")


def split_of(query_id: str) -> str:
    """A fixed hash half: levers are chosen on "tune", the chosen configuration is checked once on "check"."""
    return "tune" if int(hashlib.sha256(f"ebmrag-split:{query_id}".encode()).hexdigest(), 16) % 2 == 0 else "check"


def select_split(queries: Sequence[Query], split: str) -> list[Query]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [q for q in queries if split == "all" or split_of(q.query_id) == split]


@dataclass(frozen=True)
class QueryRoutes:
    text: str
    bm25: Ranked
    dense: Ranked
    focus: tuple[Ranked, Ranked] | None  # the same two routes on the question's focus, when it names one


class RouteCache:
    """BM25 and dense route results for every query (and its focus), computed once; fusion variants re-use them."""

    def __init__(self, kb: KnowledgeStore, queries: Sequence[Query], unit: str, with_focus: bool = True) -> None:
        """`with_focus` False skips the focus routes (building the focus extractor asks the knowledge base how
        common every title word is: free on the embedded backend, a count query per word on Milvus)."""
        self.kb, self.queries = kb, queries
        reader = kb.reader()
        self.unit_of_row = {c.row: (c.section_id or c.doc_id) if unit == "section" else c.doc_id
                            for c in reader.iter_chunks()}
        retriever = HybridRetriever(kb, RetrievalParams(mode="hybrid", fusion="rrf", bm25_weight=1.0, dense_weight=1.0,
                                                    route_depth=CHUNK_DEPTH))
        focus = [retriever.focus_query(q.text) if with_focus else "" for q in queries]
        retriever.prepare([q.text for q in queries] + [f for f in focus if f])  # one embedding batch
        self.routes = [self._routes(retriever, q.text, f) for q, f in zip(queries, focus, strict=True)]

    @staticmethod
    def _routes(retriever: HybridRetriever, text: str, focus: str) -> QueryRoutes:
        bm25, dense = retriever.routes(text, CHUNK_DEPTH)
        if not focus:
            return QueryRoutes(text, bm25, dense, None)
        focus_bm25, focus_dense = retriever.routes(focus, CHUNK_DEPTH)
        return QueryRoutes(text, bm25, dense, (focus_bm25, focus_dense))

    def units(self, ranked: Ranked) -> list[str]:
        return list(dict.fromkeys(self.unit_of_row[r] for r in ranked.rows.tolist()))

    def per_query(self, fuse_routes: Callable[[QueryRoutes], Ranked]) -> list[Scores]:
        return [score_ranking(self.units(fuse_routes(r)), q.gains) for q, r in zip(self.queries, self.routes,
                                                                                      strict=True)]

    def evaluate(self, fuse_routes: Callable[[QueryRoutes], Ranked]) -> Scores:
        return mean(self.per_query(fuse_routes))


def fuser(fusion: str, weights: tuple[float, ...], rrf_k: int = 60,
          focus_weight: float = 0.0) -> Callable[[QueryRoutes], Ranked]:
    """Weights (bm25, dense); (0, 1) or (1, 0) is a single route. The focus routes take `focus_weight`."""
    def fuse_routes(r: QueryRoutes) -> Ranked:
        routes, used = [r.bm25, r.dense], list(weights)
        if r.focus and focus_weight:
            routes, used = routes + list(r.focus), with_focus(used, focus_weight)
        if sorted(used) == [0.0, 1.0]:
            return routes[used.index(1.0)]
        cut = [Ranked(x.rows[:50], x.scores[:50]) for x in routes]
        return top(fuse(cut, used, fusion, rrf_k), CHUNK_DEPTH)
    return fuse_routes


def reranked(fuse_routes: Callable[[QueryRoutes], Ranked], retriever: HybridRetriever,
             reranker: Reranker) -> Callable[[QueryRoutes], Ranked]:
    """The fused ranking reordered by a reranker, as `HybridRetriever.run` does with one."""
    def rerank_routes(r: QueryRoutes) -> Ranked:
        hits = reranker.rerank(r.text, retriever.hits(fuse_routes(r)))
        return Ranked(np.asarray([h.row for h in hits], np.int64), np.asarray([h.score for h in hits], np.float32))
    return rerank_routes


ABLATION = (("rrf", (1.0, 1.0), 0.0), ("rrf", (0.5, 1.0), 0.0), ("rrf", (0.3, 1.0), 0.0),
            ("score", (0.5, 0.5), 0.0), ("score", (0.4, 0.6), 0.0), ("score", (0.3, 0.7), 0.0),
            ("score", (0.2, 0.8), 0.0), ("score", (0.0, 1.0), 0.3), ("score", (0.0, 1.0), 0.5),
            ("score", (0.3, 0.7), 0.2), ("score", (0.3, 0.7), 0.3), ("score", (0.3, 0.7), 0.5),
            ("score", (0.3, 0.7), 0.7))


@dataclass(frozen=True)
class RetrievalReport:
    dataset: str
    queries: int
    modes: dict[str, Scores]
    ablation: dict[str, Scores]

    def to_json(self) -> dict[str, object]:
        return {"dataset": self.dataset, "queries": self.queries,
                "modes": {name: s.to_json() for name, s in self.modes.items()}}


def rewritten(cache: RouteCache, kb: KnowledgeStore, fusion: str, weights: tuple[float, float],
              rewrite: Callable[[str], Rewrite]) -> Scores:
    """Hybrid with each question's model rewordings and hypothetical passage, as `search --expand --hyde` runs."""
    retriever = HybridRetriever(kb, RetrievalParams(mode="hybrid", fusion=fusion, bm25_weight=weights[0],
                                                dense_weight=weights[1]))
    scores = []
    for query in cache.queries:
        done = rewrite(query.text)
        ranked = retriever.rank(query.text, CHUNK_DEPTH, variants=done.variants, hypothesis=done.hypothesis)
        scores.append(score_ranking(cache.units(ranked), query.gains))
    return mean(scores)


def evaluate_retrieval(kb: KnowledgeStore, dataset: str, queries: Sequence[Query], fusion: str,
                       weights: tuple[float, float], ablation: bool = False,
                       focus_weight: float = 0.0, reranker: Reranker | None = None,
                       rewrite: Callable[[str], Rewrite] | None = None) -> RetrievalReport:
    """BM25, dense and hybrid (the configured fusion); with a reranker also "hybrid+rerank", the configured
    pipeline as `search` runs it; with `rewrite` (query -> model rewordings, hypothetical passage) also
    "hybrid+rewrite"."""
    needs_focus = bool(focus_weight) or (ablation and any(fw for _, _, fw in ABLATION))
    cache = RouteCache(kb, queries, "doc" if dataset == "pubmedqa" else "section", needs_focus)
    hybrid = fuser(fusion, weights, focus_weight=focus_weight)
    modes = {"bm25": cache.evaluate(fuser(fusion, (1.0, 0.0))), "dense": cache.evaluate(fuser(fusion, (0.0, 1.0))),
             "hybrid": cache.evaluate(hybrid)}
    if reranker is not None:
        modes["hybrid+rerank"] = cache.evaluate(reranked(hybrid, HybridRetriever(kb, RetrievalParams(
            fusion="rrf", bm25_weight=1.0, dense_weight=1.0)), reranker))
    if rewrite is not None:
        modes["hybrid+rewrite"] = rewritten(cache, kb, fusion, weights, rewrite)
    variants = {f"{f} bm25={w[0]} dense={w[1]}" + (f" focus={fw}" if fw else ""):
                cache.evaluate(fuser(f, w, focus_weight=fw)) for f, w, fw in ABLATION} if ablation else {}
    return RetrievalReport(dataset, len(queries), modes, variants)


def markdown_table(report: RetrievalReport) -> str:
    lines = [f"### {report.dataset} ({report.queries} queries)", "", "| route | Recall@10 | MRR | nDCG@10 |",
             "|---|---|---|---|"]
    for name, s in [*report.modes.items(), *report.ablation.items()]:
        lines.append(f"| {name} | {s.recall_at_10:.3f} | {s.mrr:.3f} | {s.ndcg_at_10:.3f} |")
    return "\n".join(lines) + "\n"
