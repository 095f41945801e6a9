"""The clinical order of critical facts (packing.levels): allergies always, today's findings next, standing
history after, the rest by utility; in both EBM packers, with every level named in the trace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.levels import Level, level_name, level_of
from ebmrag.packing.overflow import allergy_overflow
from ebmrag.packing.types import Candidate, PackOption, PackResult, State
from ebmrag.records.fragment import Fragment, Tier, TierDecision
from tests.packing.strategies import candidate_sets

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ALLERGY = TierDecision(Tier.T1, "section.allergy.drug", standing=True, must_keep=True, always="allergy")
PATHOLOGY = TierDecision(Tier.T1, "text.pathology.morphology", standing=True, must_keep=True)
LAB = TierDecision(Tier.T2, "text.lab_value")
DIAGNOSIS = TierDecision(Tier.T2, "section.diagnosis", standing=True)
CRITICAL = TierDecision(Tier.T2, "text.result.critical", critical=True)
NOTE = TierDecision(Tier.T4, "default.subjective")


def candidate(fid: str, decision: TierDecision, tokens: int, current: bool, utility: float = 1.0,
              compressed: int | None = None, days_old: float = 0.0) -> Candidate:
    fragment = Fragment(fid, "p", f"text of {fid}", timestamp=NOW - timedelta(days=days_old), decision=decision)
    options = [PackOption(State.FULL, f"[{fid}] full", tokens, utility)]
    if compressed is not None:
        options.append(PackOption(State.COMPRESSED, f"[{fid}] short", compressed, utility * 0.8, 0.8))
    return Candidate(fragment, f"[{fid}]", tuple(options), 0.5, decision.must_keep, 0, current)


def test_levels_follow_the_clinical_order() -> None:
    assert level_of(ALLERGY, current=False) is Level.ALWAYS, "an allergy is level 1 whatever its age"
    assert level_of(PATHOLOGY, current=True) is Level.CURRENT_ENCOUNTER
    assert level_of(PATHOLOGY, current=False) is Level.STANDING_HISTORY, "another visit's biopsy is history"
    assert level_of(DIAGNOSIS, current=False) is Level.STANDING_HISTORY, "a chronic diagnosis is standing history"
    assert level_of(CRITICAL, current=True) is Level.CURRENT_ENCOUNTER
    assert level_of(CRITICAL, current=False) is Level.STANDING_HISTORY
    assert level_of(LAB, current=True) is Level.CURRENT_ENCOUNTER
    assert level_of(LAB, current=False) is Level.UTILITY, "an old routine lab competes on utility (it decays)"
    assert level_of(NOTE, current=True) is Level.UTILITY
    assert level_name(ALLERGY, False) == "allergy" and level_name(PATHOLOGY, False) == "standing_history"
    assert level_name(NOTE, True) == ""


def test_an_old_allergy_and_todays_biopsy_beat_another_visits_biopsy() -> None:
    """The protocol's failure: other visits' pathology at level 1 pushed out today's findings."""
    old_biopsy = candidate("old-biopsy", PATHOLOGY, 30, current=False, utility=3.0, compressed=20, days_old=400)
    candidates = [candidate("allergy", ALLERGY, 10, current=False, days_old=3000),
                  candidate("biopsy", PATHOLOGY, 30, current=True, compressed=25),
                  candidate("lab", LAB, 15, current=True), old_biopsy,
                  candidate("note", NOTE, 10, current=True, utility=5.0)]
    for packer in (ExactPacker(), GreedyPacker()):
        result = packer.pack(candidates, 60)
        reasons = {p.fragment_id: p.reason.value for p in result.packed}
        assert reasons == {"allergy": "allergy", "biopsy": "current_encounter", "lab": "current_encounter"}, packer
        dropped = {d.fragment_id: d for d in result.dropped}
        assert dropped["old-biopsy"].level == "standing_history" and "level 3" in dropped["old-biopsy"].detail
    roomier = ExactPacker().pack(candidates, 80)
    history = next(p for p in roomier.packed if p.fragment_id == "old-biopsy")
    assert history.reason.value == "standing_history" and history.state is State.COMPRESSED, \
        "history is offered compressed first, so today's findings keep their full text"
    assert roomier.to_json()["packed"][0]["level"] == "allergy"


