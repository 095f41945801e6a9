"""A cheap pre-selection for records far larger than the window, before anything is embedded.

Measuring a fragment (entity compression, an embedding, token counts) costs about a millisecond, so a
20,000-fragment chart costs tens of seconds when only a few hundred fragments can ever fit. When the
record's estimated size exceeds `windows` times the window (and it has more than `min_fragments`
fragments), this step keeps:

- every critical fragment (levels 1-3 of packing.levels) and the rest of the current
  encounter: the safety guarantee of the critical-first packer is untouched, because no critical
  fragment is ever pre-filtered;
- the best of the rest by an estimate of their utility that needs no model: tier weight × recency
  decay × (floor + the share of the question's rare words that the fragment contains, IDF-weighted over
  the record), until the kept fragments are worth `windows` windows of estimated tokens.

Everything else is dropped with reason `prefiltered` and its estimated rank, so the trace still names
every fragment. The quality cost is measured in `bench/prefilter_quality.py` (docs/results/prefilter.md).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ebmrag.packing.levels import Level, level_of
from ebmrag.packing.types import DroppedFragment, DropReason
from ebmrag.packing.utility import (
    UtilityParams,
    age_in_years,
    current_encounter_id,
    hours_before,
    in_current_encounter,
    same_encounter,
)
from ebmrag.records.fragment import Fragment

_WORD = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]")
_CHARS_PER_TOKEN = 4  # a rough estimate: only the order of magnitude of the kept set depends on it
_HEADER_TOKENS = 12


@dataclass(frozen=True)
class Prefilter:
    windows: float = 4.0  # keep fragments worth this many windows of estimated tokens
    min_fragments: int = 1000  # never pre-filter a record this small, and keep at least this many

    def __post_init__(self) -> None:
        if self.windows < 1:
            raise ValueError(f"prefilter windows must be >= 1, got {self.windows}")
        if self.min_fragments < 1:
            raise ValueError(f"prefilter min_fragments must be >= 1, got {self.min_fragments}")

    def select(self, fragments: Sequence[Fragment], query: str, window: int, as_of: datetime | None,
               params: UtilityParams) -> tuple[list[Fragment], list[DroppedFragment]]:
        """(the fragments to measure, in record order; the pre-filtered ones with their reason).
        Fragments must already carry their tier decisions."""
        costs = [estimated_tokens(f.text) for f in fragments]
        budget = self.windows * window
        if len(fragments) <= self.min_fragments or sum(costs) <= budget:
            return list(fragments), []
        protected = _critical(fragments, as_of, params)
        scores = _estimates(fragments, query, as_of, params)
        ranked = sorted((i for i in range(len(fragments)) if i not in protected), key=lambda i: (-scores[i], i))
        keep, spent = set(protected), sum(costs[i] for i in protected)
        dropped: list[DroppedFragment] = []
        for rank, index in enumerate(ranked, start=1):
            if len(keep) < self.min_fragments or spent < budget:
                keep.add(index)
                spent += costs[index]
                continue
            fragment = fragments[index]
            dropped.append(DroppedFragment(
                fragment.id, fragment.tier, DropReason.PREFILTERED,
                f"a record of {len(fragments):,} fragments: ranked {rank:,} of {len(ranked):,} non-critical "
                f"fragments by tier, recency and the question's words, below the {len(keep):,} measured",
                date_in_future=fragment.date_in_future))
        return [f for i, f in enumerate(fragments) if i in keep], dropped


def estimated_tokens(text: str) -> int:
    return _HEADER_TOKENS + len(text) // _CHARS_PER_TOKEN


def _critical(fragments: Sequence[Fragment], as_of: datetime | None, params: UtilityParams) -> set[int]:
    """Critical fragments (levels 1-3 of packing.levels: allergies, the current encounter's T1/T2, standing
    history), and every dated or
    encounter-named fragment of the current encounter: the visit being asked about is always measured, and
    the fragments that define "current" for the packer stay in the record it sees."""
    encounter = current_encounter_id(fragments)
    protected = set()
    for index, fragment in enumerate(fragments):
        current = in_current_encounter(same_encounter(fragment, encounter), hours_before(fragment, as_of), params)
        situated = fragment.timestamp is not None or fragment.encounter is not None
        if level_of(fragment.decision, current) < Level.UTILITY or (current and situated):
            protected.add(index)
    return protected


def _estimates(fragments: Sequence[Fragment], query: str, as_of: datetime | None,
               params: UtilityParams) -> list[float]:
    """W(tier) · exp(-λ·age) · (floor + IDF-weighted share of the question's words present)."""
    words = [set(_WORD.findall(f.text.lower())) for f in fragments]
    asked = set(_WORD.findall(query.lower()))
    document_frequency = Counter(w for found in words for w in found & asked)
    idf = {w: math.log(1 + len(fragments) / (1 + document_frequency[w])) for w in asked}
    total = sum(idf.values()) or 1.0
    scores = []
    for fragment, found in zip(fragments, words, strict=True):
        overlap = sum(idf[w] for w in found & asked) / total
        decay = math.exp(-params.decay_lambda * age_in_years(fragment, as_of))
        scores.append(params.weights.of(fragment.tier) * decay * (params.similarity_floor + overlap))
    return scores
