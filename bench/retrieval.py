"""Retrieval speed: embedding and indexing throughput, query latency at 10k / 100k / 1M chunks, size, memory.

Run (after building the LiveQA knowledge base, see docs/results/retrieval.md):
    python bench/retrieval.py --base-kb KB --sizes 10000,100000,1000000 --out docs/benchmarks.md

Scale-up is synthetic from the real corpus: chunk texts of the base knowledge base are repeated
with a copy number appended, and each copy's vector is the base chunk's real vector plus Gaussian
noise (renormalised), so term statistics and vector geometry stay realistic. Every size is built
and queried through the real ingest path (chunking, analysis, SQLite, BM25, HNSW) in its own
subprocess, so its peak memory is its own. Query latency excludes query embedding (timed apart).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.compose import Resources, build_retriever
from ebmrag.config import Settings, with_overrides
from ebmrag.index.kb import IngestReport, KnowledgeBase
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.ingest.documents import Document
from ebmrag.retrieve.search import HybridRetriever
from report import write_section  # bench/ is on sys.path when a script here runs

QUERIES = ("symptoms of polycystic ovary syndrome", "is amphetamine gluten free", "treatment for syphilis",
           "what causes high blood pressure in children", "side effects of metformin", "how is lupus diagnosed",
           "genetic changes in cystic fibrosis", "prevention of stroke after heart attack")

FOCUS_WEIGHT = 0.3  # the "hybrid+focus" latency: the focus share measured in docs/results/retrieval.md (opt-in)


class ScaledEmbedder:
    """Real base vectors plus noise, keyed by the text's copy number: the stand-in that makes 1M chunks feasible."""

    def __init__(self, base_text: dict[str, int], vectors: npt.NDArray[np.float32],
                 model_name: str = "bench-scaled") -> None:
        """`model_name`: the base knowledge base's model, whose vectors these are (plus noise), so a reader that
        queries with that model (bench/ask.py) is accepted."""
        self.base_text, self.vectors = base_text, vectors
        self.model_name = model_name
        self.dimension = int(vectors.shape[1])

    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = np.empty((len(texts), self.dimension), np.float32)
        for i, text in enumerate(texts):
            match = re.search(r" copy(\d+)$", text)
            body, copy = (text[:match.start()], int(match.group(1))) if match else (text, len(text))
            base = self.vectors[self.base_text.get(body, hash(body) % len(self.vectors))]
            noise = np.random.default_rng(copy).normal(0, 0.02, self.dimension).astype(np.float32)
            vector = base + noise
            out[i] = vector / np.linalg.norm(vector)
        return out

    def warm_up(self) -> None:
        return None


def base_corpus(kb_dir: Path) -> tuple[list[str], npt.NDArray[np.float32]]:
    kb = KnowledgeBase(kb_dir)
    reader = kb.reader()
    rows = list(reader.iter_chunks())
    return [row.text for row in rows], reader.dense.vectors_at([row.row for row in rows])


def base_titles(kb_dir: Path) -> list[str]:
    """Each base chunk's document title, so the scaled knowledge base has real titles for the focus extractor."""
    reader = KnowledgeBase(kb_dir).reader()
    titles = {doc_id: row.title for doc_id, row in reader.documents().items()}
    return [titles.get(row.doc_id, "") for row in reader.iter_chunks()]


def percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000, q))


def scaled_retriever(kb: KnowledgeBase, **retrieval: Any) -> HybridRetriever:
    """The retriever the composition root builds over `kb` with these [retrieval] settings (no reranker); its
    cache directory is the knowledge base's folder's (a temporary one), so nothing from the user's is read."""
    settings = with_overrides(Settings(), models={"cache_dir": str(kb.root.parent / "cache")}, retrieval=retrieval)
    return build_retriever(Resources(settings, kb))