def test_history_ranks_above_everything_not_critical_and_is_compressed_so_more_fit() -> None:
    histories = [candidate(f"h{i}", PATHOLOGY, 20, current=False, compressed=10, days_old=500) for i in range(3)]
    filler = candidate("note", NOTE, 5, current=True, utility=50.0)
    result = ExactPacker().pack([*histories, filler], 30)
    packed = {p.fragment_id: p.state for p in result.packed}
    assert packed == {"h0": State.COMPRESSED, "h1": State.COMPRESSED, "h2": State.COMPRESSED}


def test_when_allergies_alone_overflow_the_severe_and_newest_come_first() -> None:
    severe = TierDecision(Tier.T1, "section.allergy.high_risk", standing=True, must_keep=True, always="allergy",
                          severe=True)
    allergies = [candidate("old-rash", ALLERGY, 10, current=False, days_old=900),
                 candidate("new-rash", ALLERGY, 10, current=False, days_old=10),
                 candidate("anaphylaxis", severe, 10, current=False, days_old=4000)]
    assert allergy_overflow(allergies, 20) == {0}
    for packer in (ExactPacker(), GreedyPacker()):
        result = packer.pack([*allergies, candidate("biopsy", PATHOLOGY, 5, current=True)], 20)
        assert {p.fragment_id for p in result.packed} == {"anaphylaxis", "new-rash"}, packer
        dropped = next(d for d in result.dropped if d.fragment_id == "old-rash")
        assert "alone overflow the window" in dropped.detail and dropped.level == "allergy"
    assert "2 of 3 kept" in ExactPacker().pack(allergies, 20).solver_note


def _violations(result: PackResult, candidates: list[Candidate]) -> list[str]:
    """Level-k fragments dropped while a fragment of a lower level is packed in a state that, dropped or
    compressed, would make room for it."""
    by_id = {c.fragment.id: c for c in candidates}
    room = result.window - result.tokens_used
    found = []
    for dropped in result.dropped:
        waiting = by_id[dropped.fragment_id]
        if not waiting.critical:
            continue
        need = min(o.tokens for o in waiting.options)
        for packed in result.packed:
            holder = by_id[packed.fragment_id]
            smallest = min(o.tokens for o in holder.options)
            below = holder.level > waiting.level or (holder.level == waiting.level and holder.rank < waiting.rank)
            if below and (room + packed.tokens >= need or room + packed.tokens - smallest >= need):
                found.append(f"{waiting.fragment.id} (level {waiting.level}, rank {waiting.rank}) dropped while "
                             f"{holder.fragment.id} (level {holder.level}, rank {holder.rank}, {packed.tokens} "
                             f"tokens) is packed; {room} left, needs {need}")
    return found


@settings(max_examples=300, deadline=None)
@given(candidate_sets(max_size=10), st.integers(min_value=1, max_value=200), st.integers(min_value=0, max_value=3))
def test_no_critical_fragment_waits_behind_a_lower_level_or_rank(candidates: list[Candidate], window: int,
                                                         k_min: int) -> None:
    for packer in (ExactPacker(k_min=k_min), GreedyPacker(k_min=k_min)):
        result = packer.pack(candidates, window)
        assert not _violations(result, candidates), (packer.name, _violations(result, candidates))


def test_a_fact_line_is_the_last_resort_to_pack_one_more_never_to_lengthen_another() -> None:
    def finding(fid: str, fact: bool) -> Candidate:
        fragment = Fragment(fid, "p", f"text of {fid}", timestamp=NOW, decision=PATHOLOGY)
        options = [PackOption(State.FULL, f"[{fid}] full", 40, 1.0),
                   PackOption(State.COMPRESSED, f"[{fid}] short", 30, 0.8, 0.8)]
        options += [PackOption(State.FACT, f"[{fid}] fact", 10, 0.5, 0.5)] if fact else []
        return Candidate(fragment, f"[{fid}]", tuple(options), 0.5, True, 0, True)

    pair = [finding("a", fact=True), finding("b", fact=False)]
    for packer in (ExactPacker(), GreedyPacker()):
        roomy = {p.fragment_id: p.state for p in packer.pack(pair, 70).packed}
        assert State.FACT not in roomy.values() and len(roomy) == 2, (packer, roomy)
        tight = {p.fragment_id: p.state for p in packer.pack(pair, 45).packed}
        assert tight == {"a": State.FACT, "b": State.COMPRESSED}, (packer, tight)
