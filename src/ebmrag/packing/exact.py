"""ebm-exact: the optimal multiple-choice knapsack under the EBM-Pack constraints (ours, not the paper's).

Objective "critical" (the default) follows the clinical order of packing.levels, lexicographically:
  (1) as many level-1 fragments as any packing can hold, allergies and serious ADRs first, then the face
      sheet and the question's needs (when allergies alone overflow the window, the severe and newest first);
  (2) as many level-2 fragments (the current encounter's T1/T2 findings), at least compressed;
  (3) as many level-3 fragments (standing history from earlier encounters), at least compressed;
  (4) as many of the fragments of (1) and (2) as possible in their full text; (5) then those of (3);
  (6) as many tier quota slots filled; (7) the largest total utility.
A critical fact in its entity-preserving compressed state is worth more than another one's full text: a
biopsy of last month is not dropped so that today's lab line keeps its wording.
Utility U = W·Sim alone let relevance override tier: a T2 result the question did not mention lost to
a verbose, on-topic history line (docs/results/README.md (a)), and another visit's biopsy pushed out today's.
Objective "paper" is the paper's MCKP: (1) quota slots, (2) utility; no levels.
Each level is a hard constraint whenever it is feasible; encoding the levels as nested integer bonuses means
an infeasible level degrades gracefully instead of failing the request.

Method: dynamic programming over capacity, tier by tier. Within a tier the state is (quota slots
filled so far, capped at the tier's quota; tokens used); at the tier boundary the slot count is
cashed in as a bonus and the state collapses to tokens only, so the table never needs the product of
all tiers' counters. Time O(n · (q+1) · W) numpy work, memory O(n_t · (q+1) · W) bytes of
back-pointers for the largest tier (n: fragments, q: k_min, W: window).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ebmrag.packing.findings import Moves, findings_before_filler
from ebmrag.packing.levels import Level, Rank
from ebmrag.packing.overflow import allergy_overflow, is_allergy
from ebmrag.packing.quota import tier_quotas, validate_k_min
from ebmrag.packing.types import (
    Candidate,
    DroppedFragment,
    DropReason,
    PackedFragment,
    PackReason,
    PackResult,
    State,
    drop_entry,
    level_reason,
    pack_entry,
    validate_window,
)
from ebmrag.protocols import checkpoint
from ebmrag.records.fragment import Tier

FloatArray = npt.NDArray[np.float64]
OBJECTIVES = ("critical", "paper")
MAX_TABLE_CELLS = 48_000_000  # back-pointer bytes of the largest tier's table; above it the token grid coarsens


IntArray = npt.NDArray[np.int64]


class _Solution(NamedTuple):
    """The solver's choice (candidate index -> option), how it got there when not by its plain table, and
    whether the choice is proven optimal (not when costs were rounded to a coarser token grid)."""

    chosen: dict[int, int]
    note: str = ""
    proven: bool = True


@dataclass
class _TierTable:
    members: list[int]
    decisions: npt.NDArray[np.int8]  # (n_t, rows, W+1): 0 skip; 2j+1 option j from row-1; 2j+2 from same row
    best_row: npt.NDArray[np.intp]  # (W+1,) row cashed in at the tier boundary


@dataclass
class _Scores:
    """DP values compared lexicographically: integer objective levels first, then float utility. Levels are
    exact integers, so a fragment whose utility is 1e-22 (a decade-old lab) still adds to the utility
    instead of vanishing into a big-M bonus in float64."""

    level: IntArray
    utility: FloatArray

    def copy(self) -> _Scores:
        return _Scores(self.level.copy(), self.utility.copy())


def _tier_table(
    candidates: Sequence[Candidate],
    members: list[int],
    quota: int,
    base: _Scores,
    bonus: Callable[[Candidate, int], int],
    window: int,
) -> tuple[_TierTable, _Scores]:
    rows = quota + 1
    dp = _Scores(np.full((rows, window + 1), _UNREACHABLE, dtype=np.int64), np.zeros((rows, window + 1)))
    dp.level[0], dp.utility[0] = base.level, base.utility
    decisions = np.zeros((len(members), rows, window + 1), dtype=np.int8)
    for k, index in enumerate(members):
        if k % _CHECK_EVERY == 0:
            checkpoint()  # a large record's table: the host may stop or pause the work here
        candidate = candidates[index]
        new = dp.copy()
        for j, option in enumerate(candidate.options):
            cost = option.tokens
            if cost > window:
                continue
            level, utility = bonus(candidate, j), option.utility
            if rows > 1:  # one more quota slot filled: row r-1 -> row r
                _relax(new, np.s_[1:, cost:], dp, np.s_[:-1, : window + 1 - cost], level, utility,
                       decisions[k, 1:, cost:], 2 * j + 1)
            _relax(new, np.s_[quota, cost:], dp, np.s_[quota, : window + 1 - cost], level, utility,
                   decisions[k, quota, cost:], 2 * j + 2)
        dp = new
    return _TierTable(members, decisions, np.zeros(0, dtype=np.intp)), dp


_CHECK_EVERY = 64  # candidates between two checkpoints
_UNREACHABLE = np.iinfo(np.int64).min // 4  # far below any reachable level, and safe to add small levels to


def _relax(target: _Scores, into: Any, source: _Scores, at: Any, level: int, utility: float,
           decision: npt.NDArray[np.int8], code: int) -> None:
    proposed_level, proposed_utility = source.level[at] + level, source.utility[at] + utility
    current_level, current_utility = target.level[into], target.utility[into]  # views: written in place
    better = (proposed_level > current_level) | (
        (proposed_level == current_level) & (proposed_utility > current_utility))
    np.copyto(current_level, proposed_level, where=better)
    np.copyto(current_utility, proposed_utility, where=better)
    np.copyto(decision, np.int8(code), where=better)


class ExactPacker:
    """Optimal EBM-Pack with tier quotas under the clinical order of critical facts (packing.levels)."""

    def __init__(self, k_min: int = 1, objective: str = "critical", findings_first: bool = True) -> None:
        validate_k_min(k_min)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.k_min, self.objective = k_min, objective
        self.findings_first = findings_first and objective == "critical"  # packing.findings, after the solver
        self.name = "ebm-exact" if objective == "critical" else "ebm-exact-paper"

    def _bonus(self, candidates: Sequence[Candidate], slots: int) -> Callable[[Candidate, int], int]:
        """The integer level of each objective step above utility; each outweighs everything below it (one
        quota slot is worth 1 at the tier boundary). Built bottom up: a step's unit exceeds the most that all
        steps below it can add. Packing a fragment counts in its class: its level and, inside the level, its
        rank (packing.levels.Rank), allergies above all. Below the classes, a critical fragment in words (any
        state but its one-line fact) counts: the fact state is the last resort, to pack one more critical
        fragment (any feasible packing of every critical fragment is found), never to give another its full
        text. Full text comes last: levels 1-2, then level 3."""
        if self.objective == "paper":
            return lambda candidate, option: 0
        count = Counter(c.level for c in candidates)
        classes = Counter(_class_of(c) for c in candidates)
        history_full = slots + 1
        first_full = history_full * (count[Level.STANDING_HISTORY] + 1)
        worded = first_full * (count[Level.ALWAYS] + count[Level.CURRENT_ENCOUNTER] + 1)
        unit = worded * (count[Level.ALWAYS] + count[Level.CURRENT_ENCOUNTER] + count[Level.STANDING_HISTORY] + 1)
        packed: dict[tuple[int, int], int] = {}
        for key in sorted(_PACKED_CLASSES, reverse=True):  # the least important class first
            packed[key], unit = unit, unit * (classes[key] + 1)
        if unit >= 2**62:
            raise ValueError(f"{len(candidates)} fragments are too many for one exact packing; pre-filter the record")
        full = {Level.ALWAYS: first_full, Level.CURRENT_ENCOUNTER: first_full, Level.STANDING_HISTORY: history_full}

        def bonus(candidate: Candidate, option: int) -> int:
            key = _class_of(candidate)
            if key not in packed:
                return 0
            in_words = worded if candidate.options[option].state is not State.FACT else 0
            return packed[key] + in_words + (full[candidate.level] if option == 0 else 0)

        return bonus

    def solve(self, candidates: Sequence[Candidate], window: int) -> dict[int, int]:
        """Candidate index -> chosen option index, for the packed candidates only."""
        return self._solve(candidates, window).chosen

    def _solve(self, candidates: Sequence[Candidate], window: int) -> _Solution:
        """The choice and a note when it was not the plain DP. When everything fits in full, each fragment
        takes its best state on its own (every level of the objective is then at its maximum). When the table
        would exceed MAX_TABLE_CELLS, token costs are rounded up to a grid of g tokens (and the window down),
        so memory stays bounded and every packing found still fits the real window; the result is optimal on
        that grid."""
        validate_window(window)
        if sum(c.full.tokens for c in candidates) <= window:
            return _Solution({i: self._best_alone(c) for i, c in enumerate(candidates)})
        quotas = tier_quotas(candidates, self.k_min)
        largest = max((sum(c.tier is t for c in candidates) for t in quotas), default=0)
        cells = largest * (max(quotas.values(), default=0) + 1) * (window + 1)
        grid = -(-cells // MAX_TABLE_CELLS) if cells > MAX_TABLE_CELLS else 1
        if grid == 1:
            return _Solution(self._solve_grid(candidates, window, quotas))
        scaled = [replace(c, options=tuple(replace(o, tokens=-(-o.tokens // grid)) for o in c.options))
                  for c in candidates]
        note = (f"exact on a {grid}-token grid (costs rounded up, window {window} -> {window // grid} units) "
                f"to bound memory: {len(candidates)} fragments x {window} tokens")
        return _Solution(self._solve_grid(scaled, window // grid, quotas), note, proven=False)

    def _best_alone(self, candidate: Candidate) -> int:
        """With room for everything: the full text of a critical fragment, else the state of highest utility."""
        if self.objective == "critical" and candidate.critical:
            return 0
        best = max(o.utility for o in candidate.options)
        return next(j for j, o in enumerate(candidate.options) if o.utility == best)

    def _solve_grid(self, candidates: Sequence[Candidate], window: int, quotas: dict[Tier, int]) -> dict[int, int]:
        bonus = self._bonus(candidates, sum(quotas.values()))
        base = _Scores(np.zeros(window + 1, dtype=np.int64), np.zeros(window + 1))
        tables = []
        for tier, quota in quotas.items():
            members = [i for i, c in enumerate(candidates) if c.tier is tier]
            table, dp = _tier_table(candidates, members, quota, base, bonus, window)
            level = dp.level + np.arange(quota + 1, dtype=np.int64)[:, None]  # cash the quota slots in
            best = level.max(axis=0)
            utility = np.where(level == best, dp.utility, -np.inf)
            table.best_row = np.argmax(utility, axis=0)
            base = _Scores(best, utility.max(axis=0))
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
        validate_window(window)
        left_out = allergy_overflow(candidates, window) if self.objective == "critical" else set()
        chosen, note, proven = self._solve_without(candidates, window, left_out)
        overflow = _overflow_note(candidates, left_out) if left_out else ""  # once: it counts every candidate
        if left_out:
            note = "; ".join(filter(None, [note, overflow]))
        filled = self._fill(candidates, chosen, window)
        moves = findings_before_filler(candidates, chosen, window) if self.findings_first else Moves()
        if moves.added:  # the room a finding left over goes to the best of what is still out, as before
            refilled = self._fill(candidates, chosen, window)
            filled |= refilled
            for index in refilled:
                moves.displaced.pop(index, None)
        room = window - sum(candidates[i].options[j].tokens for i, j in chosen.items())
        packed: list[PackedFragment] = []
        dropped: list[DroppedFragment] = []
        for index, candidate in enumerate(candidates):
            if index in moves.added:
                packed.append(pack_entry(candidate, candidate.options[chosen[index]], PackReason.FINDING,
                                         _took_place(moves.added[index])))
            elif index in moves.displaced:
                cheapest = min(o.tokens for o in candidate.options)
                dropped.append(drop_entry(candidate, DropReason.FOR_FINDING,
                                          f"gave its place to the T1/T2 finding {moves.displaced[index]} ({room} "
                                          f"tokens were left, its smallest state needs {cheapest})"))
            elif index in filled:
                packed.append(pack_entry(candidate, candidate.options[chosen[index]], self._reason(candidate),
                                         "added in the room the optimal packing left"))
            elif index in chosen:
                packed.append(pack_entry(candidate, candidate.options[chosen[index]], self._reason(candidate),
                                         "in the optimal packing"))
            elif index in left_out:
                dropped.append(drop_entry(candidate, DropReason.CAPACITY, overflow))
            else:
                dropped.append(self._why_dropped(candidate, window, room))
        return PackResult(self.name, window, tuple(packed), tuple(dropped), note,
                          optimal=self.objective == "critical" and proven)

    def _solve_without(self, candidates: Sequence[Candidate], window: int,
                       left_out: set[int]) -> _Solution:
        """Solve on the candidates not left out; indices map back to `candidates`."""
        if not left_out:
            return self._solve(candidates, window)
        kept = [i for i in range(len(candidates)) if i not in left_out]
        solution = self._solve([candidates[i] for i in kept], window)
        return solution._replace(chosen={kept[k]: option for k, option in solution.chosen.items()})

    @staticmethod
    def _fill(candidates: Sequence[Candidate], chosen: dict[int, int], window: int) -> set[int]:
        """Fragments added (densest first, in their best state that fits) while room is left. The optimum
        leaves room only when a fragment's utility is below what its sum can resolve, or on a coarse token
        grid; a fragment that fits is never dropped for lack of room it had. Updates `chosen`."""
        room = window - sum(candidates[i].options[j].tokens for i, j in chosen.items())
        added: set[int] = set()
        for index in sorted((i for i in range(len(candidates)) if i not in chosen),
                            key=lambda i: (-max(o.density for o in candidates[i].options), i)):
            fitting = [j for j, o in enumerate(candidates[index].options) if o.tokens <= room]
            if fitting:
                best = max(fitting, key=lambda j: (candidates[index].options[j].utility, -j))
                chosen[index] = best
                room -= candidates[index].options[best].tokens
                added.add(index)
        return added

    def _reason(self, candidate: Candidate) -> PackReason:
        if self.objective == "paper":
            return PackReason.OPTIMAL
        return level_reason(candidate) or PackReason.OPTIMAL

    def _why_dropped(self, candidate: Candidate, window: int, room: int) -> DroppedFragment:
        """The reason names the room that was left: after the fill, any dropped fragment was larger than it."""
        cheapest = min(o.tokens for o in candidate.options)
        if cheapest > window:
            return drop_entry(
                candidate, DropReason.CAPACITY, f"its smallest state ({cheapest} tokens) exceeds the window"
            )
        left = f"{room} tokens were left, its smallest state needs {cheapest}"
        if candidate.critical and self.objective == "critical":
            return drop_entry(candidate, DropReason.CAPACITY,
                              f"level {candidate.level.value} ({level_reason(candidate)}), but no packing holds it "
                              f"together with the critical fragments ranked above it ({left})")
        return drop_entry(candidate, DropReason.DENSITY_RANK,
                          f"the window went to higher-utility fragments ({left})")

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "k_min": self.k_min, "objective": self.objective,
                "findings_first": self.findings_first}


ALLERGY_CLASS = (0, 0)  # above every level: allergies and serious reactions
_PACKED_CLASSES = [ALLERGY_CLASS] + [(level, -rank) for level in (Level.ALWAYS, Level.CURRENT_ENCOUNTER,
                                                                  Level.STANDING_HISTORY) for rank in Rank]


def _class_of(candidate: Candidate) -> tuple[int, int]:
    """(level, -rank): the smaller, the more important; level 4 is not a class of the order."""
    if is_allergy(candidate):
        return ALLERGY_CLASS
    return (int(candidate.level), -int(candidate.rank))


def _took_place(replaced: list[str]) -> str:
    if not replaced:
        return "a T1/T2 finding, packed in the room left"
    return f"a T1/T2 finding, in the place of {len(replaced)} T4 fragment(s): {', '.join(replaced)}"


def _overflow_note(candidates: Sequence[Candidate], left_out: set[int]) -> str:
    allergies = sum(is_allergy(c) for c in candidates)
    return (f"allergies alone overflow the window: {allergies - len(left_out)} of {allergies} kept "
            f"(severe first, then newest), {len(left_out)} left out")
