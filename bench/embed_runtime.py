"""Embedding runtimes side by side: torch (sentence-transformers) against ONNX Runtime, fp32 and int8, in one run.

Run: python bench/embed_runtime.py --data-root ../shared/data [--out docs/benchmarks.md]

Texts: the first 1,000 MTSamples sentences (../shared/data/text_corpora) in the order of sha256 of their ids.
Each row embeds all of them through `SentenceEmbedder.embed` on a fresh embedder (empty vector cache, no disk cache,
its model loaded and its ONNX graph built before the clock starts), median of `--runs`. Quality is the cosine of
each sentence's vector to torch fp32's, the reference (minimum and mean over the sentences). "torch auto" is the
torch path as it ran before the onnx runtime: bf16 where the CPU has it natively, else fp32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

from ebmrag.models.embeddings import SentenceEmbedder
from report import emit, machine, sentences  # bench/ is on sys.path when a script here runs

EN_FILE = "mtsamples_sections_shared.jsonl"
COMMAND = "python bench/embed_runtime.py --data-root ../shared/data --out docs/benchmarks.md"
PROFILES = (("torch", "fp32"), ("torch", "auto"), ("onnx", "fp32"), ("onnx", "int8"))


def timed_runs(runtime: str, precision: str, texts: list[str], runs: int,
               batch_size: int) -> tuple[list[float], np.ndarray, str]:
    """Seconds per run (a fresh embedder each, loaded before the clock), the last run's vectors, and the
    precision the profile resolved to."""
    seconds, vectors, resolved = [], np.zeros((0, 0), np.float32), precision
    for _ in range(runs):
        embedder = SentenceEmbedder(runtime=runtime, precision=precision, batch_size=batch_size)
        embedder.warm_up()
        resolved = embedder.precision
        start = time.perf_counter()
        vectors = embedder.embed(texts)
        seconds.append(time.perf_counter() - start)
    return seconds, vectors, resolved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=1000, help="sentences (default 1,000)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = sentences(args.data_root / "text_corpora" / EN_FILE, args.limit)
    results: dict[tuple[str, str], tuple[list[float], np.ndarray, str]] = {}
    for runtime, precision in PROFILES:
        print(f"timing {runtime} {precision}: {len(texts):,} sentences x {args.runs} runs", file=sys.stderr)
        results[runtime, precision] = timed_runs(runtime, precision, texts, args.runs, args.batch_size)
    reference = results["torch", "fp32"][1]
    baseline = len(texts) / statistics.median(results["torch", "auto"][0])
    lines = [f"{machine()} (nproc {len(os.sched_getaffinity(0))}). Date: {date.today().isoformat()}. "
             f"Command: `{COMMAND}{'' if args.limit == 1000 else f' --limit {args.limit}'}`; "
             f"{len(texts):,} MTSamples sentences, batch {args.batch_size}, median of {args.runs} runs, "
             "each on a fresh embedder loaded before the clock.", "",
             "| runtime | precision | sentences/s | × torch auto | cosine to torch fp32, min | mean |",
             "|---|---|---|---|---|---|"]
    for (runtime, precision), (seconds, vectors, resolved) in results.items():
        rate = len(texts) / statistics.median(seconds)
        cosines = np.sum(vectors * reference, axis=1)
        label = precision if precision == resolved else f"{precision} ({resolved})"
        lines.append(f"| {runtime} | {label} | {rate:,.0f} | {rate / baseline:.2f} | "
                     f"{cosines.min():.5f} | {cosines.mean():.5f} |")
    emit(args.out, "embed-runtime", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
