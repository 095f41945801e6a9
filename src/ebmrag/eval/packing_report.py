"""Runs the whole packing suite into a results folder: JSON + markdown + PNG per experiment.

`run_suite` is what `ebmrag eval packing-suite` calls; `run_packing` is `ebmrag eval packing`. Both
find their input files by pattern under the folders they are given, so they run unchanged on a
held-out copy of the data with the same layout.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ebmrag.eval import plots
from ebmrag.eval.cases import DATASETS, EvalCase, load_cases
from ebmrag.eval.halves import HALVES, half_of
from ebmrag.eval.noise import NoiseConfig, noisy_cases
from ebmrag.eval.packing_eval import PackingRow, PreparedCase, evaluate, prepare
from ebmrag.eval.packing_suite import Suite, Table, greedy_vs_exact, rows_table, write_table
from ebmrag.packing.packer import make_packer
from ebmrag.packing.utility import UtilityParams
from ebmrag.protocols import Progress

log = logging.getLogger(__name__)
PATTERNS = {"medqa": "benchmark*.json", "agentclinic": "agentclinic_medqa*.jsonl", "cmb": "cmb_clin*.json"}


def dataset_dir(data_root: Path, dataset: str) -> Path | None:
    """The folder under `data_root` (or itself) holding the dataset's file pattern, if any."""
    pattern = PATTERNS[dataset]
    if any(data_root.glob(pattern)):
        return data_root
    found = sorted(data_root.rglob(pattern))
    return found[0].parent if found else None


def prepare_cases(suite: Suite, dataset: str, clean: Sequence[EvalCase], noise: NoiseConfig,
                  progress: Progress | None = None) -> list[PreparedCase]:
    return prepare(noisy_cases(clean, noise), suite.builder, suite.tiering, suite.extractor,
                   progress=progress, label=dataset)


def protocol_table(prepared: dict[str, list[PreparedCase]]) -> Table:
    """What the noise protocol produced: fragment counts and candidate volume against the signal."""
    rows = []
    for dataset, items in prepared.items():
        ratios, signal_tokens, fragments, critical = [], [], [], []
        for item in items:
            signal = sum(m.tokens for m in item.measured if m.fragment.source != "noise")
            total = sum(m.tokens for m in item.measured)
            ratios.append(total / signal if signal else 0.0)
            signal_tokens.append(signal)
            fragments.append(len(item.measured))
            critical.append(len(item.case.critical_ids))
        rows.append({"dataset": dataset, "cases": len(items), "labels": items[0].case.label_source if items else "",
                     "fragments_per_case": statistics.fmean(fragments), "critical_per_case": statistics.fmean(critical),
                     "signal_tokens_median": statistics.median(signal_tokens),
                     "volume_over_signal_mean": statistics.fmean(ratios),
                     "volume_over_signal_min": min(ratios), "volume_over_signal_max": max(ratios)})
    return Table("protocol", "Cases and noise protocol (candidate tokens / signal tokens)", rows)


