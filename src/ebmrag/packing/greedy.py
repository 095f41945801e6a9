"""ebm-greedy: the EBM-Pack paper's density heuristic, kept to measure its gap to the optimum.

Flatten every state of every fragment, sort by density U/C descending (O(M log M)), fill each tier's
quota with its densest fitting states, then walk the list skipping a state whose fragment is already
packed (mutual exclusion) or that does not fit (capacity). Ours: with `must_keep=True` (default) a
first pass packs each must-keep fragment's densest fitting state before the quotas; set it False for
the paper's algorithm as published.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ebmrag.packing.quota import tier_quotas, validate_k_min
from ebmrag.packing.types import (
    Candidate,
    DropReason,
    PackedFragment,
    PackOption,
    PackReason,
    PackResult,
    drop_entry,
    pack_entry,
    validate_window,
)


class GreedyPacker:
    name = "ebm-greedy"

    def __init__(self, k_min: int = 1, must_keep: bool = True) -> None:
        validate_k_min(k_min)
        self.k_min = k_min
        self.must_keep = must_keep

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult:
        validate_window(window)
        flat = sorted(
            ((i, o) for i, c in enumerate(candidates) for o in c.options),
            key=lambda item: item[1].density,
            reverse=True,
        )
        packed: dict[int, PackedFragment] = {}
        room = window

        def take(index: int, option: PackOption, reason: PackReason, detail: str) -> None:
            nonlocal room
            packed[index] = pack_entry(candidates[index], option, reason, detail)
            room -= option.tokens

        if self.must_keep:
            for index, option in flat:
                if candidates[index].must_keep and index not in packed and option.tokens <= room:
                    take(index, option, PackReason.MUST_KEEP, "must-keep pass")
        for tier, quota in tier_quotas(candidates, self.k_min).items():
            filled = sum(1 for i in packed if candidates[i].tier is tier)
            for index, option in flat:
                if filled >= quota:
                    break
                if candidates[index].tier is tier and index not in packed and option.tokens <= room:
                    take(index, option, PackReason.QUOTA, f"tier {tier.value} quota")
                    filled += 1
        for rank, (index, option) in enumerate(flat, 1):
            if index not in packed and option.tokens <= room:
                take(index, option, PackReason.DENSITY_RANK, f"density rank {rank} of {len(flat)}")
        dropped = tuple(
            drop_entry(
                c,
                DropReason.CAPACITY,
                f"none of its states ({min(o.tokens for o in c.options)}+ tokens) fitted the room left",
            )
            for i, c in enumerate(candidates)
            if i not in packed
        )
        return PackResult(self.name, window, tuple(packed[i] for i in sorted(packed)), dropped)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "k_min": self.k_min, "must_keep": self.must_keep}
