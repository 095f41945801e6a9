"""ebm-greedy: the EBM-Pack paper's density heuristic, kept to measure its gap to the optimum.

Flatten every state of every fragment, sort by density U/C descending (O(M log M)), fill each tier's
quota with its densest fitting states, then walk the list skipping a state whose fragment is already
packed (mutual exclusion) or that does not fit (capacity). Ours: with `levels=True` (default) passes in the
clinical order of packing.levels come first, as ebm-exact ranks them: allergies (the same choice when
they alone overflow), the rest of level 1, level 2, level 3, each by rank (critical, abnormal, other), then
fact lines back to words, then the full text of levels 1-2, then of 3.
A level pass fits the smallest states first (most fragments), an upgrade pass then spends the room left on
full text in record order. Set it False for the paper's algorithm as published.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ebmrag.packing.levels import Level, Rank
from ebmrag.packing.overflow import allergy_overflow, cheapest, is_allergy
from ebmrag.packing.quota import tier_quotas, validate_k_min
from ebmrag.packing.types import (
    Candidate,
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


def _in_class(level: Level, rank: Rank) -> Callable[[Candidate], bool]:
    return lambda c: c.level is level and c.rank is rank and not is_allergy(c)


def _fit(level: Level) -> tuple[tuple[str, Callable[[Candidate], bool]], ...]:
    return tuple(("fit", _in_class(level, rank)) for rank in sorted(Rank, reverse=True))


LEVEL_PASSES: tuple[tuple[str, Callable[[Candidate], bool]], ...] = (  # fit as many as possible, then upgrade
    ("fit", is_allergy), *_fit(Level.ALWAYS), *_fit(Level.CURRENT_ENCOUNTER), *_fit(Level.STANDING_HISTORY),
    ("worded", lambda c: c.critical),  # fact lines back to words, room permitting
    ("full", lambda c: c.level in (Level.ALWAYS, Level.CURRENT_ENCOUNTER)),
    ("full", lambda c: c.level is Level.STANDING_HISTORY),
)


def _upgrade(candidate: Candidate, chosen: dict[int, int], index: int, room: int, to_full: bool) -> int:
    """Move a packed fragment to its full text, or from its fact line to its smallest state in words, when the
    room left allows; returns the room left. Updates `chosen`."""
    options, now = candidate.options, chosen[index]
    if to_full:
        target = 0
    elif options[now].state is State.FACT:
        worded = [j for j, o in enumerate(options) if o.state is not State.FACT]
        target = min(worded, key=lambda j: (options[j].tokens, j))
    else:
        return room
    extra = options[target].tokens - options[now].tokens
    if target != now and extra <= room:
        chosen[index], room = target, room - extra
    return room


class GreedyPacker:
    name = "ebm-greedy"

    def __init__(self, k_min: int = 1, levels: bool = True) -> None:
        validate_k_min(k_min)
        self.k_min = k_min
        self.levels = levels

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult:
        validate_window(window)
        flat = sorted(((i, j) for i, c in enumerate(candidates) for j in range(len(c.options))),
                      key=lambda item: candidates[item[0]].options[item[1]].density, reverse=True)
        chosen: dict[int, int] = {}
        reasons: dict[int, tuple[PackReason, str]] = {}
        left_out = allergy_overflow(candidates, window) if self.levels else set()
        room = self._level_passes(candidates, chosen, reasons, window, left_out) if self.levels else window
        for tier, quota in tier_quotas(candidates, self.k_min).items():
            filled = sum(1 for i in chosen if candidates[i].tier is tier)
            for index, j in flat:
                if filled >= quota:
                    break
                cost = candidates[index].options[j].tokens
                if candidates[index].tier is tier and index not in chosen and cost <= room:
                    chosen[index], reasons[index], room = j, (PackReason.QUOTA, f"tier {tier.value} quota"), room - cost
                    filled += 1
        for rank, (index, j) in enumerate(flat, 1):
            cost = candidates[index].options[j].tokens
            if index not in chosen and index not in left_out and cost <= room:
                chosen[index], room = j, room - cost
                reasons[index] = (PackReason.DENSITY_RANK, f"density rank {rank} of {len(flat)}")
        packed: list[PackedFragment] = [pack_entry(candidates[i], candidates[i].options[chosen[i]], *reasons[i])
                                        for i in sorted(chosen)]
        dropped = tuple(drop_entry(c, DropReason.CAPACITY, self._why_dropped(c, i in left_out))
                        for i, c in enumerate(candidates) if i not in chosen)
        return PackResult(self.name, window, tuple(packed), dropped, optimal=False)  # a heuristic proves nothing

    @staticmethod
    def _level_passes(candidates: Sequence[Candidate], chosen: dict[int, int],
                      reasons: dict[int, tuple[PackReason, str]], window: int, left_out: set[int]) -> int:
        """The clinical order's passes (LEVEL_PASSES); returns the room left. Updates `chosen` and `reasons`."""
        room = window
        for step, belongs in LEVEL_PASSES:
            members = [i for i, c in enumerate(candidates) if belongs(c) and i not in left_out]
            if step != "fit":  # upgrade, record order: to words (from a fact line), or to the full text
                for index in (i for i in members if i in chosen):
                    room = _upgrade(candidates[index], chosen, index, room, to_full=step == "full")
                continue
            for index in sorted((i for i in members if i not in chosen), key=lambda i: (cheapest(candidates[i]), i)):
                options = candidates[index].options
                smallest = min(range(len(options)), key=lambda j: (options[j].tokens, j))
                if options[smallest].tokens <= room:
                    chosen[index], room = smallest, room - options[smallest].tokens
                    reasons[index] = (level_reason(candidates[index]) or PackReason.DENSITY_RANK,
                                      f"level {candidates[index].level.value} pass")
        return room

    def _why_dropped(self, candidate: Candidate, overflowed: bool) -> str:
        detail = f"none of its states ({cheapest(candidate)}+ tokens) fitted the room left"
        if overflowed:
            return f"allergies alone overflow the window (severe first, then newest): {detail}"
        if self.levels and candidate.critical:
            return f"level {candidate.level.value} ({level_reason(candidate)}): {detail}"
        return detail

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "k_min": self.k_min, "levels": self.levels}
