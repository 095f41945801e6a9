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
from ebmrag.index import store
from ebmrag.index.fusion import Ranked, rrf, score_fusion, top
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.search import HybridRetriever

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


class RouteCache:
    """BM25 and dense route results for every query, computed once; fusion variants re-use them."""

    def __init__(self, kb: KnowledgeBase, queries: Sequence[Query], unit: str) -> None:
        self.kb, self.queries = kb, queries
        reader = kb.reader()
        rows = store.iter_chunks(reader.db)
        self.unit_of_row = [(c.section_id or c.doc_id) if unit == "section" else c.doc_id for c in rows]
        vectors = kb.embedder.embed([q.text for q in queries])
        bm25 = HybridRetriever(kb, "bm25", route_depth=CHUNK_DEPTH)
        dense = HybridRetriever(kb, "dense", route_depth=CHUNK_DEPTH)
        self.bm25 = [bm25.rank(q.text, CHUNK_DEPTH) for q in queries]
        self.dense = [dense.rank(q.text, CHUNK_DEPTH, query_vector=v) for q, v in zip(queries, vectors, strict=True)]

    def units(self, ranked: Ranked) -> list[str]:
        return list(dict.fromkeys(self.unit_of_row[r] for r in ranked.rows.tolist()))

    def evaluate(self, fuse: Callable[[Ranked, Ranked], Ranked]) -> Scores:
        return mean([score_ranking(self.units(fuse(b, d)), q.gains)
                     for q, b, d in zip(self.queries, self.bm25, self.dense, strict=True)])


def fuser(fusion: str, weights: tuple[float, float], rrf_k: int = 60) -> Callable[[Ranked, Ranked], Ranked]:
    def fuse(bm25: Ranked, dense: Ranked) -> Ranked:
        routes = [Ranked(bm25.rows[:50], bm25.scores[:50]), Ranked(dense.rows[:50], dense.scores[:50])]
        fused = rrf(routes, weights, rrf_k) if fusion == "rrf" else score_fusion(routes, weights)
        return top(fused, CHUNK_DEPTH)
    return fuse


ABLATION = (("rrf", (1.0, 1.0)), ("rrf", (0.5, 1.0)), ("rrf", (0.3, 1.0)), ("score", (0.5, 0.5)),
            ("score", (0.4, 0.6)), ("score", (0.3, 0.7)), ("score", (0.2, 0.8)))


@dataclass(frozen=True)
class RetrievalReport:
    dataset: str
    queries: int
    modes: dict[str, Scores]
    ablation: dict[str, Scores]

    def to_json(self) -> dict[str, object]:
        return {"dataset": self.dataset, "queries": self.queries,
                "modes": {name: s.to_json() for name, s in self.modes.items()}}


def evaluate_retrieval(kb: KnowledgeBase, dataset: str, queries: Sequence[Query], fusion: str,
                       weights: tuple[float, float], ablation: bool = False) -> RetrievalReport:
    cache = RouteCache(kb, queries, "doc" if dataset == "pubmedqa" else "section")
    modes = {"bm25": cache.evaluate(lambda b, d: b), "dense": cache.evaluate(lambda b, d: d),
             "hybrid": cache.evaluate(fuser(fusion, weights))}
    variants = {f"{f} bm25={w[0]} dense={w[1]}": cache.evaluate(fuser(f, w)) for f, w in ABLATION} if ablation else {}
    return RetrievalReport(dataset, len(queries), modes, variants)


def markdown_table(report: RetrievalReport) -> str:
    lines = [f"### {report.dataset} ({report.queries} queries)", "", "| route | Recall@10 | MRR | nDCG@10 |",
             "|---|---|---|---|"]
    for name, s in [*report.modes.items(), *report.ablation.items()]:
        lines.append(f"| {name} | {s.recall_at_10:.3f} | {s.mrr:.3f} | {s.ndcg_at_10:.3f} |")
    return "\n".join(lines) + "\n"
