"""The EBM-Pack paper's experiments (issue 3): one function per table, all from one prepared case set.

(a) RRCE by window and strategy; (b) noise sweep at 512; (c) k_min; (d) tier-weight grid chosen on a
validation split and reported on the disjoint test split; (e) ε × λ grid; (f) greedy vs exact. Each
experiment returns `Table`s that `write_experiment` saves as JSON + markdown (+ a PNG from eval.plots).
Candidates are measured once per case with neutral parameters and rescored per setting, so a sweep
costs packing time only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ebmrag.eval.cases import EvalCase
from ebmrag.eval.noise import NoiseConfig, noisy_cases
from ebmrag.eval.packing_eval import PackingRow, PreparedCase, evaluate, prepare
from ebmrag.evidence.entities import EntityExtractor
from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.packer import STRATEGIES, Packer, make_packer
from ebmrag.packing.utility import CandidateBuilder, TierWeights, UtilityParams
from ebmrag.protocols import TokenCounter

WINDOWS = (256, 512, 1024, 2048)
NOISE_LEVELS = (20, 40, 80, 120, 200)
K_MINS = (0, 1, 2, 3)
ALPHAS, BETAS, GAMMAS = (1.5, 2.0, 2.5, 3.0), (1.2, 1.5, 2.0, 2.5), (1.0, 1.2, 1.5)
EPSILONS, LAMBDAS = (0.0, 0.02, 0.05, 0.1, 0.2), (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)
DECAYS_PAST_THE_PAPER = (5.0, 10.0, 20.0, 50.0, 100.0, 365.0)
NEUTRAL = UtilityParams(TierWeights(1.0, 1.0, 1.0), decay_lambda=0.0, epsilon=0.0)


@dataclass
class Table:
    """A titled list of rows (dicts with the same keys) plus the plot that goes with it."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        if not self.rows:
            return f"### {self.title}\n\n(no rows)\n"
        keys = list(self.rows[0])
        lines = [f"### {self.title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for row in self.rows:
            lines.append("| " + " | ".join(_cell(row[k]) for k in keys) + " |")
        return "\n".join([*lines, "", *self.notes]).rstrip() + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3f}"
    return str(value)


def tier_weight_grid() -> list[TierWeights]:
    """The paper's 35 combinations with α ≥ β ≥ γ ≥ 1."""
    return [TierWeights(a, b, g) for a, b, g in itertools.product(ALPHAS, BETAS, GAMMAS) if a >= b >= g >= 1.0]


def split_of(case_id: str) -> str:
    """A fixed half-half split by hash: the same case is always in the same split, on any machine."""
    return "validation" if int(hashlib.sha256(case_id.encode()).hexdigest(), 16) % 2 == 0 else "test"


