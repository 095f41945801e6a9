"""The peer inside the evaluation: LlamaIndex's documented hybrid against ebmrag on LiveQA-Med, one scorer.

    pip install -e '.[peer]'
    python bench/peer_llamaindex.py --data-root ../shared/data --kb /tmp/kb-liveqa [--config ebmrag.toml] \\
        [--split tune|check|all] [--peer-model minilm-medquad] [--json] [--out docs/results/peer.md]

LlamaIndex side (its own defaults where the documentation shows none): every corpus section becomes a
`Document` (title and section as metadata, which LlamaIndex puts in front of the text it embeds) ->
`SentenceSplitter(chunk_size)` -> `VectorStoreIndex` + `BM25Retriever` (bm25s, English stemming) ->
`QueryFusionRetriever(num_queries=1, mode)`; each route's top 50 chunks, chunks mapped to sections, a section
ranked by its best chunk: exactly how `ebmrag eval retrieval` scores its own routes. The embedding model is the
bundled MiniLM through ebmrag's embedder (same weights, length and precision); `--peer-model` gives LlamaIndex
another profile (for example the adapted one, to separate the model's share of a gain from the rest).
ebmrag side: the knowledge base at `--kb` with the configuration's retrieval settings. Paired per-query bootstrap
(10,000 resamples) of the nDCG@10 difference, 95 % percentile interval.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from llama_index.core import Document as LlamaDocument
from llama_index.core import VectorStoreIndex
from llama_index.core.llms.mock import MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.retrievers.bm25 import BM25Retriever

from ebmrag.compose import Resources, build_retriever
from ebmrag.config import load_settings
from ebmrag.eval.retrieval import RouteCache, fuser, liveqa_queries, reranked, score_ranking, select_split
from ebmrag.ingest.readers import read_file
from ebmrag.integrations.llamaindex import EbmragEmbedding
from ebmrag.models.embeddings import SentenceEmbedder

CORPUS = ("medquad/medquad_docs.jsonl", "liveqa_med_2017/judged_answers_medquad_2479.jsonl")
MODES = ("reciprocal_rerank", "relative_score", "dist_based_score")


def section_documents(data_root: Path) -> list[LlamaDocument]:
    """One LlamaIndex document per answer section, read by ebmrag's own reader (the same text it indexes)."""
    out = []
    for name in CORPUS:
        for doc in read_file(data_root / name, name).documents:
            for section in doc.sections:
                out.append(LlamaDocument(
                    text=doc.text[section.start:section.end], metadata={
                        "title": doc.title, "section": section.title, "unit": section.section_id or doc.doc_id},
                    excluded_embed_metadata_keys=["unit"], excluded_llm_metadata_keys=["unit"]))
    return out


