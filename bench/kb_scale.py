"""Knowledge base at scale: build with parallel ingest, 10-document writes, segmented vs compacted queries.

Run (after building the LiveQA knowledge base, see docs/results/retrieval.md):
    python bench/kb_scale.py --base-kb KB --sizes 30000,1000000 --out docs/benchmarks.md

For each size, in its own subprocess (so peak memory is its own): build a knowledge base scaled from the
base one (bench/retrieval.py explains the scaling; embedding is a cheap stand-in and timed apart), then
add 10 documents 6 times (each write is one new segment: 10 segments in all at 1M), time each write, query
the segmented knowledge base, compact it, query again, and compare BM25 scores between the two layouts.
"""

from __future__ import annotations

import argparse
import json
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

from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.params import KnowledgeBaseConfig, StorageSettings
from ebmrag.ingest.documents import Document
from report import machine, write_section  # bench/ is on sys.path when a script here runs
from retrieval import QUERIES, ScaledEmbedder, base_corpus, base_titles, percentile_ms, scaled_retriever

WRITES = 6
REPEATS = 15


def scaled_documents(texts: list[str], titles: list[str], size: int) -> list[Document]:
    return [Document(f"d{i}", f"{texts[i % len(texts)]} copy{i // len(texts)}", "bench", "txt",
                     title=titles[i % len(texts)]) for i in range(size)]


def new_documents(texts: list[str], write: int) -> list[Document]:
    """10 page-long documents (five base chunks each, so a few chunks apiece) that the KB does not hold yet."""
    return [Document(f"new-{write}-{i}", "\n\n".join(texts[(write * 50 + i * 5 + j) % len(texts)] for j in range(5))
                     + f" copy{900 + write}", "nightly", "txt", title=f"update {write}.{i}") for i in range(10)]


def latency(kb: KnowledgeBase, query_vectors: np.ndarray) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for mode in ("bm25", "dense", "hybrid"):
        retriever = scaled_retriever(kb, mode=mode, fusion="score", bm25_weight=0.3, dense_weight=0.7)
        samples = []
        for repeat in range(REPEATS + 1):
            for query, vector in zip(QUERIES, query_vectors, strict=True):
                started = time.perf_counter()
                retriever.hits(retriever.rank(query, 10, query_vector=vector))
                if repeat:  # the first pass warms caches and memory maps
                    samples.append(time.perf_counter() - started)
        result[mode] = percentile_ms(samples, 50)
    return result


def top_bm25(kb: KnowledgeBase, depth: int = 200) -> dict[str, dict[str, float]]:
    """Per query: chunk id -> BM25 score of its `depth` best chunks (ids are layout-independent, rows are not)."""
    reader = kb.reader()
    found = {}
    for query in QUERIES:
        rows, scores = reader.lexical.search(kb.analyzer.terms(query), depth)
        chunks = reader.chunks_by_rows(rows.tolist())
        found[query] = {chunks[r].chunk_id: float(s) for r, s in zip(rows.tolist(), scores.tolist(), strict=True)}
    return found


