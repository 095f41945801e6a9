"""Chart reading (issue 29): for every chart in ../shared/data/fhir_charts (FHIR Bundles and C-CDA documents), the
median time to read it (`load_record`) and to read and pack it (`ContextPacker.run`, W = 1024, the summary
question of tests/records/test_real_charts.py).

Run: python bench/charts.py --data-root ../shared/data [--out docs/benchmarks.md]

The packer is the default one, built through the composition root over a fresh cache directory; the first of
`--runs` runs fills the embedding cache, so the median is the warm cost a clinician pays on a second question.
Exits 1 when any chart's warm read + pack median reaches `--limit-ms` (1,000 ms), or when a chart cannot be
read; the cold first pack is reported beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

from ebmrag.compose import Resources, build_packer, build_tiering
from ebmrag.config import Settings, with_overrides
from ebmrag.errors import RecordError
from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import PackResult
from ebmrag.records.loaders import load_record
from report import emit, machine  # bench/ is on sys.path when a script here runs

QUESTION = "Summarise this patient's allergies, active problems, current medications and key results."
WINDOW = 1024


def timed_ms(action: Callable[[], object], runs: int) -> tuple[float, float]:
    """(the first run, the median of all runs) in ms: the first read + pack of a chart embeds its fragments
    (cold, as on a chart's first question), the later ones find them in the cache (warm)."""
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    return seconds[0] * 1000, statistics.median(seconds) * 1000


def read_and_pack(tiering: Tiering, packer: ContextPacker, chart: Path) -> PackResult:
    """Read, tier and pack one chart: what a chart's first question costs beyond the model load."""
    return packer.run(tiering.run(load_record(chart)), QUESTION, WINDOW)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit-ms", type=float, default=1000.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = args.data_root / "fhir_charts"
    charts = sorted([*folder.glob("*.json"), *folder.glob("*.xml")])
    rows, slowest, coldest, failed, over_cold = [], 0.0, 0.0, [], 0
    with tempfile.TemporaryDirectory() as cache:
        resources = Resources(with_overrides(Settings(), models={"cache_dir": cache}))
        tiering, packer = build_tiering(resources), build_packer(resources)
        packer.warm_up()  # model load is not a chart's cost
        for chart in charts:
            try:
                fragments = len(load_record(chart).fragments)
            except RecordError as error:
                failed.append(chart.name)
                rows.append(f"| {chart.name} | unreadable: {error.problem[:80]} | | | |")
                continue
            _, read = timed_ms(partial(load_record, chart), args.runs)
            cold, both = timed_ms(partial(read_and_pack, tiering, packer, chart), args.runs)
            slowest, coldest = max(slowest, both), max(coldest, cold)
            failed += [chart.name] if both >= args.limit_ms else []
            over_cold += cold >= args.limit_ms
            rows.append(f"| {chart.name} | {fragments} | {read:.1f} | {cold:.1f} | {both:.1f} |")
    lines = [f"{machine()}. Date: {date.today().isoformat()}. Command: "
             "`python bench/charts.py --data-root ../shared/data --out docs/benchmarks.md`; "
             f"median of {args.runs} runs, W = {WINDOW:,}; cold = the chart's first read + pack (its fragments "
             "embedded), warm = median with the embedding cache filled.", "",
             "| chart | fragments | read ms (median) | read + pack ms, cold | read + pack ms, warm |",
             "|---|---|---|---|---|", *rows, "",
             f"Max warm read + pack: {slowest:.1f} ms (goal < {args.limit_ms:,.0f} ms); "
             f"{len(charts) - len(failed)} of {len(charts)} charts within it. Max cold read + pack: {coldest:.1f} ms; "
             f"{over_cold} of {len(charts)} charts take {args.limit_ms:,.0f} ms or more on their first pack, almost "
             "all of it embedding the chart's fragments once (a stored chart can be embedded when it is written)."]
    emit(args.out, "charts", lines)
    if failed:
        print(f"over the limit or unreadable: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