def write_results(rows: Sequence[PackingRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([r.to_json() for r in rows], indent=1) + "\n", encoding="utf-8")
    (out / "results.md").write_text(rows_table("results", "Packing results", rows).markdown(), encoding="utf-8")


def run_packing(suite: Suite, dataset: str, data_dir: Path, windows: Sequence[int], strategies: Sequence[str],
                out: Path, limit: int = 0, k_min: int = 1, params: UtilityParams | None = None,
                progress: Progress | None = None, half: str = "all") -> tuple[list[PackingRow], list[PreparedCase]]:
    """`half` "tune" or "check" scores one fixed hash half of the cases (eval.halves); the noise of every case
    is drawn from all of them, so a case's record is the same whichever half is asked for."""
    if half not in ("all", *HALVES):
        raise ValueError(f"half must be all, tune or check, got {half!r}")
    noisy = [c for c in noisy_cases(load_cases(dataset, data_dir, limit), suite.noise)
             if half == "all" or half_of(c.case_id) == half]
    prepared = prepare(noisy, suite.builder, suite.tiering, suite.extractor,
                   progress=progress, label=dataset)
    packers = [make_packer(s, suite.token_counter, k_min) for s in strategies]
    rows = evaluate(prepared, packers, windows, params or UtilityParams(), k_min)
    write_results(rows, out)
    return rows, prepared


def _save(table: Table, out: Path, plot: Callable[[Table, Path], None] | None = None) -> None:
    write_table(table, out)
    if plot:
        plot(table, out / f"{table.name}.png")


def _series(rows: Sequence[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return [{**r, "series": " ".join(f"{r[k]}" if k != "window" else f"W={r[k]}" for k in keys)} for r in rows]


def run_suite(suite: Suite, data_root: Path, out: Path, limit: int = 0, sweep_cases: int = 50,
              progress: Progress | None = None) -> dict[str, float]:
    """All experiments; returns seconds per step so the command can report where the time went."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    clean: dict[str, list[EvalCase]] = {}
    prepared: dict[str, list[PreparedCase]] = {}
    for dataset in DATASETS:
        folder = dataset_dir(data_root, dataset)
        if folder is None:
            log.warning("no %s files under %s; skipped", dataset, data_root)
            continue
        clean[dataset] = load_cases(dataset, folder, limit)
        prepared[dataset] = prepare_cases(suite, dataset, clean[dataset], suite.noise, progress)
    _save(protocol_table(prepared), out)
    seconds["measure"] = time.perf_counter() - started
    main_sets = {d: p for d, p in prepared.items() if d in ("medqa", "agentclinic")}
    steps: list[tuple[str, Callable[[], None]]] = [
        ("windows", lambda: _windows_step(suite, prepared, out)),
        ("sweeps", lambda: _sweeps_step(suite, main_sets, out)),
        ("noise", lambda: _noise_step(suite, {d: clean[d] for d in main_sets}, out, sweep_cases))]
    for step, action in steps:
        started = time.perf_counter()
        action()
        seconds[step] = time.perf_counter() - started
    return seconds


def _windows_step(suite: Suite, prepared: dict[str, list[PreparedCase]], out: Path) -> None:
    """(a) every strategy at every window, and (f) greedy against exact from the same rows."""
    window_rows = [row for items in prepared.values() for row in suite.windows_table(items)]
    write_results(window_rows, out)
    for dataset in prepared:
        table = rows_table(f"windows_{dataset}", f"(a) RRCE by window, {dataset}",
                           [r for r in window_rows if r.dataset == dataset])
        _save(table, out, lambda t, p: plots.line_plot(t.rows, "window", ("rrce", "entity_rrce"), "strategy",
                                                        t.title, p, log_x=True))
    _save(greedy_vs_exact(window_rows), out)


def _sweeps_step(suite: Suite, main_sets: dict[str, list[PreparedCase]], out: Path) -> None:
    """(c) k_min, (d) tier weights, (e) ε × λ and λ past the paper's grid: rescoring only."""
    kmin = Table("kmin", "(c) k_min at W = 256 and 512",
                 [r for p in main_sets.values() for r in suite.k_min_table(p).rows])
    _save(kmin, out, lambda t, p: plots.line_plot(_series(t.rows, "dataset", "strategy", "window"), "k_min",
                                                  ("rrce", "entity_rrce"), "series", t.title, p))
    weights = [suite.weights_table(p) for p in main_sets.values()]
    _save(Table("weights", "(d) tier weights at W = 512 (chosen on validation, reported on test)",
                [r for t in weights for r in t.rows], [n for t in weights for n in t.notes]), out,
          lambda t, p: plots.bar_plot([{**r, "label": f"{r['dataset']} {r['weights']} {r['strategy']}"}
                                       for r in t.rows], "label", ("rrce", "entity_rrce"), t.title, p))
    grid = Table("epsilon_lambda", "(e) ε × λ at W = 512",
                 [r for p in main_sets.values() for r in suite.epsilon_lambda_table(p).rows])
    _save(grid, out, lambda t, p: plots.heatmap([r for r in t.rows if r["strategy"] == "ebm-greedy"
                                                 and r["dataset"] == "medqa"] or t.rows,
                                                "lambda", "epsilon", "rrce", "ebm-greedy RRCE, medqa", p))
    decay = Table("decay", "Past the paper: λ beyond its grid (per year), W = 256 and 512",
                  [r for p in main_sets.values() for r in suite.decay_table(p).rows])
    _save(decay, out, lambda t, p: plots.line_plot(_series(t.rows, "dataset", "strategy", "window"), "lambda",
                                                   ("rrce",), "series", t.title, p))


def _noise_step(suite: Suite, clean: dict[str, list[EvalCase]], out: Path, sweep_cases: int) -> None:
    """(b) the noise sweep on the first cases, and noise dated on the encounter day (past the paper)."""
    noise_rows = [row for cases in clean.values() for row in suite.noise_sweep(cases[:sweep_cases]).rows]
    _save(Table("noise", f"(b) noise sweep at W = 512 (first {sweep_cases} cases)", noise_rows), out,
          lambda t, p: plots.line_plot(_series(t.rows, "dataset", "strategy"), "noise", ("rrce", "entity_rrce"),
                                       "series", t.title, p))
    hard = replace(suite.noise, recent_share=0.25)
    hard_rows = [row for cases in clean.values()
                 for row in suite.windows_table(suite.prepare(cases, hard), (256, 512))]
    _save(rows_table("concurrent_noise", "Past the paper: a quarter of the noise on the encounter day",
                     hard_rows), out)
