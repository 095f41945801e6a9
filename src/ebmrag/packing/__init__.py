"""EBM-Pack: evidence-graded context packing under a token window, plus the baselines it is measured against."""

from ebmrag.packing.types import (
    Candidate,
    DroppedFragment,
    DropReason,
    PackedFragment,
    PackOption,
    PackReason,
    PackResult,
    State,
)

__all__ = [
    "Candidate",
    "DropReason",
    "DroppedFragment",
    "PackOption",
    "PackReason",
    "PackResult",
    "PackedFragment",
    "State",
]
