"""A real EHR export end to end (issue 20): header tokens per context line, and `pack` / `ask` time on the
shared Synthea chart.

Run: python bench/synthea_chart.py --data-root ../shared/data --out docs/benchmarks.md

Header tokens compare the line head a context line used to carry ("[<resource id>|T3|2020-04-07]") with
today's ("[12|T3|2020-04-07]"), counted with the bundled tokenizer over every fragment of the chart.
`pack` is timed warm (a second packer over the same on-disk cache, as a new process would find it) and
`ask` with the offline brief and the bundled demo knowledge base; medians of `--runs`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from ebmrag.compose import Resources, build_engine, build_packer, build_tiering, load_patient
from ebmrag.config import Settings, with_overrides
from ebmrag.evidence.tiering import Tiering
from ebmrag.models.tokens import make_token_counter
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.utility import fragment_header
from ebmrag.records.loaders import load_record
from report import emit, machine  # bench/ is on sys.path when a script here runs

QUESTIONS = ("What are this patient's active problems, current medications and allergies?",
             "Which antibiotic would be safe for this patient if he developed pneumonia, and why?")


def packer_over(cache: str, **models: str) -> tuple[Tiering, ContextPacker]:
    """The default tiering step and packer as a new process builds them, over the cache directory `cache`."""
    resources = Resources(with_overrides(Settings(), models={"cache_dir": cache, **models}))
    return build_tiering(resources), build_packer(resources)


def header_tokens(chart: Path) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as cache:  # tiers by the rules alone (no tier model)
        record = packer_over(cache, tier_model="")[0].run(load_record(chart))
    counter = make_token_counter("bundled")
    old = counter.count_many([fragment_header(f, 0).replace("[0|", f"[{f.id}|", 1) for f in record.fragments])
    new = counter.count_many([fragment_header(f, n) for n, f in enumerate(record.fragments, 1)])
    return statistics.fmean(old), statistics.fmean(new), len(record.fragments)


def timed(action: object, runs: int) -> float:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        action()  # type: ignore[operator]
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    chart = args.data_root / "synthea" / "synthea_sample_complete_patient.json"
    old, new, count = header_tokens(chart)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        filling, first = packer_over(cache)
        first.run(filling.run(load_record(chart)), QUESTIONS[0], 1024)  # fill the on-disk cache
        tiering, packer = packer_over(cache)
        packer.warm_up()
        engine = build_engine(with_overrides(Settings(), models={"cache_dir": cache}))
        for question in QUESTIONS:
            for window in (256, 1024):
                pack_ms = timed(lambda q=question, w=window: packer.run(tiering.run(load_record(chart)), q, w),
                                args.runs)
                rows.append(f"| {question[:48]}… | {window} | {pack_ms:.0f} |")
        ask_ms = timed(lambda: engine.ask(QUESTIONS[1], load_patient(chart), prompt_window=4096), args.runs)
    lines = [f"## A real chart: the Synthea FHIR export, {date.today().isoformat()}", "",
             f"{machine()}. Command: "
             "`python bench/synthea_chart.py --data-root ../shared/data --out docs/benchmarks.md`.", "",
             f"Header tokens per context line over the chart's {count} fragments: {old:.1f} with the resource id, "
             f"{new:.1f} with a local number ({1 - new / old:.0%} fewer; {(old - new) * 10:.0f} tokens saved over "
             "ten lines).", "",
             "| question | W | `pack` ms, median (warm cache) |", "|---|---|---|", *rows, "",
             f"`ask` (offline brief, demo knowledge base, W = 4,096), the antibiotic question: {ask_ms:.0f} ms median."]
    emit(args.out, "synthea-chart", lines)


if __name__ == "__main__":
    main()
