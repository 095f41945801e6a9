"""Packing and dates after the present (issue 43): a fragment dated decades ahead (a mistyped year) gets no more
recency utility than today's, never defines "today" (as_of, the current encounter), and is flagged in its context
line and the trace."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.dedup import collapse_duplicates
from ebmrag.packing.overflow import allergy_overflow
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.prefilter import Prefilter
from ebmrag.packing.types import Candidate, DropReason, PackOption, State
from ebmrag.packing.utility import UtilityParams, age_in_years, current_encounter_id, fragment_header
from ebmrag.records.dates import Today
from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TYPO = datetime(2062, 3, 2, 8, 0, tzinfo=UTC)  # "2062" typed for "2026"
LAB = TierDecision(Tier.T2, "test")


def lab(fid: str, when: datetime | None, text: str = "Creatinine 2.4 mg/dL (high).", **extra: object) -> Fragment:
    return Fragment(fid, "p", text, "Laboratory", when, decision=LAB, **extra)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(ahead_days=st.floats(min_value=1.01, max_value=80 * 365), decay=st.floats(min_value=0.0, max_value=50.0),
       older_days=st.floats(min_value=0.0, max_value=30 * 365), hours=st.floats(min_value=0.0, max_value=23.9))
def test_a_future_dated_fragment_never_has_more_recency_than_todays(ahead_days: float, decay: float,
                                                                   older_days: float, hours: float) -> None:
    today = Today(NOW)
    todays = lab("today", NOW - timedelta(hours=hours))
    older = lab("older", NOW - timedelta(days=older_days))
    ahead = lab("ahead", NOW + timedelta(days=ahead_days)).flagged_at(today)
    record = PatientRecord("p", (older, todays, ahead))
    as_of = record.latest_timestamp
    assert ahead.date_in_future and as_of is not None and as_of <= NOW
    recency = {f.id: math.exp(-decay * age_in_years(f, as_of)) for f in record.fragments}
    assert recency["ahead"] <= recency["today"]
    assert age_in_years(ahead, as_of) >= age_in_years(todays, as_of) >= 0.0, "its distance ahead, never a bonus"


def test_the_current_encounter_is_never_the_future_dated_one() -> None:
    fragments = [lab("t", NOW, encounter="Encounter/today"), lab("x", TYPO, encounter="Encounter/typo",
                                                                 date_in_future=True)]
    assert current_encounter_id(fragments) == "Encounter/today"
    assert current_encounter_id(fragments[1:]) == "Encounter/typo", "only when no other visit is named"


def test_the_context_line_flags_the_date() -> None:
    assert fragment_header(lab("x", TYPO, date_in_future=True), 3) == "[3|T2|date in the future: 2062-03-02]"
    assert fragment_header(lab("t", NOW), 2) == "[2|T2|2026-03-02]"


def _candidate(fragment: Fragment, order: int) -> Candidate:
    option = PackOption(State.FULL, f"[{order}] {fragment.text}", 20, 1.0, body=fragment.text)
    return Candidate(fragment, f"[{order}]", (option,), 0.5, False, order)


def test_of_two_copies_the_one_dated_in_the_future_is_dropped() -> None:
    text = "Serum creatinine 2.4 mg/dL on the morning panel, repeat ordered for tomorrow."
    kept, dropped = collapse_duplicates([_candidate(lab("t", NOW, text), 0),
                                         _candidate(lab("x", TYPO, text, date_in_future=True), 1)])
    assert [c.fragment.id for c in kept] == ["t"] and [d.fragment_id for d in dropped] == ["x"]
    assert dropped[0].date_in_future


def test_an_allergy_dated_in_the_future_gives_way_first_when_allergies_overflow() -> None:
    allergy = TierDecision(Tier.T1, "test", always="allergy")
    typo = Fragment("a-typo", "p", "Allergy to penicillin.", timestamp=TYPO, decision=allergy, date_in_future=True)
    today = Fragment("a-today", "p", "Allergy to sulfonamides.", timestamp=NOW, decision=allergy)
    assert allergy_overflow([_candidate(typo, 0), _candidate(today, 1)], 25) == {0}


def test_the_prefilter_does_not_protect_a_future_dated_lab_as_current() -> None:
    filler = [Fragment(f"f{i}", "p", f"Walked {i} metres with the physiotherapist.", "Notes",
                       NOW - timedelta(days=400), decision=TierDecision(Tier.T4, "test")) for i in range(40)]
    fragments = [lab("today", NOW), lab("typo", TYPO, date_in_future=True), *filler]
    kept, dropped = Prefilter(windows=1, min_fragments=1).select(fragments, "walked metres", 10, NOW,
                                                                 UtilityParams())
    assert "today" in {f.id for f in kept}, "today's finding is the current encounter: protected"
    typo = next(d for d in dropped if d.fragment_id == "typo")
    assert typo.reason is DropReason.PREFILTERED and typo.date_in_future


@pytest.mark.model
def test_a_typo_year_neither_decays_todays_chart_nor_joins_todays_visit(context_packer: ContextPacker,
                                                                        tiering: Tiering) -> None:
    """Before issue 43 the 2062 fragment was the record's newest: as_of moved 36 years ahead, every fragment of
    today decayed to nothing and the current encounter was the typo's."""
    record = tiering.run(PatientRecord("p", (
        Fragment("note", "p", "Seen today for fatigue; metformin considered.", "Note", NOW - timedelta(hours=3)),
        Fragment("cr", "p", "Creatinine 2.4 mg/dL (high).", "Laboratory", NOW - timedelta(hours=2)),
        Fragment("cr-typo", "p", "Creatinine 0.9 mg/dL.", "Laboratory", TYPO),  # its reader did not flag it
    )))
    query = "Is metformin safe for her kidneys?"
    candidates = {c.fragment.id: c for c in context_packer.candidates(record, query, today=Today(NOW))}
    today, typo = candidates["cr"], candidates["cr-typo"]
    assert typo.fragment.date_in_future and not today.fragment.date_in_future
    assert today.current and not typo.current, "a date decades ahead is not today's visit"
    weight = context_packer.params.weights.of(Tier.T2)
    assert today.full.utility / (weight * max(today.similarity, 0.05)) == pytest.approx(math.exp(
        -context_packer.params.decay_lambda * 1 / (24 * 365.25)), rel=1e-3), "today's lab decays by its hour only"
    assert typo.full.utility / (weight * max(typo.similarity, 0.05)) < 1e-60, "36 years off: no recency left"
    result = context_packer.run(record, query, 256, today=Today(NOW))
    packed = {p.fragment_id: p for p in result.packed}
    assert packed["cr"].level == "current_encounter"
    assert packed["cr-typo"].text.startswith("[3|T2|date in the future: 2062-03-02] Creatinine 0.9")
    trace = result.to_json()
    flagged = [e for e in [*trace["packed"], *trace["dropped"]] if e.get("date_in_future")]
    assert [e["fragment_id"] for e in flagged] == ["cr-typo"]
    assert all("date_in_future" not in e for e in trace["packed"] if e["fragment_id"] != "cr-typo")


@pytest.mark.model
def test_the_packers_present_is_injectable_and_a_past_present_flags_nothing_new(
        context_packer: ContextPacker) -> None:
    record = PatientRecord("p", (lab("cr", NOW), replace(lab("cr2", NOW + timedelta(days=3)), decision=None)))
    earlier = context_packer.dated(record, Today(NOW))
    assert [f.date_in_future for f in earlier.fragments] == [False, True]
    later = context_packer.dated(record, Today(NOW + timedelta(days=10)))
    assert later is record, "three days on, the same date is today's"
