"""Tier quotas shared by both EBM packers: every tier present gets min(k_min, N_t) packed fragments."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ebmrag.packing.types import Candidate
from ebmrag.records.fragment import Tier


def tier_quotas(candidates: Sequence[Candidate], k_min: int) -> dict[Tier, int]:
    counts = Counter(c.tier for c in candidates)
    return {tier: min(k_min, counts[tier]) for tier in Tier if counts[tier]}


def validate_k_min(k_min: int) -> None:
    if not isinstance(k_min, int) or k_min < 0:
        raise ValueError(f"k_min must be an integer >= 0, got {k_min!r}")
