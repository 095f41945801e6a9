"""The shipped critical-fact recogniser (evidence.recogniser) on ONNX Runtime, and its place in tiering.

The sentences are written for this test, in the words of a ward and not of any corpus the model was trained on;
they are clear cases, so a model that fails them has lost what it was shipped for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ebmrag.errors import ModelUnavailableError
from ebmrag.evidence.recogniser import BUNDLED_RECOGNISER, CriticalRecogniser
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier


@pytest.fixture(scope="module")
def recogniser() -> CriticalRecogniser:
    return CriticalRecogniser()


def test_the_shipped_model_reads_critical_facts_in_both_languages(recogniser: CriticalRecogniser) -> None:
    cases = {
        "Two days into the cefuroxime she broke out in an itchy urticarial rash over the trunk.": "adr",
        "静滴头孢曲松过程中患者出现全身皮疹伴瘙痒，停药后好转。": "adr",
        "Biopsy of the sigmoid lesion: invasive adenocarcinoma, moderately differentiated.": "pathology",
    }
    read = recogniser.run(list(cases))
    for (text, kind), recognition in zip(cases.items(), read, strict=True):
        assert kind in recognition.kinds, (text, recognition.probabilities)


def test_routine_ward_text_is_not_critical(recogniser: CriticalRecogniser) -> None:
    routine = ["Patient mobilised to the chair with one assist and tolerated it well.",
               "Family updated by phone; they will visit tomorrow afternoon.",
               "患者夜间睡眠可，饮食正常。"]
    assert all(not r.kinds for r in recogniser.run(routine)), [r.probabilities for r in recogniser.run(routine)]


def test_a_fragment_is_read_sentence_by_sentence_and_spans_point_into_its_text(
        recogniser: CriticalRecogniser) -> None:
    note = ("Slept well overnight. Obs stable. Two days into the cefuroxime she broke out in an itchy urticarial "
            "rash over the trunk.")
    (recognition,) = recogniser.run([note])
    assert "adr" in recognition.kinds
    assert recognition.spans and all(s.text and s.text in note[s.start:s.end] for s in recognition.spans)
    assert recogniser.run([""])[0].kinds == ()


def test_settings_round_trip_and_a_broken_folder_is_a_clear_error(recogniser: CriticalRecogniser,
                                                                 tmp_path: Path) -> None:
    again = CriticalRecogniser.from_dict(recogniser.to_dict())
    assert (again.folder, again.thresholds, again.fingerprint) == (recogniser.folder, recogniser.thresholds,
                                                                   recogniser.fingerprint)
    with pytest.raises(ModelUnavailableError, match=r"missing recogniser\.onnx"):
        CriticalRecogniser(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(BUNDLED_RECOGNISER, broken)
    card = json.loads((broken / "card.json").read_text())
    del card["thresholds"]
    (broken / "card.json").write_text(json.dumps(card))
    with pytest.raises(ModelUnavailableError, match="threshold per kind"):
        CriticalRecogniser(broken)
    (broken / "card.json").write_text((BUNDLED_RECOGNISER / "card.json").read_text())
    (broken / "recogniser.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelUnavailableError, match="does not load"):
        CriticalRecogniser(broken)


def test_the_tier_classifier_takes_the_models_answer_where_it_is_more_protective(
        recogniser: CriticalRecogniser) -> None:
    text = "Two days into the cefuroxime she broke out in an itchy urticarial rash over the trunk."
    with_model = TierClassifier(recogniser=recogniser)
    decision = with_model.classify(text, "Nursing note")
    assert decision.tier is Tier.T1 and decision.rule_id.startswith(("model:recogniser:adr", "text.adr")), decision
    de_labelled = "Penicillin allergy label removed after a negative oral amoxicillin challenge last year."
    assert with_model.classify(de_labelled, "Nursing note").always != "allergy"
    assert TierClassifier.from_dict(with_model.to_dict()).recogniser is not None


def test_a_stored_charts_readings_are_kept_and_erasure_forgets_them(recogniser: CriticalRecogniser,
                                                                      tmp_path: Path) -> None:
    from ebmrag.kvcache import KeyValueCache

    read: list[str] = []

    class Counting(CriticalRecogniser):
        def run(self, texts):  # type: ignore[no-untyped-def]
            read.extend(texts)
            return super().run(texts)

    store = KeyValueCache(tmp_path / "derived.sqlite", "tier_rules")
    items = [("Rash over the trunk two days into the cefuroxime.", "Nursing note"), ("Slept well.", "Nursing note")]
    first = TierClassifier(recogniser=Counting(), store=store).classify_many(items)
    assert read == [items[0][0]], "only the text with a critical fact's shape is read"
    assert TierClassifier(recogniser=Counting(), store=store).classify_many(items) == first
    assert read == [items[0][0]], "a stored reading is not read again"
    assert TierClassifier(recogniser=Counting(), store=store).forget(items) == 2 + 2 + 1  # rules, shapes, reading
    TierClassifier(recogniser=Counting(), store=store).classify_many(items)
    assert read == [items[0][0]] * 2
