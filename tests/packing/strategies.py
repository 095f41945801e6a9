"""Hypothesis strategies for random candidate sets (no model needed: utilities and costs are drawn)."""

from __future__ import annotations

from hypothesis import strategies as st

from ebmrag.packing.types import Candidate, PackOption, State
from ebmrag.records.fragment import Fragment, Tier, TierDecision


@st.composite
def candidate_sets(draw: st.DrawFn, max_size: int = 8, max_tokens: int = 60) -> list[Candidate]:
    size = draw(st.integers(min_value=1, max_value=max_size))
    candidates = []
    for order in range(size):
        tier = draw(st.sampled_from(list(Tier)))
        must_keep = tier is Tier.T1 and draw(st.booleans())
        always = draw(st.sampled_from(["", "allergy", "face_sheet"])) if must_keep else ""
        decision = TierDecision(tier, "test", standing=draw(st.booleans()), must_keep=must_keep,
                                critical=tier is Tier.T2 and draw(st.booleans()), always=always,
                                severe=bool(always) and draw(st.booleans()),
                                flag=draw(st.sampled_from(["", "", "abnormal", "normal"])))
        fragment = Fragment(f"f{order}", "p", f"text {order}", decision=decision)
        full_tokens = draw(st.integers(min_value=1, max_value=max_tokens))
        utility = draw(st.floats(min_value=0.0, max_value=3.0, allow_nan=False))
        options = [PackOption(State.FULL, f"line {order}", full_tokens, utility)]
        if tier.compressible and full_tokens > 1 and draw(st.booleans()):
            b_tokens = draw(st.integers(min_value=1, max_value=full_tokens - 1))
            fidelity = draw(st.floats(min_value=0.3, max_value=1.0))
            options.append(PackOption(State.COMPRESSED, f"short {order}", b_tokens, utility * fidelity, fidelity))
        smallest = min(o.tokens for o in options)
        if tier is Tier.T1 and smallest > 1 and draw(st.booleans()):  # a critical finding's one-line fact state
            fact_tokens = draw(st.integers(min_value=1, max_value=smallest - 1))
            options.append(PackOption(State.FACT, f"fact {order}", fact_tokens, utility * 0.5, 0.5))
        current = draw(st.booleans())
        candidates.append(Candidate(fragment, f"[f{order}]", tuple(options), utility / 3, must_keep, order, current))
    return candidates
