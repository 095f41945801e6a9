"""Which allergies give way when allergies alone overflow the window (packing.levels, level 1): the severe ones
come first, then the newest (one dated in the future after every other: its date is not to be trusted)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from ebmrag.packing.levels import ALLERGY
from ebmrag.packing.types import Candidate


def _seconds(stamp: datetime | None) -> float:
    """A timestamp on one scale (naive ones read as UTC); undated is the newest."""
    if stamp is None:
        return float("inf")
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def cheapest(candidate: Candidate) -> int:
    return min(o.tokens for o in candidate.options)


def is_allergy(candidate: Candidate) -> bool:
    """A drug allergy or serious adverse reaction: first within level 1."""
    decision = candidate.fragment.decision
    return decision is not None and decision.always == ALLERGY


def allergy_overflow(candidates: Sequence[Candidate], window: int) -> set[int]:
    """Indices of the allergies left out when allergies alone cannot fit in the window, each in its smallest
    state: severe ones first, then the newest (undated counts as newest), then record order; one that does not
    fit in the room left is skipped and the next tried. Empty when they all fit, the usual case: an allergy is
    a line."""
    allergies = [i for i, c in enumerate(candidates) if is_allergy(c)]
    if sum(cheapest(candidates[i]) for i in allergies) <= window:
        return set()

    def priority(index: int) -> tuple[bool, bool, float, int]:
        fragment = candidates[index].fragment
        severe = bool(fragment.decision and fragment.decision.severe)
        return (not severe, fragment.date_in_future, -_seconds(fragment.timestamp), index)

    room, left_out = window, set()
    for index in sorted(allergies, key=priority):
        cost = cheapest(candidates[index])
        if cost <= room:
            room -= cost
        else:
            left_out.add(index)
    return left_out
