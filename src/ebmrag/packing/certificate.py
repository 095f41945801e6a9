"""The certificate of a pack: one glance tells an integrator whether anything critical was lost, and why.

A trace lists every fragment, which is what an auditor needs and more than an integrator reads. The certificate
sums it up per level of the clinical order (packing.levels): how many fragments were packed, left out (for room,
for a finding, pre-filtered) and collapsed into a kept copy (packing.dedup: the fact is still in the window, so it
is not lost); whether the solver proved the order optimal (ebm-exact on its plain table: no packing of the same
candidates keeps more of a level without giving up one above it); and, for the most important critical fragment
left out, the tokens its smallest state needs beside the room the pack left. `needs > room` with `optimal` true
says the window was too small; `optimal` false says a heuristic (or a coarsened token grid) made the choice.

It reads the trace through the small protocols below rather than importing packing.types, whose `to_json`
writes it: the two modules would otherwise import each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ebmrag.packing.levels import Level

COLLAPSED = "duplicate"  # packing.types.DropReason.DUPLICATE: a near-copy of a kept fragment (packing.dedup)
_LEVEL_OF_NAME = {"": Level.UTILITY, "current_encounter": Level.CURRENT_ENCOUNTER,
                  "standing_history": Level.STANDING_HISTORY}  # any other name is level 1's (why it is always kept)


class TracedFragment(Protocol):
    """A packed fragment as the trace records it (packing.types.PackedFragment)."""

    @property
    def fragment_id(self) -> str: ...

    @property
    def level(self) -> str: ...


class LeftOutFragment(TracedFragment, Protocol):
    """A dropped fragment as the trace records it (packing.types.DroppedFragment)."""

    @property
    def reason(self) -> str: ...

    @property
    def needs(self) -> int: ...

    @property
    def order(self) -> int: ...


class TracedPack(Protocol):
    """A pack's trace (packing.types.PackResult)."""

    @property
    def window(self) -> int: ...

    @property
    def packed(self) -> Sequence[TracedFragment]: ...

    @property
    def dropped(self) -> Sequence[LeftOutFragment]: ...

    @property
    def tokens_used(self) -> int: ...

    @property
    def optimal(self) -> bool: ...


def level_number(name: str) -> Level:
    """The level of a trace's level name (packing.levels.level_name): "" is level 4, and every name but the
    two of levels 2 and 3 is a reason to keep a fragment always ("allergy", "face_sheet", "question_need")."""
    return _LEVEL_OF_NAME.get(name, Level.ALWAYS)


@dataclass(frozen=True)
class LevelCount:
    """One level's fragments: packed, left out (lost to this window) and collapsed into a kept copy (not lost)."""

    level: Level
    packed: int = 0
    left_out: int = 0
    collapsed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"level": int(self.level), "name": self.level.name.lower(), "packed": self.packed,
                "left_out": self.left_out, "collapsed": self.collapsed}


@dataclass(frozen=True)
class CriticalLoss:
    """The most important critical fragment left out: lowest level, then record order. `needs`: the tokens of its
    smallest state; `room`: the window less the tokens packed. 0 needs: the fragment was never measured."""

    fragment_id: str
    level: Level
    level_name: str
    reason: str
    needs: int
    room: int

    def to_json(self) -> dict[str, Any]:
        return {"fragment_id": self.fragment_id, "level": int(self.level), "level_name": self.level_name,
                "reason": self.reason, "needs": self.needs, "room": self.room}


@dataclass(frozen=True)
class Certificate:
    optimal: bool
    levels: tuple[LevelCount, ...]
    first_critical_left_out: CriticalLoss | None

    @property
    def critical_left_out(self) -> int:
        """Critical fragments (levels 1-3) left out; a collapsed copy is not one."""
        return sum(c.left_out for c in self.levels if c.level < Level.UTILITY)

    def to_json(self) -> dict[str, Any]:
        first = self.first_critical_left_out
        return {"optimal": self.optimal, "critical_left_out": self.critical_left_out,
                "first_critical_left_out": first.to_json() if first else None,
                "levels": [c.to_json() for c in self.levels]}


def certificate(result: TracedPack) -> Certificate:
    """The certificate of one pack, from its trace alone."""
    packed = {level: 0 for level in Level}
    left_out = dict(packed)
    collapsed = dict(packed)
    for fragment in result.packed:
        packed[level_number(fragment.level)] += 1
    for dropped in result.dropped:
        counts = collapsed if dropped.reason == COLLAPSED else left_out
        counts[level_number(dropped.level)] += 1
    levels = tuple(LevelCount(level, packed[level], left_out[level], collapsed[level]) for level in Level)
    return Certificate(result.optimal, levels, _first_lost(result))


def _first_lost(result: TracedPack) -> CriticalLoss | None:
    lost = [(level_number(d.level), d.order, position, d) for position, d in enumerate(result.dropped)
            if d.reason != COLLAPSED and level_number(d.level) < Level.UTILITY]
    if not lost:
        return None
    level, _, _, first = min(lost, key=lambda entry: entry[:3])
    return CriticalLoss(first.fragment_id, level, first.level, str(first.reason), first.needs,
                        result.window - result.tokens_used)
