"""What the large-record pre-filter (packing.prefilter) costs in packing quality, on real cases.

Run: python bench/prefilter_quality.py --data-root ../shared/data --out docs/results/prefilter.md

Each AgentClinic case becomes a long chart: the case itself plus `--history` fragments of other cases'
text (the other AgentClinic cases and the MedQA cases) as the patient's earlier history (dated over the
previous three years, ids and patient rewritten).
Two scenarios: the case is the current encounter, or the case happened 30 days ago and today's encounter
is a short unrelated visit (so the case's T2 results are not protected as current). Each chart is packed
with and without the pre-filter (same packer, same cached vectors) and compared on:

- utility ratio: packed utility with / without the pre-filter (the exact packer is optimal over what it
  sees, so 1.0 means nothing was lost);
- displaced: the share of fragments packed without the pre-filter that it removed;
- gold T1/T2 retained: the case's field-labelled T1/T2 fragments that reach the context, both ways.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from ebmrag.compose import Resources, build_packer, build_tiering
from ebmrag.config import Settings, with_overrides
from ebmrag.eval.cases import ENCOUNTER, EvalCase, load_cases
from ebmrag.eval.packing_report import dataset_dir
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import DropReason
from ebmrag.records.fragment import Fragment, PatientRecord
from report import emit, machine  # bench/ is on sys.path when a script here runs

CRITICAL_HISTORY = 5


@dataclass(frozen=True)
class Comparison:
    utility_ratio: float
    displaced: float
    gold_with: int
    gold_without: int
    gold_total: int
    seconds_with: float
    seconds_without: float
    prefiltered: int
    fragments: int


def chart(case: EvalCase, pool: list[Fragment], critical: list[Fragment], size: int, rng: random.Random,
          scenario: str) -> PatientRecord:
    """The case plus `size` fragments of other patients' text, rewritten as this patient's older history;
    of them only `CRITICAL_HISTORY` are must-keep (a real chart has a few allergies and biopsies, not hundreds,
    and a flood of must-keep text would decide every packing alone)."""
    pid = case.record.patient_id
    picked = rng.sample(pool, min(size, len(pool))) + rng.sample(critical, min(CRITICAL_HISTORY, len(critical)))
    history = [Fragment(f"h{i}", pid, f.text, f.section, ENCOUNTER - timedelta(days=rng.uniform(31, 3 * 365)))
               for i, f in enumerate(picked)]
    own = list(case.record.fragments)
    if scenario == "past":
        own = [Fragment(f.id, pid, f.text, f.section, (f.timestamp or ENCOUNTER) - timedelta(days=30), f.source)
               for f in own]
        visit = rng.sample(pool, 3)
        own += [Fragment(f"v{i}", pid, f.text, f.section, ENCOUNTER + timedelta(minutes=i)) for i, f in
                enumerate(visit)]
    return PatientRecord(pid, tuple(sorted(history + own, key=lambda f: f.timestamp or ENCOUNTER)))


def compare(on: ContextPacker, off: ContextPacker, case: EvalCase, record: PatientRecord,
            window: int) -> Comparison:
    started = time.perf_counter()
    with_filter = on.run(record, case.question, window)
    middle = time.perf_counter()
    without = off.run(record, case.question, window)
    ended = time.perf_counter()
    packed_with = {p.fragment_id for p in with_filter.packed}
    packed_without = {p.fragment_id for p in without.packed}
    gold = set(case.critical_ids)
    return Comparison(with_filter.utility / without.utility if without.utility else 1.0,
                      len(packed_without - packed_with) / len(packed_without) if packed_without else 0.0,
                      len(gold & packed_with), len(gold & packed_without), len(gold), middle - started, ended - middle,
                      sum(d.reason is DropReason.PREFILTERED for d in with_filter.dropped), len(record.fragments))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--history", type=int, default=3000)
    parser.add_argument("--windows", default="512,2048")
    parser.add_argument("--settings", default="4:100,8:100,4:1000",
                        help="pre-filter settings to compare, windows:min_fragments (4:1000 is the default)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = load_cases("agentclinic", dataset_dir(args.data_root, "agentclinic") or args.data_root)
    rng = random.Random(11)
    chosen = rng.sample(cases, min(args.cases, len(cases)))
    others = [c for c in cases if c not in chosen] + load_cases("medqa", dataset_dir(args.data_root, "medqa")
                                                                 or args.data_root)
    everything = [f for c in others for f in c.record.fragments]
    with tempfile.TemporaryDirectory() as cache:  # one set of models, over a cache no earlier run filled
        resources = Resources(with_overrides(Settings(), models={"cache_dir": cache}))
        lines = measure(args, resources, chosen, everything)
    emit(args.out, "prefilter", lines)


def measure(args: argparse.Namespace, resources: Resources, chosen: list[EvalCase],
            everything: list[Fragment]) -> list[str]:
    """Every pre-filter setting against the packer without one; the packers share `resources` (one embedder,
    so the same cached vectors)."""
    settings = resources.settings
    off = build_packer(resources, with_overrides(settings, packing={"prefilter_windows": 0}))
    off.warm_up()
    tiering = build_tiering(resources)  # the charts are tiered when built, outside the timings
    decisions = tiering.decide([(f.text, f.section) for f in everything])
    pool = [f for f, d in zip(everything, decisions, strict=True) if not d.must_keep]
    critical = [f for f, d in zip(everything, decisions, strict=True) if d.must_keep]
    shared = tuple(Fragment(f"p{i}", "pool", f.text, f.section) for i, f in enumerate(everything))
    off.prepare(tiering.run(PatientRecord("pool", shared)))  # embed the shared history once, outside the timings
    lines = [f"## Pre-filter quality on long charts, {date.today().isoformat()}", "",
             f"{machine()}. Command: "
             "`python bench/prefilter_quality.py --data-root ../shared/data "
             "--out docs/results/prefilter.md`.",
             f"{len(chosen)} AgentClinic cases, each with up to {args.history:,} history fragments of other cases' "
             f"text (a pool of {len(pool):,}, plus {CRITICAL_HISTORY} must-keep ones).",
             "", "| pre-filter (windows : min fragments) | scenario | W | fragments pre-filtered, mean "
             "| utility ratio, median (min) | displaced, mean | gold T1/T2 packed with / without "
             "| seconds with / without, median |", "|---|---|---|---|---|---|---|---|"]
    for setting in args.settings.split(","):
        windows, minimum = setting.split(":")
        on = build_packer(resources, with_overrides(settings, packing={"prefilter_windows": float(windows),
                                                                       "prefilter_min_fragments": int(minimum)}))
        for scenario in ("current", "past"):
            charts = [(case, tiering.run(chart(case, pool, critical, args.history, random.Random(i), scenario)))
                      for i, case in enumerate(chosen)]
            for window in (int(w) for w in args.windows.split(",")):
                lines.append(f"| {setting} " + row(scenario, window,
                                                   [compare(on, off, case, record, window) for case, record in charts]))
                print(lines[-1], flush=True)
    return lines


def row(scenario: str, window: int, rows: list[Comparison]) -> str:
    ratios = [r.utility_ratio for r in rows]
    gold = sum(r.gold_total for r in rows)
    return (f"| {scenario} | {window} | {statistics.fmean(r.prefiltered for r in rows):,.0f} of "
            f"{statistics.fmean(r.fragments for r in rows):,.0f} "
            f"| {statistics.median(ratios):.4f} ({min(ratios):.4f}) "
            f"| {statistics.fmean(r.displaced for r in rows):.1%} "
            f"| {sum(r.gold_with for r in rows)} / {sum(r.gold_without for r in rows)} of {gold} "
            f"| {statistics.median(r.seconds_with for r in rows):.2f} / "
            f"{statistics.median(r.seconds_without for r in rows):.2f} |")


if __name__ == "__main__":
    main()