def bm25_difference(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> float:
    """Largest score difference over chunks both lists hold (a tie at the cut may admit different chunks)."""
    worst = 0.0
    for query in QUERIES:
        shared = a[query].keys() & b[query].keys()
        worst = max([worst, *(abs(a[query][c] - b[query][c]) for c in shared)])
    return worst


def run_size(base_kb: Path, size: int, workdir: Path, workers: int) -> dict[str, Any]:
    texts, vectors = base_corpus(base_kb)
    titles = base_titles(base_kb)
    embedder = ScaledEmbedder({t: i for i, t in enumerate(texts)}, vectors)
    kb = KnowledgeBase(workdir / f"kb-{size}", KnowledgeBaseConfig(contextual_prefix=False, chunker="fixed"),
                       embedder=embedder, storage=StorageSettings(workers=workers))  # type: ignore[arg-type]
    started = time.perf_counter()
    build = kb.apply(scaled_documents(texts, titles, size))
    result: dict[str, Any] = {
        "size": size, "chunks": build.chunks_total, "workers": workers,
        "build_s": time.perf_counter() - started, "build_embedding_s": build.seconds_embedding,
        "build_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "segments_after_build": len(kb.reader().segments)}
    writes = []
    for write in range(WRITES):
        started = time.perf_counter()
        report = kb.apply(new_documents(texts, write))
        total = time.perf_counter() - started
        writes.append({"total_s": total, "embedding_s": report.seconds_embedding,
                       "without_embedding_s": total - report.seconds_embedding, "chunks": report.chunks_written})
    result["writes"] = writes
    result["write_without_embedding_p50_s"] = statistics.median(w["without_embedding_s"] for w in writes)
    query_vectors = embedder.embed([f"{texts[i * 7 % len(texts)]} copy0" for i in range(len(QUERIES))])
    started = time.perf_counter()
    kb.reader().lexical  # noqa: B018 - opening a new generation (graphs load) is timed apart from queries
    kb.reader().dense.search(query_vectors[0], 1)
    result["open_s"] = time.perf_counter() - started
    result["segments"] = len(kb.reader().segments)
    result["segmented_ms"] = latency(kb, query_vectors)
    segmented_bm25 = top_bm25(kb)
    started = time.perf_counter()
    kb.compact()
    result["compact_s"] = time.perf_counter() - started
    result["compacted_ms"] = latency(kb, query_vectors)
    result["bm25_max_difference"] = bm25_difference(segmented_bm25, top_bm25(kb))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["disk_mb"] = sum(f.stat().st_size for f in kb.root.rglob("*") if f.is_file()) / 2**20
    return result


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [f"## Knowledge base at scale ({date.today().isoformat()})", "", machine(), "",
             "Command: `python bench/kb_scale.py --base-kb KB --sizes 30000,1000000 --out docs/benchmarks.md` "
             "(KB = the LiveQA knowledge base). Embedding is a stand-in (base vectors plus noise) and timed apart.",
             f"A write adds 10 documents ({WRITES} writes, median); latency is p50 over {len(QUERIES)} queries x "
             f"{REPEATS} repeats, one thread, without query embedding.", "",
             "| chunks | build (workers) | build peak RSS MB (parent / largest worker) | 10-doc write s, without "
             "embedding | segments | BM25 / dense / hybrid p50 ms, segmented | compacted | compact s | "
             "max BM25 difference |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seg, com = r["segmented_ms"], r["compacted_ms"]
        lines.append(
            f"| {r['chunks']:,} | {r['build_s'] / 60:.1f} min ({r['workers']}) | {r['build_peak_rss_mb']:,.0f} / "
            f"{r['worker_peak_rss_mb']:,.0f} | {r['write_without_embedding_p50_s']:.2f} | {r['segments']} | "
            f"{seg['bm25']:.2f} / {seg['dense']:.2f} / {seg['hybrid']:.2f} | {com['bm25']:.2f} / {com['dense']:.2f} / "
            f"{com['hybrid']:.2f} | {r['compact_s']:.0f} | {r['bm25_max_difference']:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-kb", type=Path, required=True)
    parser.add_argument("--sizes", default="30000")
    parser.add_argument("--workers", type=int, default=0, help="ingest worker processes (0: one per core)")
    parser.add_argument("--one-size", type=int, help="measure one size and print its JSON line")
    parser.add_argument("--size-json", type=Path, action="append", default=[],
                        help="include a size measured earlier with --one-size (its JSON output file)")
    parser.add_argument("--workdir", type=Path, help="where to build (default: a temporary folder)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one_size:
        with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
            print(json.dumps(run_size(args.base_kb, args.one_size, Path(workdir), args.workers)))
        return
    rows = [json.loads(path.read_text().strip().splitlines()[-1]) for path in args.size_json]
    for size in (int(s) for s in args.sizes.split(",") if s):
        command = [sys.executable, __file__, "--base-kb", str(args.base_kb), "--one-size", str(size),
                   "--workers", str(args.workers)] + (["--workdir", str(args.workdir)] if args.workdir else [])
        rows.append(json.loads(subprocess.run(command, check=True, capture_output=True, text=True)
                               .stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    rows.sort(key=lambda row: row["size"])
    text = markdown(rows)
    print(text)
    if args.out:
        write_section(args.out, "kb-scale", text)


if __name__ == "__main__":
    main()
