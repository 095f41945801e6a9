from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.errors import ConfigError
from ebmrag.evidence.tiers import TIER_RULES, TierClassifier
from ebmrag.records.fragment import Tier
from ebmrag.rules import bundled


@pytest.fixture(scope="module")
def classifier() -> TierClassifier:
    return TierClassifier()


@pytest.mark.parametrize(
    ("section", "text", "tier", "must_keep"),
    [
        ("Test_Results > Biopsy", "Lymphocytes staining positive for CD20.", Tier.T1, True),
        ("Allergies", "Penicillin: anaphylaxis in 2014.", Tier.T1, True),
        ("Allergies", "No known drug allergies.", Tier.T3, False),
        ("Nursing note", "Intake form: he had anaphylaxis to penicillin in 2014.", Tier.T1, True),
        ("Test_Results > Imaging > CT", "Enlarged mediastinal lymph nodes.", Tier.T2, False),
        ("Physical_Examination_Findings > Vital_Signs", "Heart rate 82 bpm.", Tier.T3, False),
        ("Patient_Actor > History", "Fatigue and night sweats for four weeks.", Tier.T4, False),
        (None, "Colonoscopic biopsy showed moderately differentiated adenocarcinoma.", Tier.T1, True),
        (None, "CT of the chest revealed a 2 cm spiculated nodule.", Tier.T2, False),
        (None, "Serum creatinine 2.8 mg/dL.", Tier.T2, False),
        (None, "On examination there is right upper quadrant tenderness.", Tier.T3, False),
        (None, "She feels tired and worried about work.", Tier.T4, False),
        ("病理报告", "胃窦活检示中分化腺癌。", Tier.T1, True),
        (None, "患者对青霉素过敏，曾发生过敏性休克。", Tier.T1, True),
        (None, "胸部CT示右下肺结节。", Tier.T2, False),
        (None, "查体：右下腹压痛。", Tier.T3, False),
    ],
)
def test_rules(classifier: TierClassifier, section: str | None, text: str, tier: Tier, must_keep: bool) -> None:
    decision = classifier.classify(text, section)
    assert (decision.tier, decision.must_keep) == (tier, must_keep), decision.rule_id
    assert decision.rule_id


def test_standing_facts_marked(classifier: TierClassifier) -> None:
    assert classifier.classify("Penicillin anaphylaxis.", "Allergy").standing
    assert not classifier.classify("Heart rate 90 bpm.", "Vital signs").standing


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[[rules]]\nid = "x"\ntier = "T5"\nsections = ["a"]\n', "T1..T4"),
        ('[[rules]]\nid = "x"\ntier = "T1"\n', "needs `sections`, `text_any` or `detector`"),
        ('[[rules]]\nid = "x"\ntier = "T1"\ntext_any = ["("]\n', "not a valid regex"),
        ('[[rules]]\nid = "x"\ntier = "T1"\nsections = ["a"]\ncolour = 1\n', "unknown keys"),
        ("rules = [", "not valid TOML"),
    ],
)
def test_bad_rule_files_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        TierClassifier(path)


def test_round_trip(tmp_path: Path) -> None:
    assert TierClassifier.from_dict(TierClassifier().to_dict()).to_dict() == {"rules_path": None}


def test_rule_decisions_are_stored_on_disk_and_keyed_by_the_rule_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ebmrag.kvcache import KeyValueCache

    store = KeyValueCache(tmp_path / "derived.sqlite", "tier_rules")
    items = [("Biopsy: adenocarcinoma.", "Pathology"), ("Walked 40 metres.", "Notes"), ("Hb 9.1 g/dL", None)]
    first = TierClassifier(store=store).rule_decisions(items)
    monkeypatch.setattr(TierClassifier, "rule_decision", lambda *a: pytest.fail("computed again"))
    assert TierClassifier(store=store).rule_decisions(items) == first
    edited = tmp_path / "tiers.toml"
    edited.write_text(bundled().source(TIER_RULES) + "\n# a clinician's edit\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match="computed again"):
        TierClassifier(edited, store=store).rule_decisions(items)


def test_model_predictions_are_stored_keyed_by_the_model_file_and_forgotten(tmp_path: Path) -> None:
    """Issue 33: a prepared chart's texts that no rule speaks for are predicted once (the model was the largest
    part of tiering a 10,000-fragment chart on every ask); another model file predicts again; erasure forgets."""
    from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL
    from ebmrag.kvcache import KeyValueCache
    from ebmrag.models.text_classifier import load_text_classifier

    class Counting:
        def __init__(self, path: Path) -> None:
            self.inner = load_text_classifier(BUNDLED_TIER_MODEL, None)  # type: ignore[arg-type]
            self.path, self.labels = path, self.inner.labels
            self.seen: list[str] = []

        def predict(self, texts: list[str]) -> list[tuple[str, float]]:
            self.seen += texts
            return self.inner.predict(texts)

    store = KeyValueCache(tmp_path / "derived.sqlite", "tier_rules")
    items = [("Walked 40 metres with the physiotherapist.", "Notes"), ("Slept well, ate breakfast.", None)]
    model = Counting(Path(BUNDLED_TIER_MODEL))
    first = TierClassifier(model=model, store=store).classify_many(items)
    assert len(model.seen) == 2
    again = Counting(Path(BUNDLED_TIER_MODEL))
    assert TierClassifier(model=again, store=store).classify_many(items) == first and again.seen == []
    copy = tmp_path / "other.npz"
    copy.write_bytes(Path(BUNDLED_TIER_MODEL).read_bytes() + b"\0")
    assert TierClassifier(model=Counting(copy), store=store)._model_key("x") != \
        TierClassifier(model=again, store=store)._model_key("x")
    assert TierClassifier(model=again, store=store).forget(items) == 6  # two rule rows, two predictions, two shapes
    TierClassifier(model=again, store=store).classify_many(items)
    assert again.seen == [text for text, _ in items]
