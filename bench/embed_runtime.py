"""Embedding runtimes side by side: torch (sentence-transformers) against ONNX Runtime, fp32 and int8, in one run.

Run: python bench/embed_runtime.py --data-root ../shared/data [--out docs/benchmarks.md]

Texts: the first 1,000 MTSamples sentences (../shared/data/text_corpora) in the order of sha256 of their ids.
Each row embeds all of them through `SentenceEmbedder.embed` on a fresh embedder (empty vector cache, no disk cache,
its model loaded and its ONNX graph built before the clock starts), median of `--runs`, in the embedder's own batches
(longest first, at most `--batch-size` texts and the runtime's padded-token budget, embeddings.BATCH_TOKENS). Quality
is the cosine of each sentence's vector to torch fp32's, the reference (minimum and mean over the sentences). "torch
auto" is the torch path as it ran before the onnx runtime: bf16 where the CPU has it natively, else fp32. The CPU
time other processes took while the clock ran is printed under the table (Linux): on a shared machine it says how
far to trust the rates.
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

from ebmrag.models.embeddings import BATCH_TOKENS, SentenceEmbedder
from report import emit, machine, sentences  # bench/ is on sys.path when a script here runs

EN_FILE = "mtsamples_sections_shared.jsonl"
COMMAND = "python bench/embed_runtime.py --data-root ../shared/data --out docs/benchmarks.md"
PROFILES = (("torch", "fp32"), ("torch", "auto"), ("onnx", "fp32"), ("onnx", "int8"))


class OthersClock:
    """CPU seconds the machine spent outside this process while the clock ran (None where /proc/stat is not)."""

    def __init__(self) -> None:
        self.seconds: float | None = 0.0
        self._start: tuple[float, float] | None = None

    @staticmethod
    def _now() -> tuple[float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                ticks = [int(field) for field in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        own = os.times()
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), own.user + own.system

    def __enter__(self) -> None:
        self._start = self._now()

    def __exit__(self, *exc: object) -> None:
        end = self._now()
        if end is None or self._start is None or self.seconds is None:
            self.seconds = None
            return
        self.seconds += max(0.0, (end[0] - self._start[0]) - (end[1] - self._start[1]))


def timed_runs(runtime: str, precision: str, texts: list[str], runs: int, batch_size: int,
               batch_tokens: int | None, others: OthersClock) -> tuple[list[float], np.ndarray, str]:
    """Seconds per run (a fresh embedder each, loaded before the clock), the last run's vectors, and the
    precision the profile resolved to."""
    seconds, vectors, resolved = [], np.zeros((0, 0), np.float32), precision
    for _ in range(runs):
        embedder = SentenceEmbedder(runtime=runtime, precision=precision, batch_size=batch_size,
                                    batch_tokens=batch_tokens)
        embedder.warm_up()
        resolved = embedder.precision
        with others:
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
    parser.add_argument("--batch-tokens", type=int, help="padded tokens per batch (default: the runtime's)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = sentences(args.data_root / "text_corpora" / EN_FILE, args.limit)
    results: dict[tuple[str, str], tuple[list[float], np.ndarray, str]] = {}
    others = OthersClock()
    for runtime, precision in PROFILES:
        print(f"timing {runtime} {precision}: {len(texts):,} sentences x {args.runs} runs", file=sys.stderr)
        results[runtime, precision] = timed_runs(runtime, precision, texts, args.runs, args.batch_size,
                                                 args.batch_tokens, others)
    reference = results["torch", "fp32"][1]
    budget = (f"{args.batch_tokens:,}" if args.batch_tokens else
              " / ".join(f"{tokens:,} ({runtime})" for runtime, tokens in BATCH_TOKENS.items()))
    baseline = len(texts) / statistics.median(results["torch", "auto"][0])
    lines = [f"{machine()} (nproc {len(os.sched_getaffinity(0))}). Date: {date.today().isoformat()}. "
             f"Command: `{COMMAND}{'' if args.limit == 1000 else f' --limit {args.limit}'}`; "
             f"{len(texts):,} MTSamples sentences, batches of at most {args.batch_size} texts and "
             f"{budget} padded tokens, median of {args.runs} runs, each on a fresh embedder loaded before the clock.",
             "", f"| runtime | precision | sentences/s | × torch auto ({results['torch', 'auto'][2]}) | "
             "cosine to torch fp32, min | mean |",
             "|---|---|---|---|---|---|"]
    for (runtime, precision), (seconds, vectors, resolved) in results.items():
        rate = len(texts) / statistics.median(seconds)
        cosines = np.sum(vectors * reference, axis=1)
        label = precision if precision == resolved else f"{precision} ({resolved})"
        lines.append(f"| {runtime} | {label} | {rate:,.0f} | {rate / baseline:.2f} | "
                     f"{cosines.min():.5f} | {cosines.mean():.5f} |")
    clocked = sum(sum(seconds) for seconds, _, _ in results.values())
    if others.seconds is not None:
        lines += ["", f"Other processes used {others.seconds:,.1f} CPU seconds while the clock ran "
                      f"({others.seconds / clocked / (os.cpu_count() or 1):.0%} of the machine)."]
    emit(args.out, "embed-runtime", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
