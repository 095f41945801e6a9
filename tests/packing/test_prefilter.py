"""The large-record pre-filter: critical fragments are never removed, every fragment stays traced, and
the question's words decide which of the rest are measured."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.params import PackingParams
from ebmrag.packing.prefilter import Prefilter, estimated_tokens
from ebmrag.packing.types import DropReason
from ebmrag.packing.utility import UtilityParams
from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision

NOW = datetime(2026, 3, 1, tzinfo=UTC)
PARAMS = UtilityParams()


def fragment(i: int, text: str, tier: str = "T4", must_keep: bool = False, days_ago: float = 400) -> Fragment:
    return Fragment(f"f{i}", "p", text, "Notes", NOW - timedelta(days=days_ago),
                    decision=TierDecision(Tier(tier), "test", must_keep=must_keep))


def test_a_small_or_short_record_is_left_whole() -> None:
    few = [fragment(i, "Walked in the corridor.") for i in range(50)]
    assert Prefilter(min_fragments=100).select(few, "kidney?", 256, NOW, PARAMS) == (few, [])
    many_short = [fragment(i, "ok") for i in range(200)]
    kept, dropped = Prefilter(min_fragments=10).select(many_short, "kidney?", 100_000, NOW, PARAMS)
    assert len(kept) == 200 and not dropped


def test_words_of_the_question_rank_fragments_of_the_same_tier() -> None:
    filler = [fragment(i, f"Walked {i} metres with the physiotherapist today.") for i in range(300)]
    needle = fragment(999, "Creatinine rising, kidney function worse than last month.", days_ago=400)
    kept, dropped = Prefilter(windows=1, min_fragments=20).select([*filler, needle], "How is his kidney function?",
                                                                 256, NOW, PARAMS)
    assert needle in kept
    assert len(kept) + len(dropped) == 301 and len(kept) < 100
    assert all(d.reason is DropReason.PREFILTERED and "ranked" in d.detail for d in dropped)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T1", "T2", "T3", "T4"]), st.booleans(), st.floats(0, 2000),
                          st.integers(1, 60)), min_size=30, max_size=120),
       st.integers(16, 400))
def test_critical_fragments_are_never_prefiltered(rows: list[tuple[str, bool, float, int]], window: int) -> None:
    fragments = [fragment(i, "word " * words, tier, keep and tier == "T1", days)
                 for i, (tier, keep, days, words) in enumerate(rows)]
    kept, dropped = Prefilter(windows=1, min_fragments=10).select(fragments, "word?", window, NOW, PARAMS)
    newest = max(f.timestamp for f in fragments if f.timestamp)
    for f in fragments:
        critical = (f.decision and f.decision.must_keep) or (
            f.tier in (Tier.T1, Tier.T2) and f.timestamp and (newest - f.timestamp) <= timedelta(hours=72))
        if critical:
            assert f in kept
    assert {f.id for f in kept} | {d.fragment_id for d in dropped} == {f.id for f in fragments}
    assert not {f.id for f in kept} & {d.fragment_id for d in dropped}
    if dropped:
        assert sum(estimated_tokens(f.text) for f in kept) >= window or len(kept) >= 10


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="windows"):
        Prefilter(windows=0.5)
    with pytest.raises(ValueError, match="min_fragments"):
        Prefilter(min_fragments=0)


@pytest.mark.model
def test_the_packer_traces_every_fragment_of_a_prefiltered_record(context_packer: ContextPacker,
                                                                   tiering: Tiering) -> None:
    history = [Fragment(f"n{i}", "p", f"Nursing round {i}: comfortable, walked {i % 40} metres.", "Notes",
                        NOW - timedelta(days=30 + i)) for i in range(1500)]
    allergy = Fragment("allergy", "p", "Anaphylaxis to penicillin in 2009.", "Allergies", NOW - timedelta(days=3000))
    record = tiering.run(PatientRecord("p", (allergy, *history, Fragment("today", "p", "Fever 39.1 C, cough.", "Notes",
                                                                         NOW))))
    packer = context_packer.with_params(PackingParams(prefilter_min_fragments=100))
    headers = [f"[{n}]" for n in range(len(record.fragments))]
    result = packer.run(record, "Which antibiotic is safe for his pneumonia?", 256, headers=headers)
    traced = [p.fragment_id for p in result.packed] + [d.fragment_id for d in result.dropped]
    assert sorted(traced) == sorted(f.id for f in record.fragments)
    assert "allergy" in {p.fragment_id for p in result.packed}
    assert any(p.text.startswith("[0] ") for p in result.packed), "headers follow their fragments"
    assert sum(d.reason is DropReason.PREFILTERED for d in result.dropped) > 1000
    assert context_packer.with_params(PackingParams(**packer.to_dict())).prefilter == Prefilter(min_fragments=100)
