"""The three baselines EBM-Pack is measured against, as the EBM-Pack paper defines them.

- fifo: the candidate queue in record order, full text, until the first fragment that does not fit.
- semantic: the same, ordered by cosine similarity to the query.
- uniform: the first r share of every fragment's words, r = window / total tokens, lowered by
  bisection to the largest share whose rendered lines fit (token counts are not proportional to
  word counts, and every kept line pays its header, so one pass can overflow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ebmrag.models.tokens import truncate_words
from ebmrag.packing.types import (
    Candidate,
    DroppedFragment,
    DropReason,
    PackedFragment,
    PackOption,
    PackReason,
    PackResult,
    State,
    drop_entry,
    one_line,
    pack_entry,
    render_line,
    validate_window,
)
from ebmrag.protocols import TokenCounter


def _pack_in_order(name: str, ordered: Sequence[Candidate], window: int, reason: PackReason) -> PackResult:
    packed: list[PackedFragment] = []
    dropped: list[DroppedFragment] = []
    room = window
    full_at: str | None = None
    for rank, candidate in enumerate(ordered, 1):
        if full_at is None and candidate.full.tokens <= room:
            packed.append(pack_entry(candidate, candidate.full, reason, f"position {rank}"))
            room -= candidate.full.tokens
            continue
        full_at = full_at or candidate.fragment.id
        dropped.append(
            drop_entry(
                candidate,
                DropReason.CAPACITY,
                f"window full: truncation stopped at fragment {full_at!r} (position {rank})",
            )
        )
    return PackResult(name, window, tuple(packed), tuple(dropped))


class FifoPacker:
    name = "fifo"

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult:
        validate_window(window)
        return _pack_in_order(self.name, sorted(candidates, key=lambda c: c.order), window, PackReason.QUEUE_ORDER)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name}


class SemanticPacker:
    name = "semantic"

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult:
        validate_window(window)
        ordered = sorted(candidates, key=lambda c: (-c.similarity, c.order))
        return _pack_in_order(self.name, ordered, window, PackReason.SIMILARITY_RANK)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name}


class UniformPacker:
    name = "uniform"

    def __init__(self, token_counter: TokenCounter, search_steps: int = 20) -> None:
        if search_steps < 1:
            raise ValueError(f"search_steps must be >= 1, got {search_steps}")
        self.token_counter = token_counter
        self.search_steps = search_steps

    def _truncate(self, candidates: Sequence[Candidate], share: float) -> list[PackOption | None]:
        bodies = [truncate_words(c.fragment.text, share) for c in candidates]
        lines = [render_line(c.header, b) for c, b in zip(candidates, bodies, strict=True)]
        counts = self.token_counter.count_many(lines)
        return [
            PackOption(State.TRUNCATED, line, n, c.full.utility * share, body=one_line(body)) if body else None
            for c, body, line, n in zip(candidates, bodies, lines, counts, strict=True)
        ]

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult:
        validate_window(window)
        total = sum(c.full.tokens for c in candidates)
        if total <= window:
            return PackResult(
                self.name,
                window,
                tuple(pack_entry(c, c.full, PackReason.UNIFORM_SHARE, "everything fits") for c in candidates),
                (),
            )
        share, options = self._largest_share(candidates, window, window / total)
        packed = [
            pack_entry(c, o, PackReason.UNIFORM_SHARE, f"first {share:.0%} of its words")
            for c, o in zip(candidates, options, strict=True)
            if o
        ]
        dropped = [
            drop_entry(c, DropReason.TRUNCATED_AWAY, f"a {share:.0%} share of its words is no word")
            for c, o in zip(candidates, options, strict=True)
            if not o
        ]
        return PackResult(self.name, window, tuple(packed), tuple(dropped))

    def _largest_share(self, candidates: Sequence[Candidate], window: int,
                       start: float) -> tuple[float, list[PackOption | None]]:
        """Bisection on the share: a share of 0 keeps no word and always fits."""
        options = self._truncate(candidates, start)
        if sum(o.tokens for o in options if o) <= window:
            return start, options
        low, high = 0.0, start
        best: list[PackOption | None] = [None] * len(candidates)
        for _ in range(self.search_steps):
            middle = (low + high) / 2
            trial = self._truncate(candidates, middle)
            if sum(o.tokens for o in trial if o) <= window:
                low, best = middle, trial
            else:
                high = middle
        return low, best

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "search_steps": self.search_steps}
