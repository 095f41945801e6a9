"""A T1/T2 finding never loses its place to patient report or filler.

Utility (tier weight x similarity x decay) can rank a line such as "relatives phoned for an update" above last
year's creatinine when the line happens to sound like the question, and an old finding decays. The objective's
levels protect must-keep and current-encounter fragments only, so after the solver has chosen, this pass
gives each dropped T1/T2 finding (highest utility first) the room that T4 fragments hold, removing the T4
fragments of lowest utility first. Afterwards no T4 fragment is packed while a T1/T2 finding that would fit in
its place is dropped; every move is recorded on both fragments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ebmrag.packing.types import Candidate
from ebmrag.records.fragment import Tier

FINDING_TIERS = (Tier.T1, Tier.T2)


@dataclass
class Moves:
    added: dict[int, list[str]] = field(default_factory=dict)  # finding index -> ids of the T4 fragments it replaced
    displaced: dict[int, str] = field(default_factory=dict)  # T4 index -> id of the finding that took its place


def is_finding(candidate: Candidate) -> bool:
    return candidate.tier in FINDING_TIERS


def is_yielding(candidate: Candidate) -> bool:
    """Patient report and filler that may give way: T4 and protected by nothing."""
    return candidate.tier is Tier.T4 and not candidate.critical


def findings_before_filler(candidates: Sequence[Candidate], chosen: dict[int, int], window: int) -> Moves:
    """Give dropped findings the room T4 fragments hold; updates `chosen` (index -> option) in place."""
    moves = Moves()
    room = window - sum(candidates[i].options[j].tokens for i, j in chosen.items())
    waiting = sorted((i for i, c in enumerate(candidates) if i not in chosen and is_finding(c)),
                     key=lambda i: (-max(o.utility for o in candidates[i].options), i))
    yielding = sorted((j for j in chosen if is_yielding(candidates[j])),  # once: a finding never yields
                      key=lambda j: (candidates[j].options[chosen[j]].utility, -j))
    held = sum(candidates[j].options[chosen[j]].tokens for j in yielding)
    given = 0  # yielding[:given] have given their place
    for index in waiting:
        options = [k for k, o in enumerate(candidates[index].options) if o.tokens <= room + held]
        if not options:
            continue
        best = max(options, key=lambda k: (candidates[index].options[k].utility, -k))
        need = candidates[index].options[best].tokens
        replaced: list[str] = []
        while room < need:
            j = yielding[given]
            given += 1
            tokens = candidates[j].options[chosen.pop(j)].tokens
            room, held = room + tokens, held - tokens
            moves.displaced[j] = candidates[index].fragment.id
            replaced.append(candidates[j].fragment.id)
        chosen[index] = best
        room -= need
        moves.added[index] = replaced
    return moves