def build_scaled_kb(base_kb: Path, size: int, root: Path) -> tuple[KnowledgeBase, IngestReport, float]:
    """`size` one-chunk documents scaled from the base KB (see the module note); returns the KB, report, seconds."""
    texts, vectors = base_corpus(base_kb)
    titles = base_titles(base_kb)
    model = str(KnowledgeBase(base_kb).reader().manifest["embedding_model"])
    embedder = ScaledEmbedder({t: i for i, t in enumerate(texts)}, vectors, model)
    docs = [Document(f"d{i}", f"{texts[i % len(texts)]} copy{i // len(texts)}", "bench", "txt",
                     title=titles[i % len(texts)]) for i in range(size)]
    kb = KnowledgeBase(root, KnowledgeBaseConfig(contextual_prefix=False, chunker="fixed"),
                       embedder=embedder)  # type: ignore[arg-type]
    started = time.perf_counter()
    report = kb.apply(docs)
    return kb, report, time.perf_counter() - started


def run_size(base_kb: Path, size: int, workdir: Path) -> dict[str, Any]:
    kb, report, total = build_scaled_kb(base_kb, size, workdir / f"kb-{size}")
    texts, _ = base_corpus(base_kb)
    embedder = kb.embedder
    result: dict[str, Any] = {"size": size, "chunks": report.chunks_total,
                              "index_chunks_per_s": report.chunks_total / max(report.seconds_indexing, 1e-9),
                              "ingest_s": total, "indexing_s": report.seconds_indexing}
    query_vectors = embedder.embed([f"{texts[i * 7 % len(texts)]} copy0" for i in range(len(QUERIES))])
    for mode in ("bm25", "dense", "hybrid", "hybrid+focus"):
        retriever = scaled_retriever(kb, mode=mode.split("+")[0], fusion="score", bm25_weight=0.3, dense_weight=0.7,
                                     focus_weight=FOCUS_WEIGHT if mode.endswith("focus") else 0.0)
        retriever.rank(QUERIES[0], 10)  # the focus extractor is built once per generation (timed apart)
        samples = []
        for repeat in range(25):
            for query, vector in zip(QUERIES, query_vectors, strict=True):
                t0 = time.perf_counter()
                retriever.hits(retriever.rank(query, 10, query_vector=vector))
                if repeat:  # the first pass warms caches and memory maps
                    samples.append(time.perf_counter() - t0)
        result[mode] = {"p50_ms": percentile_ms(samples, 50), "p95_ms": percentile_ms(samples, 95)}
    live = kb.reader().path
    result["disk_mb"] = sum(f.stat().st_size for f in live.rglob("*") if f.is_file()) / 2**20
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def rank_bm25_comparison(base_kb: Path, size: int) -> dict[str, float]:
    from rank_bm25 import BM25Okapi

    from ebmrag.index.analyzer import Analyzer
    from ebmrag.index.lexical import LexicalIndex

    texts, _ = base_corpus(base_kb)
    analyzer = Analyzer()
    base_terms = [analyzer.terms(text) for text in texts]
    corpus = [[*base_terms[i % len(texts)], f"copy{i // len(texts)}"] for i in range(size)]
    ours = LexicalIndex()
    ours.build(corpus)
    reference = BM25Okapi(corpus)
    queries = [analyzer.terms(q) for q in QUERIES]
    t0 = time.perf_counter()
    for q in queries * 5:
        ours.search(q, 10)
    ours_s = (time.perf_counter() - t0) / (len(queries) * 5)
    t0 = time.perf_counter()
    for q in queries:
        scores = reference.get_scores(q)
        np.argsort(-scores)[:10]
    reference_s = (time.perf_counter() - t0) / len(queries)
    return {"size": size, "ours_ms": ours_s * 1000, "rank_bm25_ms": reference_s * 1000,
            "speedup": reference_s / ours_s}


