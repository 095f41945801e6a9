"""The tiering step: a record in, the same record with every fragment's tier decision and finding out."""

from __future__ import annotations

from typing import Any

import pytest

from ebmrag.evidence.tiering import Tiering
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision


def _record(*fragments: Fragment) -> PatientRecord:
    return PatientRecord("p", fragments)


def test_every_fragment_leaves_with_its_decision_and_finding() -> None:
    rules = TierClassifier()
    record = _record(Fragment("bx", "p", "Biopsy shows adenocarcinoma of the sigmoid colon.", "Pathology"),
                     Fragment("k", "p", "Potassium 6.8 mmol/L on the morning panel.", "Laboratory"),
                     Fragment("chat", "p", "Relatives phoned for an update.", "Nursing note"))
    tiered = Tiering(rules).run(record)
    expected = rules.classify_many([(f.text, f.section) for f in record.fragments])
    assert [f.decision for f in tiered.fragments] == expected
    assert tiered.fragments[0].tier is Tier.T1
    potassium = tiered.fragments[1].decision
    assert potassium is not None and potassium.critical and "potassium 6.8" in potassium.finding
    assert [f.id for f in tiered.fragments] == ["bx", "k", "chat"] and tiered.patient_id == "p"


def test_a_decided_fragment_keeps_its_decision_and_a_tiered_record_is_returned_as_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    graded = TierDecision(Tier.T3, "caller:guideline")
    record = _record(Fragment("g", "p", "Biopsy shows adenocarcinoma.", decision=graded),
                     Fragment("n", "p", "Walked 40 metres."))
    tiering = Tiering(TierClassifier())
    tiered = tiering.run(record)
    assert tiered.fragments[0].decision is graded and tiered.fragments[1].decision is not None
    monkeypatch.setattr(TierClassifier, "classify_many", lambda *a: pytest.fail("tiered again"))
    assert tiering.run(tiered) is tiered
    assert tiering.run(_record()).fragments == ()


def test_decide_gives_one_decision_per_text() -> None:
    decisions = Tiering(TierClassifier()).decide([("Anaphylaxis to penicillin in 2014.", "Allergies"),
                                                 ("Slept well.", None)])
    assert [d.must_keep for d in decisions] == [True, False]


def test_settings_round_trip_and_a_model_is_passed_in_built(tiering: Any) -> None:
    rules = Tiering(TierClassifier())
    assert Tiering.from_dict(rules.to_dict()).to_dict() == rules.to_dict() == {"classifier": {"rules_path": None}}
    data = tiering.to_dict()  # the session's: the bundled rules and tier model
    assert data["classifier"]["model_path"].endswith("tier_ngram.npz")
    with pytest.raises(ValueError, match="must be passed in built"):
        Tiering.from_dict(data)
    assert Tiering.from_dict(data, tiering.classifier).to_dict() == data
    with pytest.raises(ValueError, match="needs a TierClassifier"):
        Tiering(None)  # type: ignore[arg-type]
