from __future__ import annotations

from ebmrag.packing.types import Candidate, PackOption, State
from ebmrag.records.fragment import Fragment, Tier, TierDecision


def make_candidate(
    fragment_id: str,
    tier: str,
    tokens: int,
    utility: float,
    order: int = 0,
    similarity: float = 0.5,
    compressed_tokens: int | None = None,
    must_keep: bool = False,
) -> Candidate:
    fragment = Fragment(
        fragment_id, "p", " ".join(["word"] * tokens), decision=TierDecision(Tier(tier), "test", must_keep=must_keep)
    )
    options = [PackOption(State.FULL, f"[{fragment_id}] {fragment.text}", tokens, utility)]
    if compressed_tokens is not None:
        options.append(PackOption(State.COMPRESSED, f"[{fragment_id}] short", compressed_tokens, utility * 0.9, 0.9))
    return Candidate(fragment, f"[{fragment_id}]", tuple(options), similarity, must_keep, order)
