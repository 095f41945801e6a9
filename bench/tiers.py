"""Tiering speed: `TierClassifier.classify_many` over real sentences, cold, median of 5 runs.

Run: python bench/tiers.py --data-root ../shared/data [--out docs/benchmarks.md]

Texts: 5,000 MTSamples sentences and 1,000 cEHRNER sentences (../shared/data/text_corpora), the first in the order
of sha256 of their ids (a fixed spread over the notes), and a 20,000-fragment chart of those 6,000 sentences
repeated and shuffled (seed 0), each classified in one `classify_many` call as the packer does for a record.
The classifier is the default one as the composition root builds it for the packer (the configured rules, the
configured tier model over the embedding model, the critical-fact recogniser where rules are unsure) without its
disk store; cold = a fresh classifier over a fresh
embedder with no cache, built and its model loaded before the clock starts, for every run of every row, so each
text no rule speaks for is embedded inside the timing. The same texts with the rules alone are timed beside it.
Exits 1 when the default classifier's cold median on the 6,000 sentences exceeds `--limit-ms` a fragment (0.2).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

from ebmrag.compose.resources import load_recogniser
from ebmrag.config import Settings, load_settings
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.models.text_classifier import load_text_classifier
from ebmrag.records.fragment import TierDecision
from report import emit, machine, sentences  # bench/ is on sys.path when a script here runs

EN_FILE, ZH_FILE = "mtsamples_sections_shared.jsonl", "zh_cehrner_sentences_shared.jsonl"
COMMAND = "python bench/tiers.py --data-root ../shared/data --out docs/benchmarks.md"

Items = list[tuple[str, str | None]]


def default_classifier(settings: Settings) -> TierClassifier:
    """The packer's classifier as compose.Resources builds it, without the disk store, over a fresh embedder that
    keeps nothing on disk; its model is loaded here, before any timing."""
    m = settings.models
    embedder = SentenceEmbedder(m.embedding_model or None)
    embedder.warm_up()
    tier_model = BUNDLED_TIER_MODEL if m.tier_model == "bundled" else m.tier_model
    return TierClassifier(m.tier_rules or None, load_text_classifier(tier_model, embedder) if tier_model else None,
                          recogniser=load_recogniser(m.recogniser, m.embedding_threads))


def rules_only(settings: Settings) -> TierClassifier:
    return TierClassifier(settings.models.tier_rules or None)


def cold_seconds(build: Callable[[], TierClassifier], items: Items, runs: int) -> tuple[list[float], int]:
    """Seconds of one `classify_many` call per run, each on a fresh classifier, and the decisions the model took."""
    seconds, by_model = [], 0
    for _ in range(runs):
        classifier = build()
        started = time.perf_counter()
        decisions: list[TierDecision] = classifier.classify_many(items)
        seconds.append(time.perf_counter() - started)
        by_model = sum(d.rule_id.startswith("model:") for d in decisions)
    return seconds, by_model


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def row(name: str, items: Sequence[tuple[str, str | None]], default: list[float], by_model: int,
        rules: list[float]) -> str:
    n = len(items)
    distinct = len({text for text, _ in items})
    return (f"| {name} | {n:,} | {distinct:,} | {by_model:,} | {1000 * statistics.median(default) / n:.3f} | "
            f"{statistics.median(default):.2f} | {1000 * statistics.median(rules) / n:.3f} | "
            f"{statistics.median(rules):.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--english", type=int, default=5000)
    parser.add_argument("--chinese", type=int, default=1000)
    parser.add_argument("--chart", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit-ms", type=float, default=0.2)
    parser.add_argument("--config", type=Path, help="TOML settings; default: the built-in defaults")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = args.data_root / "text_corpora"
    settings = load_settings(args.config)
    english: Items = [(text, None) for text in sentences(folder / EN_FILE, args.english)]
    chinese: Items = [(text, None) for text in sentences(folder / ZH_FILE, args.chinese)]
    both: Items = [*english, *chinese]
    pool = both * (args.chart // len(both) + 1)
    random.Random(0).shuffle(pool)
    chart = pool[:args.chart]

    def build() -> TierClassifier:
        return default_classifier(settings)

    def rules() -> TierClassifier:
        return rules_only(settings)

    timed: dict[str, tuple[list[float], int, list[float]]] = {}
    for name, items in (("en", english), ("zh", chinese), ("chart", chart)):
        print(f"timing {name}: {len(items):,} fragments x {args.runs} runs", file=sys.stderr)
        timed[name] = (*cold_seconds(build, items, args.runs), cold_seconds(rules, items, args.runs)[0])
    slice_runs = [a + b for a, b in zip(timed["en"][0], timed["zh"][0], strict=True)]
    slice_rules = [a + b for a, b in zip(timed["en"][2], timed["zh"][2], strict=True)]
    per_fragment = 1000 * statistics.median(slice_runs) / len(both)
    chart_seconds = statistics.median(timed["chart"][0])
    lines = [f"{machine()} (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}. Date: {date.today().isoformat()}. "
             f"Command: `{COMMAND}`; median of {args.runs} runs, each on a fresh classifier (cold: no disk store, "
             "an empty embedding cache, the model loaded before the clock); one `classify_many` call per row.", "",
             "| texts | fragments | distinct texts | tiered by the model | ms per fragment, default | "
             "s per call, default | ms per fragment, rules only | s per call, rules only |",
             "|---|---|---|---|---|---|---|---|",
             row(f"MTSamples sentences ({EN_FILE}, en)", english, timed["en"][0], timed["en"][1], timed["en"][2]),
             row(f"cEHRNER sentences ({ZH_FILE}, zh)", chinese, timed["zh"][0], timed["zh"][1], timed["zh"][2]),
             row("both slices", both, slice_runs, timed["en"][1] + timed["zh"][1], slice_rules),
             row(f"generated chart (the {len(both):,} sentences repeated, shuffled)", chart, timed["chart"][0],
                 timed["chart"][1], timed["chart"][2]), "",
             f"Default classifier, cold: **{per_fragment:.3f} ms per fragment** on the {len(both):,} sentences "
             f"(goal ≤ {args.limit_ms} ms); the {len(chart):,}-fragment chart in **{chart_seconds:.2f} s**."]
    emit(args.out, "tiers", lines)
    if per_fragment > args.limit_ms:
        print(f"over the goal: {per_fragment:.3f} ms per fragment > {args.limit_ms} ms", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