def llamaindex_rankings(docs: list[LlamaDocument], queries: list[Any], embedder: SentenceEmbedder,
                        chunk_size: int) -> dict[str, list[list[str]]]:
    splitter = SentenceSplitter(chunk_size=chunk_size, chunk_overlap=min(200, chunk_size // 5))
    nodes = splitter.get_nodes_from_documents(docs)
    started = time.perf_counter()
    index = VectorStoreIndex(nodes, embed_model=EbmragEmbedding(embedder))
    logging.info("LlamaIndex chunk_size %d: %d nodes indexed in %.0f s", chunk_size, len(nodes),
                 time.perf_counter() - started)
    routes = [index.as_retriever(similarity_top_k=50), BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=50)]
    out: dict[str, list[list[str]]] = {}
    for mode in MODES:
        fusion = QueryFusionRetriever(routes, llm=MockLLM(), mode=mode, num_queries=1,  # type: ignore[arg-type]
                                      similarity_top_k=50, use_async=False)
        out[f"llamaindex {mode} chunk={chunk_size}"] = [
            list(dict.fromkeys(n.node.metadata["unit"] for n in fusion.retrieve(q.text))) for q in queries]
    return out


def bootstrap(ours: np.ndarray, theirs: np.ndarray, n: int = 10_000, seed: int = 7) -> tuple[float, float, float]:
    """Mean paired difference and its 95 % percentile interval over resampled queries."""
    diff = ours - theirs
    picks = np.random.default_rng(seed).integers(0, len(diff), size=(n, len(diff)))
    means = diff[picks].mean(axis=1)
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--kb", type=Path, required=True)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--split", default="all", help="all, tune or check; a comma list reports each")
    parser.add_argument("--chunk-sizes", default="1024,256")
    parser.add_argument("--peer-model", default="", help="embedding profile for LlamaIndex (default: bundled)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    settings = load_settings(args.config)
    queries = liveqa_queries(args.data_root / "liveqa_med_2017")
    resources = Resources.open(settings, args.kb)
    kb = resources.knowledge_base
    assert kb is not None
    r = settings.retrieval
    cache = RouteCache(kb, queries, "section")
    hybrid = fuser(r.fusion, (r.bm25_weight, r.dense_weight), r.rrf_k, r.focus_weight)
    ours = {"ebmrag dense": cache.per_query(fuser(r.fusion, (0.0, 1.0))),
            "ebmrag hybrid": cache.per_query(hybrid)}
    retriever = build_retriever(resources)  # the configured one; its reranker reorders the fused ranking
    if retriever.reranker is not None:
        ours["ebmrag hybrid+rerank"] = cache.per_query(reranked(hybrid, retriever, retriever.reranker))
    peer_embedder = SentenceEmbedder(args.peer_model or None, cache_dir=kb.embedder.cache_dir,
                                     max_tokens=kb.config.embedding_max_tokens,
                                     precision=kb.config.embedding_precision)
    docs = section_documents(args.data_root)
    theirs: dict[str, list[list[str]]] = {}
    for size in (int(s) for s in args.chunk_sizes.split(",")):
        theirs.update(llamaindex_rankings(docs, queries, peer_embedder, size))
    peer = {name: [score_ranking(units, q.gains) for units, q in zip(rankings, queries, strict=True)]
            for name, rankings in theirs.items()}
    for split in args.split.split(","):
        chosen = {q.query_id for q in select_split(queries, split)}
        keep = [i for i, q in enumerate(queries) if q.query_id in chosen]
        report(args, split, [queries[i] for i in keep], {n: [s[i] for i in keep] for n, s in ours.items()},
               {n: [s[i] for i in keep] for n, s in peer.items()})


def report(args: argparse.Namespace, split: str, queries: list[Any], ours: dict[str, list[Any]],
           peer: dict[str, list[Any]]) -> None:
    ndcg = {name: np.array([s.ndcg_at_10 for s in scores]) for name, scores in {**ours, **peer}.items()}
    best_peer = max(peer, key=lambda name: ndcg[name].mean())
    rows: dict[str, dict[str, Any]] = {name: {"ndcg@10": round(float(v.mean()), 4)} for name, v in ndcg.items()}
    for name in ours:
        diff, low, high = bootstrap(ndcg[name], ndcg[best_peer])
        rows[name].update({"vs_best_peer": round(diff, 4), "ci95": [round(low, 4), round(high, 4)]})
    result = {"split": split, "queries": len(queries), "best_peer": best_peer, "routes": rows,
              "peer_model": args.peer_model or "bundled"}
    lines = [f"### LiveQA-Med, split {split} ({len(queries)} questions), LlamaIndex model "
             f"{args.peer_model or 'bundled MiniLM'}", "", "| route | nDCG@10 | vs best LlamaIndex (95 % CI) |",
             "|---|---|---|"]
    for name, row in rows.items():
        ci = f"{row['vs_best_peer']:+.4f} [{row['ci95'][0]:+.4f}, {row['ci95'][1]:+.4f}]" if "ci95" in row else ""
        lines.append(f"| {name} | {row['ndcg@10']:.4f} | {ci} |")
    table = "\n".join(lines) + "\n"
    if args.out:
        with args.out.open("a", encoding="utf-8") as handle:
            handle.write(table + "\n")
    print(json.dumps(result, indent=2) if args.json else table)


if __name__ == "__main__":
    main()
