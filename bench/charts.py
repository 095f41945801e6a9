"""Chart reading (issue 29): for every chart in ../shared/data/fhir_charts (FHIR Bundles and C-CDA documents), the
median time to read it (`load_record`) and to read and pack it (`ContextPacker.run`, W = 1024, the summary
question of tests/records/test_real_charts.py).

Run: python bench/charts.py --data-root ../shared/data [--out docs/benchmarks.md]

In one process: the packer is the default one, built through the composition root over a fresh cache directory;
the first of `--runs` runs fills the embedding cache, so the median is the warm cost a clinician pays on a second
question. As a user meets it (issue 48), `--cli-runs` > 0: `ebmrag pack CHART --json` in a fresh process, first
over an empty cache directory (only the machine's ONNX graph in it, built once before the clock: a first chart,
not a first install) and then again over the cache that run filled; the first `pack` and the median repeat are
timed from process start to exit, and the two must pack the same fragments in the same states (the answer never
depends on what was cached). Exits 1 when any chart's warm read + pack median reaches `--limit-ms` (1,000 ms),
when a chart cannot be read, or when a first and a repeated pack differ.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
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


def cli_pack(chart: Path, cache: Path) -> tuple[float, list[tuple[str, str]]]:
    """Seconds of one `ebmrag pack --json` process over `cache`, and what it packed (fragment id, state)."""
    config = cache / "bench.toml"
    config.write_text(f'[models]\ncache_dir = "{cache}"\n', encoding="utf-8")
    command = [sys.executable, "-m", "ebmrag", "pack", str(chart), "-q", QUESTION, "--window", str(WINDOW),
               "--json", "--config", str(config)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{chart.name}: ebmrag pack exited {done.returncode}: {done.stderr.strip()[-300:]}")
    packed = json.loads(done.stdout)["packed"]
    return seconds, [(str(p["fragment_id"]), str(p["state"])) for p in packed]


def cli_first_and_repeat(chart: Path, graphs: Path, runs: int) -> tuple[float, float, bool]:
    """(first pack s, median repeat s, whether every repeat packed what the first did) over a fresh cache
    directory that holds only the machine's ONNX graphs (`graphs`)."""
    with tempfile.TemporaryDirectory() as cache:
        shutil.copytree(graphs, Path(cache) / "onnx")
        first, packed = cli_pack(chart, Path(cache))
        repeats = [cli_pack(chart, Path(cache)) for _ in range(runs)]
    return first, statistics.median(s for s, _ in repeats), all(p == packed for _, p in repeats)


def cli_rows(charts: list[Path], runs: int) -> tuple[list[str], list[str]]:
    """The table of first and repeated `ebmrag pack` processes per chart, and the charts whose packs differ."""
    rows, differ, ratios = [], [], []
    with tempfile.TemporaryDirectory() as primed:
        cli_pack(charts[0], Path(primed))  # builds the machine's ONNX graphs: a first install's cost, not a chart's
        for chart in charts:
            print(f"ebmrag pack {chart.name}: first and {runs} repeats", file=sys.stderr)
            first, repeat, same = cli_first_and_repeat(chart, Path(primed) / "onnx", runs)
            ratios.append(first / repeat)
            differ += [] if same else [chart.name]
            rows.append(f"| {chart.name} | {first:.2f} | {repeat:.2f} | {first / repeat:.2f} | "
                        f"{'same' if same else 'DIFFERENT'} |")
    return ["", "`ebmrag pack CHART --json` as a process (first: an empty cache directory holding only the "
            f"machine's ONNX graph; repeat: median of {runs} more over the cache the first filled):", "",
            "| chart | first s | repeat s | first ÷ repeat | packed fragments and states |", "|---|---|---|---|---|",
            *rows, "", f"Largest first ÷ repeat: {max(ratios):.2f} (goal ≤ 2); {len(differ)} charts pack "
            "differently the first time."], differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit-ms", type=float, default=1000.0)
    parser.add_argument("--cli-runs", type=int, default=2,
                        help="repeated `ebmrag pack` processes per chart after its first (0: in-process only)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = args.data_root / "fhir_charts"
    charts = sorted([*folder.glob("*.json"), *folder.glob("*.xml")])
    rows, slowest, coldest, failed, over_cold, ratio = [], 0.0, 0.0, [], 0, 0.0
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
            slowest, coldest, ratio = max(slowest, both), max(coldest, cold), max(ratio, cold / both)
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
             "all of it embedding the chart's fragments once (a stored chart can be embedded when it is written). "
             f"Largest cold ÷ warm in one process: {ratio:.1f}."]
    if args.cli_runs > 0:
        table, differ = cli_rows(charts, args.cli_runs)
        lines += table
        failed += differ
    emit(args.out, "charts", lines)
    if failed:
        print(f"over the limit or unreadable: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
