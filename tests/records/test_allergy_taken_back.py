"""An AllergyIntolerance whose own words deny it or take it back is an allergy status, never an allergy: not on the
CDS cards, not in the face sheet's list, never packed at level 1 (records.fhir.chart_facts.allergy_stands, the
shared negation grammar of vocab.negation; rules/evidence/tiers.toml `section.allergy.status`). One whose words
doubt it, or negate something else, stays an allergy.

The entries are written for these tests; none is taken from a corpus or a rule file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.levels import Level, level_of
from ebmrag.packing.types import Candidate, PackOption, State
from ebmrag.records.fhir.chart_facts import allergy_stands
from ebmrag.records.fragment import Fragment
from ebmrag.records.loaders import load_record

PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "male", "birthDate": "1961-02-11"}
ME = {"reference": "Patient/p1"}


def entry(rid: str, words: str, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "AllergyIntolerance", "id": rid, "patient": ME, "category": ["medication"],
            "code": {"text": words}, **extra}


@pytest.mark.parametrize("words", [
    "No allergy to ceftriaxone",
    "否认头孢曲松过敏",
    "无头孢曲松过敏史",
    "Ceftriaxone allergy excluded after drug provocation test",
    "头孢曲松过敏已排除",
    "Ceftriaxone: label deleted from the allergy record after an uneventful graded challenge",
    "头孢曲松过敏标签已删除（激发试验阴性）",
    "Ceftriaxone - passed a two-step challenge",
])
def test_an_entry_that_takes_itself_back_does_not_stand(words: str) -> None:
    assert not allergy_stands(entry("a1", words)), words


@pytest.mark.parametrize("words", [
    "阿莫西林过敏（未确认）",  # doubt is no negation: the label is kept until it is taken back
    "Amoxicillin allergy (unverified, per patient)",
    "Amoxicillin - no rash, facial swelling",
    "阿莫西林过敏，无皮疹，表现为喉头水肿",
    "Amoxicillin: skin test negative",  # a skin test alone does not de-label
    "Amoxicillin intolerance, not allergy",  # an intolerance is still a reaction
    "Possible amoxicillin allergy",
])
def test_an_entry_that_doubts_or_negates_something_else_stands(words: str) -> None:
    assert allergy_stands(entry("a1", words)), words


def test_a_refuted_or_mistaken_entry_never_stands_whatever_its_words() -> None:
    for status in ({"coding": [{"code": "refuted"}]}, {"coding": [{"code": "entered-in-error"}]},
                   {"text": "Entered in Error"}):
        assert not allergy_stands(entry("a1", "Amoxicillin", verificationStatus=status))
    assert allergy_stands(entry("a1", "Amoxicillin", verificationStatus={"coding": [{"code": "unconfirmed"}]}))


def _tiered(tmp_path: Path, *resources: dict[str, Any]) -> dict[str, Fragment]:
    path = tmp_path / "chart.json"
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in (PATIENT, *resources)]}
    path.write_text(json.dumps(bundle), encoding="utf-8")
    return {f.id: f for f in TierClassifier().run(load_record(path)).fragments}


def test_a_delabelled_entry_is_an_allergy_status_and_never_level_1(tmp_path: Path) -> None:
    fragments = _tiered(
        tmp_path,
        entry("gone", "Penicillin allergy de-labelled after a negative direct oral amoxicillin challenge"),
        entry("denied", "否认青霉素过敏"),
        entry("kept", "头孢呋辛过敏（未确认）"),
        entry("stands", "Sulfamethoxazole", criticality="high"))
    for rid in ("gone", "denied"):
        status = fragments[f"AllergyIntolerance/{rid}"]
        assert status.section == "Allergy status" and status.decision is not None
        assert level_of(status.decision, current=False) is not Level.ALWAYS, status.decision
    for rid in ("kept", "stands"):
        allergy = fragments[f"AllergyIntolerance/{rid}"]
        assert level_of(allergy.decision, current=False) is Level.ALWAYS, (allergy.text, allergy.decision)
    banner = fragments["summary/allergies"].text
    assert banner.startswith("Allergies (2): ") and "Penicillin allergy de-labelled" in banner, banner


def _candidate(fragment: Fragment) -> Candidate:
    option = PackOption(State.FULL, fragment.text, 20, 1.0)
    must_keep = bool(fragment.decision and fragment.decision.must_keep)
    return Candidate(fragment, fragment.text, (option,), 0.5, must_keep, 0, False)


def test_the_packers_keep_the_allergy_at_level_1_and_the_delabelled_one_below_it(tmp_path: Path) -> None:
    fragments = _tiered(tmp_path, entry("gone", "Cefalexin allergy label removed: tolerated a graded challenge"),
                        entry("stands", "Cefalexin", reaction=[{"manifestation": [{"text": "Anaphylaxis"}]}]))
    candidates = [_candidate(fragments[f"AllergyIntolerance/{rid}"]) for rid in ("gone", "stands")]
    for packer in (ExactPacker(), GreedyPacker()):
        result = packer.pack(candidates, 200)
        reasons = {p.fragment_id: p.reason.value for p in result.packed}
        assert reasons["AllergyIntolerance/stands"] == "allergy", packer
        assert reasons.get("AllergyIntolerance/gone") != "allergy", packer


def test_a_delabelled_allergy_told_in_free_text_is_never_level_1() -> None:
    rules = TierClassifier()
    for text in ("Penicillin allergy label removed after a negative oral amoxicillin challenge in 2023.",
                 "既往“头孢过敏”经激发试验证实为非过敏。"):
        decision = rules.classify(text)
        assert level_of(decision, current=False) is not Level.ALWAYS, (text, decision)
    assert level_of(rules.classify("Penicillin allergy: anaphylaxis 2015."), current=False) is Level.ALWAYS