def embedding_throughput(base_kb: Path, n: int = 256) -> list[dict[str, Any]]:
    from ebmrag.models.embeddings import SentenceEmbedder

    texts, _ = base_corpus(base_kb)
    long_texts = [t for t in texts if len(t.split()) >= 150][:n]
    reference = None
    rows = []
    for label, max_tokens, precision, batch in (
            ("fp32, 256 tokens", 256, "fp32", 64), ("fp32, 128 tokens", 128, "fp32", 64),
            ("int8, 128 tokens", 128, "int8", 64), ("bf16, 128 tokens", 128, "bf16", 64),
            ("bf16, 128 tokens, batch 32", 128, "bf16", 32)):
        embedder = SentenceEmbedder(max_tokens=max_tokens, precision=precision, batch_size=batch)
        embedder.warm_up()
        t0 = time.perf_counter()
        vectors = embedder.embed(long_texts)
        seconds = time.perf_counter() - t0
        reference = vectors if reference is None else reference
        cosine = float(np.mean(np.sum(vectors * reference, axis=1)))
        words = statistics.mean(len(t.split()) for t in long_texts)
        rows.append({"profile": label, "chunks_per_s": len(long_texts) / seconds, "mean_words": words,
                     "cosine_to_fp32_256": cosine})
    return rows


def markdown(sizes: list[dict[str, Any]], bm25: dict[str, float], embedding: list[dict[str, Any]]) -> str:
    lines = [f"## Retrieval ({date.today().isoformat()}, {platform.processor() or platform.machine()}, "
             f"{platform.python_version()}, 2 cores)", "",
             "Command: `python bench/retrieval.py --base-kb KB --sizes 10000,100000,1000000 --out docs/benchmarks.md`",
             "(KB = the LiveQA knowledge base of docs/results/retrieval.md). Latency excludes query embedding;",
             "medians (p50) and p95 over 8 queries x 24 repeats, one thread.", "",
             "| chunks | BM25 p50 / p95 ms | dense p50 / p95 ms | hybrid p50 / p95 ms | indexing chunks/s | disk MB "
             "| peak RSS MB |", "|---|---|---|---|---|---|---|"]
    for r in sizes:
        lines.append(f"| {r['chunks']:,} | {r['bm25']['p50_ms']:.2f} / {r['bm25']['p95_ms']:.2f} "
                     f"| {r['dense']['p50_ms']:.2f} / {r['dense']['p95_ms']:.2f} "
                     f"| {r['hybrid']['p50_ms']:.2f} / {r['hybrid']['p95_ms']:.2f} | {r['index_chunks_per_s']:,.0f} "
                     f"| {r['disk_mb']:.0f} | {r['peak_rss_mb']:.0f} |")
    lines += ["", f"BM25 side by side at {bm25['size']:,} chunks: ours {bm25['ours_ms']:.2f} ms/query, rank_bm25 "
              f"{bm25['rank_bm25_ms']:.1f} ms/query: {bm25['speedup']:.0f}x.", "",
              "| embedding profile | chunks/s (~200-word chunks) | mean cosine to fp32/256 |", "|---|---|---|"]
    lines += [f"| {r['profile']} | {r['chunks_per_s']:.1f} | {r['cosine_to_fp32_256']:.3f} |" for r in embedding]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-kb", type=Path, required=True)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--bm25-compare-size", type=int, default=100_000)
    parser.add_argument("--one-size", type=int, help="measure one size and print its JSON line (what --sizes runs)")
    parser.add_argument("--size-json", type=Path, action="append", default=[],
                        help="include a size measured earlier with --one-size (its JSON output file)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one_size:
        with tempfile.TemporaryDirectory() as workdir:
            print(json.dumps(run_size(args.base_kb, args.one_size, Path(workdir))))
        return
    sizes = [json.loads(path.read_text().strip().splitlines()[-1]) for path in args.size_json]
    for size in (int(s) for s in args.sizes.split(",") if s):
        output = subprocess.run([sys.executable, __file__, "--base-kb", str(args.base_kb), "--one-size", str(size)],
                                check=True, capture_output=True, text=True).stdout
        sizes.append(json.loads(output.strip().splitlines()[-1]))
        print(json.dumps(sizes[-1]), flush=True)
    sizes.sort(key=lambda row: row["size"])
    bm25 = rank_bm25_comparison(args.base_kb, args.bm25_compare_size)
    embedding = embedding_throughput(args.base_kb)
    text = markdown(sizes, bm25, embedding)
    print(text)
    if args.out:
        write_section(args.out, "retrieval", text)


if __name__ == "__main__":
    main()
