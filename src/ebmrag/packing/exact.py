"""ebm-exact: the optimal multiple-choice knapsack under the EBM-Pack constraints (ours, SPEC §2, §7).

Objective "critical" (the default), lexicographic:
  (1) as many must-keep fragments as any packing can hold (T1 allergy, pathology, genetics);
  (2) as many T1/T2 fragments of the current encounter, at least compressed;
  (3) as many of the fragments of (1) and (2) as possible in their full text (room permitting);
  (4) as many tier quota slots filled as possible; (5) the largest total utility.
Utility U = W·Sim alone let relevance override tier: a T2 result the question did not mention lost to
a verbose, on-topic history line (docs/results/README.md (a)).
Objective "paper" is the paper's MCKP: (1) quota slots, (2) utility; no must-keep, no encounter.
Each level is a hard constraint whenever it is feasible; encoding the levels as nested bonuses means an
infeasible level degrades gracefully instead of failing the request.

Method: dynamic programming over capacity, tier by tier. Within a tier the state is (quota slots
filled so far, capped at the tier's quota; tokens used); at the tier boundary the slot count is
cashed in as a bonus and the state collapses to tokens only, so the table never needs the product of
all tiers' counters. Time O(n · (q+1) · W) numpy work, memory O(n_t · (q+1) · W) bytes of
back-pointers for the largest tier (n: fragments, q: k_min, W: window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.evidence.fragment import Tier
from ebmrag.packing.quota import tier_quotas, validate_k_min
from ebmrag.packing.types import (
    Candidate,
    DroppedFragment,
    DropReason,
    PackedFragment,
    PackReason,
    PackResult,
    drop_entry,
    pack_entry,
    validate_window,
)

FloatArray = npt.NDArray[np.float64]
OBJECTIVES = ("critical", "paper")
MAX_TABLE_CELLS = 48_000_000  # back-pointer bytes of the largest tier's table; above it the token grid coarsens


@dataclass
class _TierTable:
    members: list[int]
    decisions: npt.NDArray[np.int8]  # (n_t, rows, W+1): 0 skip; 2j+1 option j from row-1; 2j+2 from same row
    best_row: npt.NDArray[np.intp]  # (W+1,) row cashed in at the tier boundary


def _tier_table(
    candidates: Sequence[Candidate],
    members: list[int],
    quota: int,
    base: FloatArray,
    bonus: Callable[[Candidate, int], float],
    window: int,
) -> tuple[_TierTable, FloatArray]:
    rows = quota + 1
    dp = np.full((rows, window + 1), -np.inf)
    dp[0] = base
    decisions = np.zeros((len(members), rows, window + 1), dtype=np.int8)
    for k, index in enumerate(members):
        candidate = candidates[index]
        new = dp.copy()
        for j, option in enumerate(candidate.options):
            cost = option.tokens
            if cost > window:
                continue
            value = option.utility + bonus(candidate, j)
            if rows > 1:  # one more quota slot filled: row r-1 -> row r
                _relax(new[1:, cost:], dp[:-1, : window + 1 - cost] + value, decisions[k, 1:, cost:], 2 * j + 1)
            _relax(new[quota, cost:], dp[quota, : window + 1 - cost] + value, decisions[k, quota, cost:], 2 * j + 2)
        dp = new
    return _TierTable(members, decisions, np.zeros(0, dtype=np.intp)), dp


def _relax(target: FloatArray, proposal: FloatArray, decision: npt.NDArray[np.int8], code: int) -> None:
    better = proposal > target
    np.copyto(target, proposal, where=better)
    np.copyto(decision, np.int8(code), where=better)


class ExactPacker:
    """Optimal EBM-Pack with tier quotas and a hard must-keep flag for T1 allergy/pathology fragments."""

    def __init__(self, k_min: int = 1, objective: str = "critical") -> None:
        validate_k_min(k_min)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.k_min, self.objective = k_min, objective
        self.name = "ebm-exact" if objective == "critical" else "ebm-exact-paper"

    def _bonus(self, candidates: Sequence[Candidate], slot_bonus: float,
               slots: int) -> Callable[[Candidate, int], float]:
        """The nested bonus of each level above utility; each one outweighs everything below it."""
        if self.objective == "paper":
            return lambda candidate, option: 0.0
        critical = sum(c.critical for c in candidates)
        current = sum(c.critical and not c.must_keep for c in candidates)
        full = slot_bonus * (slots + 1)
        encounter = full * (critical + 1)
        must_keep = encounter * (current + 1)

        def bonus(candidate: Candidate, option: int) -> float:
            if not candidate.critical:
                return 0.0
            return (must_keep if candidate.must_keep else encounter) + (full if option == 0 else 0.0)

        return bonus

    def solve(self, candidates: Sequence[Candidate], window: int) -> dict[int, int]:
        """Candidate index -> chosen option index, for the packed candidates only."""
        return self._solve(candidates, window)[0]

    def _solve(self, candidates: Sequence[Candidate], window: int) -> tuple[dict[int, int], str]:
        """The choice and a note when it was not the plain DP. When everything fits in full, each fragment
        takes its best state on its own (every level of the objective is then at its maximum). When the table
        would exceed MAX_TABLE_CELLS, token costs are rounded up to a grid of g tokens (and the window down),
        so memory stays bounded and every packing found still fits the real window; the result is optimal on
        that grid."""
        validate_window(window)
        if sum(c.full.tokens for c in candidates) <= window:
            return {i: self._best_alone(c) for i, c in enumerate(candidates)}, ""
        quotas = tier_quotas(candidates, self.k_min)
        largest = max((sum(c.tier is t for c in candidates) for t in quotas), default=0)
        cells = largest * (max(quotas.values(), default=0) + 1) * (window + 1)
        grid = -(-cells // MAX_TABLE_CELLS) if cells > MAX_TABLE_CELLS else 1
        if grid == 1:
            return self._solve_grid(candidates, window, quotas), ""
        scaled = [replace(c, options=tuple(replace(o, tokens=-(-o.tokens // grid)) for o in c.options))
                  for c in candidates]
        note = (f"exact on a {grid}-token grid (costs rounded up, window {window} -> {window // grid} units) "
                f"to bound memory: {len(candidates)} fragments x {window} tokens")
        return self._solve_grid(scaled, window // grid, quotas), note

    def _best_alone(self, candidate: Candidate) -> int:
        """With room for everything: the full text of a critical fragment, else the state of highest utility."""
        if self.objective == "critical" and candidate.critical:
            return 0
        best = max(o.utility for o in candidate.options)
        return next(j for j, o in enumerate(candidate.options) if o.utility == best)

    def _solve_grid(self, candidates: Sequence[Candidate], window: int, quotas: dict[Tier, int]) -> dict[int, int]:
        utility_bound = sum(max((o.utility for o in c.options), default=0.0) for c in candidates)
        slot_bonus = utility_bound + 1.0
        bonus = self._bonus(candidates, slot_bonus, sum(quotas.values()))
        base = np.zeros(window + 1)
        tables = []
        for tier, quota in quotas.items():
            members = [i for i, c in enumerate(candidates) if c.tier is tier]
            table, dp = _tier_table(candidates, members, quota, base, bonus, window)
            scored = dp + slot_bonus * np.arange(quota + 1)[:, None]
            table.best_row = np.argmax(scored, axis=0)
            base = scored.max(axis=0)
            tables.append(table)
        return self._backtrack(candidates, tables, window)

    @staticmethod
    def _backtrack(candidates: Sequence[Candidate], tables: list[_TierTable], window: int) -> dict[int, int]:
        chosen: dict[int, int] = {}
        capacity = window
        for table in reversed(tables):
            row = int(table.best_row[capacity])
            for k in range(len(table.members) - 1, -1, -1):
                code = int(table.decisions[k, row, capacity])
                if code == 0:
                    continue
                option = (code - 1) // 2
                index = table.members[k]
                chosen[index] = option
                capacity -= candidates[index].options[option].tokens
                row -= 1 if code % 2 == 1 else 0
        return chosen

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult:
        chosen, note = self._solve(candidates, window)
        packed: list[PackedFragment] = []
        dropped: list[DroppedFragment] = []
        for index, candidate in enumerate(candidates):
            if index in chosen:
                packed.append(pack_entry(candidate, candidate.options[chosen[index]], self._reason(candidate),
                                         "in the optimal packing"))
            else:
                dropped.append(self._why_dropped(candidate, window))
        return PackResult(self.name, window, tuple(packed), tuple(dropped), note)

    def _reason(self, candidate: Candidate) -> PackReason:
        if self.objective == "paper":
            return PackReason.OPTIMAL
        if candidate.must_keep:
            return PackReason.MUST_KEEP
        return PackReason.CURRENT_ENCOUNTER if candidate.critical else PackReason.OPTIMAL

    def _why_dropped(self, candidate: Candidate, window: int) -> DroppedFragment:
        cheapest = min(o.tokens for o in candidate.options)
        if cheapest > window:
            return drop_entry(
                candidate, DropReason.CAPACITY, f"its smallest state ({cheapest} tokens) exceeds the window"
            )
        if candidate.critical and self.objective == "critical":
            kind = "must-keep" if candidate.must_keep else "a current-encounter T1/T2 finding"
            return drop_entry(candidate, DropReason.CAPACITY,
                              f"{kind}, but no packing holds it together with the critical fragments ranked above it")
        return drop_entry(
            candidate, DropReason.DENSITY_RANK, "the optimal packing spends the window on higher-utility fragments"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "k_min": self.k_min, "objective": self.objective}