@dataclass
class Suite:
    """Shared state for the experiments: the measuring builder, the tiering step the cases go through first, the
    extractor that reads their entities, and the token counter of the uniform baseline."""

    builder: CandidateBuilder
    tiering: Tiering
    extractor: EntityExtractor
    token_counter: TokenCounter
    noise: NoiseConfig = field(default_factory=NoiseConfig)

    def prepare(self, cases: Sequence[EvalCase], noise: NoiseConfig | None = None) -> list[PreparedCase]:
        return prepare(noisy_cases(cases, noise or self.noise), self.builder, self.tiering, self.extractor)

    def windows_table(self, prepared: Sequence[PreparedCase], windows: Sequence[int] = WINDOWS,
                      strategies: Sequence[str] = STRATEGIES) -> list[PackingRow]:
        packers = [make_packer(s, self.token_counter) for s in strategies]
        return evaluate(prepared, packers, windows, UtilityParams())

    def noise_sweep(self, cases: Sequence[EvalCase], levels: Sequence[int] = NOISE_LEVELS,
                    window: int = 512) -> Table:
        rows = []
        for level in levels:
            prepared = self.prepare(cases, replace(self.noise, count=level))
            for row in self.windows_table(prepared, [window], ("fifo", "ebm-greedy", "ebm-exact-paper", "ebm-exact")):
                rows.append({"noise": level, **_short(row)})
        return Table("noise", f"Noise sweep at W = {window} ({len(cases)} cases)", rows)

    def k_min_table(self, prepared: Sequence[PreparedCase], windows: Sequence[int] = (256, 512)) -> Table:
        rows = []
        for k_min in K_MINS:
            packers: list[Packer] = [GreedyPacker(k_min=k_min), ExactPacker(k_min=k_min, objective="paper"),
                                     ExactPacker(k_min=k_min)]
            for row in evaluate(prepared, packers, windows, UtilityParams(), k_min=k_min):
                rows.append({"k_min": k_min, **_short(row)})
        return Table("kmin", f"k_min at W = {', '.join(map(str, windows))}", rows)

    def weights_table(self, prepared: Sequence[PreparedCase], window: int = 512) -> Table:
        """Grid search on the validation split by RRCE (ties: entity RRCE, then the paper's θ*), then the test split."""
        validation = [p for p in prepared if split_of(p.case.case_id) == "validation"]
        test = [p for p in prepared if split_of(p.case.case_id) == "test"]
        scored = []
        for weights in tier_weight_grid():
            row = evaluate(validation, [GreedyPacker()], [window], UtilityParams(weights))[0]
            scored.append((row.rrce, row.entity_rrce, weights))
        best = max(scored, key=lambda item: (item[0], item[1], item[2] == TierWeights()))[2]
        rows = []
        for label, weights in (("chosen on validation", best), ("paper θ*", TierWeights()),
                               ("flat", TierWeights(1.0, 1.0, 1.0))):
            for packer in (GreedyPacker(), ExactPacker(objective="paper"), ExactPacker()):
                row = evaluate(test, [packer], [window], UtilityParams(weights))[0]
                rows.append({"weights": label, "alpha": weights.alpha, "beta": weights.beta,
                             "gamma": weights.gamma, **_short(row)})
        notes = [f"Validation: {len(validation)} cases, test: {len(test)} cases; 35 combinations scored with "
                 "ebm-greedy on validation. Validation RRCE of every combination:", "",
                 ", ".join(f"({w.alpha}, {w.beta}, {w.gamma}): {r:.1f}" for r, _, w in scored)]
        return Table("weights", f"Tier weights at W = {window}: validation choice, tested on held-apart cases",
                     rows, notes)

    def epsilon_lambda_table(self, prepared: Sequence[PreparedCase], window: int = 512) -> Table:
        rows = []
        for epsilon, decay in itertools.product(EPSILONS, LAMBDAS):
            params = UtilityParams(TierWeights(), decay, epsilon)
            for row in evaluate(prepared, [GreedyPacker(), *BOTH_OBJECTIVES], [window], params):
                rows.append({"epsilon": epsilon, "lambda": decay, **_short(row)})
        return Table("epsilon_lambda", f"ε × λ at W = {window}", rows)


    def decay_table(self, prepared: Sequence[PreparedCase], windows: Sequence[int] = (256, 512)) -> Table:
        """Past the paper's grid: how strong must decay be (λ per year) before old noise stops competing?"""
        rows = []
        for decay in DECAYS_PAST_THE_PAPER:
            params = UtilityParams(TierWeights(), decay)
            for row in evaluate(prepared, [GreedyPacker(), *BOTH_OBJECTIVES], windows, params):
                rows.append({"lambda": decay, "half_life_days": round(365.25 * 0.693 / decay, 1), **_short(row)})
        return Table("decay", "λ beyond the paper's grid (per year)", rows)


BOTH_OBJECTIVES = (ExactPacker(objective="paper"), ExactPacker())  # reported side by side (issue 12)


def _short(row: PackingRow) -> dict[str, Any]:
    data = row.to_json()
    return {k: data[k] for k in ("dataset", "strategy", "window", "cases", "rrce", "entity_rrce", "entity_ceiling",
                                 "findings_rrce", "t1_retention", "history_retention", "utility_ratio", "ms_per_pack")}


def rows_table(name: str, title: str, rows: Sequence[PackingRow]) -> Table:
    return Table(name, title, [_short(r) for r in rows])


def greedy_vs_exact(rows: Sequence[PackingRow]) -> Table:
    by_key = {(r.dataset, r.strategy, r.window): r for r in rows}
    out = []
    for (dataset, strategy, window), exact in by_key.items():
        greedy = by_key.get((dataset, "ebm-greedy", window))
        if strategy != "ebm-exact" or greedy is None:
            continue
        out.append({"dataset": dataset, "window": window, "greedy_rrce": greedy.rrce, "exact_rrce": exact.rrce,
                    "greedy_entity_rrce": greedy.entity_rrce, "exact_entity_rrce": exact.entity_rrce,
                    "greedy_utility_ratio": greedy.utility_ratio, "greedy_ms": greedy.ms_per_pack,
                    "exact_ms": exact.ms_per_pack})
    return Table("greedy_vs_exact", "Greedy vs exact: RRCE and utility gap", out)


def write_table(table: Table, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{table.name}.json").write_text(json.dumps(table.rows, indent=1, ensure_ascii=False) + "\n",
                                                encoding="utf-8")
    (out_dir / f"{table.name}.md").write_text(table.markdown(), encoding="utf-8")
