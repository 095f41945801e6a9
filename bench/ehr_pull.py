"""Pulling charts from a FHIR server (issue 34): for every FHIR chart in ../shared/data/fhir_charts, loaded into the
test FHIR server (tests/fhir_server: Node.js + Medplum's in-memory router, `make fhir-server`), the median time of a
full pull (SMART token, `$everything` pages, referenced resources, the lenient reader, one store transaction) and
of a `_since` refresh that finds nothing changed; the same with `$everything` turned off (one search per type).

Run: python bench/ehr_pull.py --data-root ../shared/data [--runs 5] [--out docs/benchmarks.md]

The server runs on this machine, so the times are ebmrag's work plus the server's, without a network between them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test server's helper lives in tests/

from tests.ehr.fhir_server import FhirServer  # noqa: E402
from tests.ehr.helpers import register  # noqa: E402

from ebmrag.ehr.params import EhrConnection, EhrParams  # noqa: E402
from ebmrag.ehr.pull import pull_patient  # noqa: E402
from ebmrag.store.patients import SQLiteStore  # noqa: E402
from report import emit, machine  # noqa: E402  (bench/ is on sys.path when a script here runs)

PARAMS = EhrParams(page_size=50, since_skew_seconds=0.0)


def median_ms(action: Callable[[], object], runs: int) -> float:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000


def measure(server: FhirServer, chart: Path, folder: Path, runs: int) -> tuple[int, float, float, float]:
    """(fragments, full pull ms, unchanged refresh ms, full pull by per-type searches ms)."""
    server.reset()
    patient = server.load(chart)[0]
    connection: EhrConnection = register(server, folder, tenant="bench")
    store = SQLiteStore(folder / f"{chart.stem}.sqlite")
    report = pull_patient(store, connection, patient, params=PARAMS, full=True)
    full = median_ms(lambda: pull_patient(store, connection, patient, params=PARAMS, full=True), runs)
    refresh = median_ms(lambda: pull_patient(store, connection, patient, params=PARAMS), runs)
    server.faults(everything=False)
    searches = median_ms(lambda: pull_patient(store, connection, patient, params=PARAMS, full=True), runs)
    return len(report.fragment_ids), full, refresh, searches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    charts = sorted((args.data_root / "fhir_charts").glob("*.json"))
    rows, totals = [], [0.0, 0.0, 0.0]
    server = FhirServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            for chart in charts:
                fragments, *times = measure(server, chart, Path(folder), args.runs)
                totals = [t + m for t, m in zip(totals, times, strict=True)]
                rows.append(f"| {chart.name} | {fragments} | {times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} |")
    finally:
        server.stop()
    lines = [f"{machine()}. Date: {date.today().isoformat()}. Command: `python bench/ehr_pull.py --data-root "
             f"../shared/data --runs {args.runs} --out docs/benchmarks.md`; median of {args.runs} runs per chart; "
             "the test FHIR server on the same machine.", "",
             "| chart | fragments | full pull ms ($everything) | refresh ms (nothing changed) | full pull ms "
             "(per-type searches) |", "|---|---|---|---|---|", *rows, "",
             f"Sum over {len(charts)} charts: full pull {totals[0]:,.0f} ms, refresh {totals[1]:,.0f} ms, full pull "
             f"by searches {totals[2]:,.0f} ms."]
    emit(args.out, "ehr-pull", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
