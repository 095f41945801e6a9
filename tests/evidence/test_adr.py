"""Adverse drug reactions from their parts (evidence/adr.py): drug + reaction + link, not negated or hypothetical.

The sentences are written for these tests, in the many ways a chart tells a reaction; none is taken from a corpus.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.errors import ConfigError
from ebmrag.evidence.adr import adr_mentions, drug_spans, masked, reaction_spans, scan, vocabulary
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier
from ebmrag.rules import RuleBook

STATED = [
    # English, each link type
    ("Two summers ago a week of clarithromycin left her with widespread blistering and sloughing of the lips; "
     "she was nursed on the burns unit.", "clarithromycin"),
    ("He was given ceftriaxone in the emergency department and within minutes his tongue swelled.", "ceftriaxone"),
    ("Vancomycin-associated acute kidney injury.", "vancomycin"),
    ("Hyponatraemia secondary to carbamazepine was found on admission.", "carbamazepine"),
    ("Lamotrigine caused a generalized eruption with fever and eosinophilia.", "lamotrigine"),
    ("Marked hepatotoxicity in a man receiving isoniazid for latent tuberculosis.", "isoniazid"),
    ("She reports her lips and eyelids puffed up after she took ibuprofen for a headache.", "ibuprofen"),
    ("Developed torsades after erythromycin was added.", "erythromycin"),
    ("Lithium toxicity with coarse tremor and confusion.", "lithium"),
    ("After the contrast injection for the CT she became hypotensive and wheezy.", "contrast"),
    # Chinese
    ("患者五年前肌注青霉素后即感胸闷、呼吸困难，随后血压下降，经抢救好转。", "青霉素"),
    ("服用卡马西平两周后出现全身水疱、口腔糜烂及表皮剥脱。", "卡马西平"),
    ("输注头孢曲松后出现荨麻疹。", "头孢曲松"),
    ("使用万古霉素所致急性肾损伤。", "万古霉素"),
]

NOT_STATED = [
    "No reaction to amoxicillin when it was given last year.",
    "She has tolerated cefalexin several times without any problem.",
    "If she develops a rash on lamotrigine, stop it and call the clinic.",
    "Counselled to watch for angioedema when starting lisinopril.",
    "Amoxicillin was started for community-acquired pneumonia.",
    "Prednisolone for asthma exacerbation; wheeze improved on it.",
    "The patient denies any swelling or hives after penicillin.",
    "Patient settled overnight, relatives phoned for an update.",
    "患者否认青霉素过敏史，既往用头孢类药物无不良反应。",
    "予阿莫西林治疗肺炎，咳嗽好转。",
]


@pytest.mark.parametrize(("text", "drug"), STATED)
def test_a_stated_reaction_names_its_drug(text: str, drug: str) -> None:
    found = adr_mentions(text)
    assert found, text
    assert any(drug in m.drug for m in found), (text, found)


@pytest.mark.parametrize("text", NOT_STATED)
def test_negated_tolerated_hypothetical_and_indications_are_no_reaction(text: str) -> None:
    assert adr_mentions(text) == [], text


def test_serious_reactions_are_marked_serious() -> None:
    assert adr_mentions(STATED[0][0])[0].serious
    assert adr_mentions("输注头孢曲松后出现过敏性休克。")[0].serious
    assert not adr_mentions("Metformin caused diarrhoea for a week.")[0].serious


def test_stems_and_hyphenated_compounds_find_drugs_the_lexicon_lacks() -> None:
    vocab = vocabulary()
    names = [s.text for s in drug_spans("zorbacillin-induced rash and quexafloxacin", vocab)]
    assert "zorbacillin" in names and "quexafloxacin" in names
    assert not drug_spans("cholesterol was high, in contrast to last year", vocab)
    assert drug_spans("口服阿莫西林", vocab)


def test_reaction_vocabulary_covers_serious_terms_suffixes_and_chinese() -> None:
    vocab = vocabulary()
    found = {span.text: serious for span, serious in reaction_spans("anaphylaxis, pancytopenia and rash", vocab)}
    assert found["anaphylaxis"] is True and "pancytopenia" in found and "rash" in found
    assert any(serious for _, serious in reaction_spans("出现呼吸困难", vocab))


def test_the_model_reads_masked_clauses() -> None:
    text = "torsade de pointes represents a complication of chronic amiodarone therapy"
    spans = drug_spans(text)
    reactions = [r for r, _ in reaction_spans(text)]
    out = masked(text, spans, reactions)
    assert "drugx" in out and "reactx" in out and "amiodarone" not in out
    found, _ = scan("Nausea improved after ondansetron.")
    assert not found


def test_tier_rule_records_drug_and_reaction_and_makes_a_standing_must_keep_t1() -> None:
    decision = TierClassifier().classify(STATED[0][0], "nursing note")
    assert decision.tier is Tier.T1 and decision.standing and decision.must_keep
    assert decision.rule_id == "text.adr.serious" and decision.always == "allergy" and decision.severe, \
        "a serious reaction is packing level 1, like a drug allergy"
    assert "drug=clarithromycin" in decision.finding and "reaction=" in decision.finding
    mild = TierClassifier().classify("After starting lisinopril she developed a persistent dry cough.", "nursing note")
    assert mild.rule_id == "text.adr" and mild.must_keep and not mild.always, "not serious: it ranks with its encounter"
    chinese = TierClassifier().classify(STATED[10][0], None)
    assert chinese.tier is Tier.T1 and "青霉素" in chinese.finding


def test_filler_is_not_escalated() -> None:
    classifier = TierClassifier()
    for text in ("Patient settled overnight.", "Relatives phoned for an update.", "Slept well, ate breakfast."):
        assert classifier.classify(text, None).tier is Tier.T4


def test_a_broken_vocabulary_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "evidence" / "adr.toml"
    bad.parent.mkdir()
    bad.write_text("version = 1\n[drugs]\ninn_stems_suffix = 3\n", encoding="utf-8")
    (tmp_path / "evidence" / "reactions.txt").write_text("rash\n", encoding="utf-8")  # read from the same book
    with pytest.raises(ConfigError, match="adr"):
        vocabulary(RuleBook(tmp_path))
