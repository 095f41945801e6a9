"""Fact states (evidence.facts): one line per critical finding, read by the shared readers, every entity verbatim.

Decisions come from the bundled tier rules (rules only: no model is loaded), except where a test needs the
recogniser's decision, which is written here as the tier classifier would record it ("model:recogniser:<kind>").
"""

from __future__ import annotations

import pytest

from ebmrag.evidence.facts import Fact, fact_kind, read_fact
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier, TierDecision

ALLERGY = TierDecision(Tier.T1, "text.allergy.high_risk", standing=True, must_keep=True, always="allergy")


@pytest.fixture(scope="module")
def classifier() -> TierClassifier:
    return TierClassifier()


def fact_of(classifier: TierClassifier, text: str, section: str | None = None) -> Fact:
    fact = read_fact(text, classifier.classify(text, section))
    assert fact is not None, text
    assert all(said in fact.line() for _, said in fact.entities), fact
    judged = ("flag", "more", *(("drug",) if fact.kind == "genetic" else ()))  # the readers' words, not the text's
    assert all(said in text for role, said in fact.entities if role not in judged), fact
    return fact


def roles(fact: Fact, role: str) -> list[str]:
    return [said for r, said in fact.entities if r == role]


# --------------------------------------------------------------------------- each kind, English and Chinese
def test_an_allergy_keeps_its_drug_reactions_and_severity(classifier: TierClassifier) -> None:
    text = "Known allergy to penicillin; the reaction was throat swelling and wheeze, life-threatening."
    fact = fact_of(classifier, text)
    assert fact.kind == "allergy"
    assert roles(fact, "drug") == ["penicillin"]
    assert set(roles(fact, "reaction")) == {"throat swelling", "wheeze"}
    assert roles(fact, "severity") == ["life-threatening"]
    assert fact.line().startswith("allergy: penicillin → ")


def test_an_allergy_entry_names_its_substance_in_its_head(classifier: TierClassifier) -> None:
    fact = fact_of(classifier, "Sulfonamides - hives", "Allergies")
    assert fact.line() == "allergy: Sulfonamides → hives"


def test_a_food_allergy_is_an_allergen_not_a_drug(classifier: TierClassifier) -> None:
    fact = fact_of(classifier, "Her allergies include shellfish and latex gloves.")
    assert fact.kind == "allergy"
    assert ("allergen", "shellfish") in fact.entities


def test_a_chinese_allergy_keeps_the_chinese_words(classifier: TierClassifier) -> None:
    fact = fact_of(classifier, "患者自述对头孢克洛过敏，用药后全身起荨麻疹。")
    assert roles(fact, "drug") == ["头孢克洛"]  # not the 对 read with it, not the 药 of 用药
    assert roles(fact, "reaction") == ["荨麻疹"]


def test_an_adverse_reaction_pairs_its_drug_and_reaction(classifier: TierClassifier) -> None:
    fact = fact_of(classifier, "Started on carbamazepine last month and developed Stevens-Johnson syndrome.")
    assert fact.kind == "adr"
    assert fact.line().startswith("ADR: carbamazepine → Stevens-Johnson")


def test_a_reaction_the_recogniser_found_is_read_from_its_spans() -> None:
    text = "口服别嘌醇两周后出现严重皮疹伴发热。"
    decision = TierDecision(Tier.T1, "model:recogniser:adr p=0.91", standing=True, must_keep=True,
                            finding="DRUG=别嘌醇; REACTION=皮疹")
    fact = read_fact(text, decision)
    assert fact is not None
    assert fact.line() == "ADR: 别嘌醇 → 皮疹, 发热 (严重)"  # the fever it came with is its reaction too


def test_a_recogniser_span_that_cuts_a_word_is_no_entity() -> None:
    text = "Aspirin was given in the ambulance for a suspected myocardial infarction."
    decision = TierDecision(Tier.T1, "model:recogniser:adr p=0.55", standing=True, must_keep=True,
                            finding="DRUG=Aspirin; REACTION=farction")
    assert read_fact(text, decision) is None


@pytest.mark.parametrize(("text", "analyte", "value", "unit", "flag"), [
    ("Repeat potassium this morning came back at 6.9 mmol/L on the ward.", "potassium", "6.9", "mmol/L",
     "critical high"),
    ("The sodium was 118 mmol/L when she arrived, which is why she was confused.", "sodium", "118", "mmol/L",
     "critical low"),
    ("今晨复查血钾6.9mmol/L。", "血钾", "6.9", "mmol/L", "critical high"),
])
def test_a_critical_result_keeps_analyte_value_unit_and_flag(classifier: TierClassifier, text: str, analyte: str,
                                                              value: str, unit: str, flag: str) -> None:
    fact = fact_of(classifier, text)
    assert fact.kind == "result"
    assert fact.entities == (("analyte", analyte), ("value", value), ("unit", unit), ("flag", flag))
    assert fact.line() == f"result: {analyte} {value} {unit} ({flag})"


@pytest.mark.parametrize(("text", "phenotype"), [
    ("Pharmacogenomic panel: CYP2C19 *2/*2, poor metabolizer.", "poor metabolizer"),
    ("基因检测提示CYP2C19 *2/*3，慢代谢型。", "慢代谢型"),
])
def test_a_genotype_names_its_gene_variant_phenotype_and_the_drugs_it_affects(classifier: TierClassifier,
                                                                               text: str, phenotype: str) -> None:
    fact = fact_of(classifier, text)
    assert fact.kind == "genetic"
    assert roles(fact, "gene") == ["CYP2C19"]
    assert roles(fact, "phenotype") == [phenotype]
    assert "clopidogrel" in roles(fact, "drug")  # CPIC pairs clopidogrel with CYP2C19
    assert "; affects " in fact.line()


def test_a_pathology_report_keeps_specimen_diagnosis_grade_stage_and_margins(classifier: TierClassifier) -> None:
    text = "Sigmoid colon biopsy: moderately differentiated adenocarcinoma, pT3 N1, margins free of tumour."
    fact = fact_of(classifier, text)
    assert fact.kind == "pathology"
    assert roles(fact, "specimen") == ["Sigmoid colon biopsy"]
    assert roles(fact, "diagnosis") == ["moderately differentiated adenocarcinoma"]
    assert roles(fact, "stage") == ["pT3 N1"]
    assert roles(fact, "margins") == ["margins free of tumour"]
    assert fact.line() == ("pathology: Sigmoid colon biopsy: moderately differentiated adenocarcinoma, pT3 N1, "
                           "margins free of tumour")


def test_a_chinese_pathology_report_keeps_its_site_and_biomarker(classifier: TierClassifier) -> None:
    fact = fact_of(classifier, "胃镜活检病理：（胃体）低分化腺癌，HER-2(3+)。")
    assert fact.line() == "pathology: 胃体: 低分化腺癌, HER-2(3+)"
    assert ("grade", "低分化") in fact.entities  # held in the diagnosis, so said once


def test_a_negative_pathology_keeps_its_negation(classifier: TierClassifier) -> None:
    fact = fact_of(classifier, "Margins and the sentinel node biopsy were all negative for malignancy.")
    assert "negative for malignancy" in roles(fact, "diagnosis")


# --------------------------------------------------------------------------- what has no fact state
@pytest.mark.parametrize("text", [
    "No known drug allergies.",
    "Penicillin allergy label removed after a negative oral challenge in clinic.",
    "否认青霉素过敏史。",
    "对磺胺类药物无过敏。",
])
def test_a_denied_or_delabelled_allergy_has_no_fact_even_under_an_allergy_decision(text: str) -> None:
    assert read_fact(text, ALLERGY) is None


def test_an_allergy_word_without_a_substance_has_no_fact() -> None:
    assert read_fact("Seasonal allergies every spring, takes an antihistamine.", ALLERGY) is None


def test_a_pathology_plan_has_no_fact(classifier: TierClassifier) -> None:
    decision = TierDecision(Tier.T1, "section.pathology", standing=True, must_keep=True)
    assert read_fact("Biopsy booked for next Tuesday; result pending.", decision) is None


def test_a_decision_that_states_no_fact_has_none() -> None:
    assert fact_kind("default.subjective") == ""
    assert fact_kind("possible_critical.gene", critical=False) == ""
    assert fact_kind("site.lab.panic", critical=True) == "result"  # a site's own critical rule
    assert read_fact("Patient walked to the bathroom with help.", TierDecision(Tier.T4, "section.workflow")) is None


# --------------------------------------------------------------------------- the line
@pytest.mark.parametrize("text", [
    "When she was seen in clinic last spring she mentioned that a course of amoxicillin had once left her covered in "
    "hives with swollen lips, and she is allergic to penicillin.",
    "After several weeks of vague abdominal discomfort the endoscopist took a biopsy of the gastric antrum, which "
    "showed poorly differentiated adenocarcinoma with signet ring cells.",
    "患者三年前在外院行结肠镜检查，取活检病理提示：（乙状结肠）中分化腺癌，当时未予特殊处理，此次入院复查。",
])
def test_the_line_of_a_long_sentence_is_shorter_than_the_sentence(classifier: TierClassifier, text: str) -> None:
    fact = fact_of(classifier, text)
    assert len(fact.line()) < len(text) * 2 / 3


def test_a_fact_is_read_once_per_text_rule_and_finding(classifier: TierClassifier) -> None:
    text = "Repeat potassium this morning came back at 6.9 mmol/L on the ward."
    decision = classifier.classify(text)
    assert read_fact(text, decision) is read_fact(text, decision)


def test_an_allergy_list_keeps_every_allergen_or_has_no_fact() -> None:
    """A fact line that dropped one allergy of a list would hide it: a long product name is read whole, and an
    allergy word whose substance no reader finds leaves the fragment without a fact state."""
    decision = TierDecision(Tier.T1, "text.allergy.reaction", standing=True, must_keep=True, always="allergy")
    listed = ("Allergies (2): Drug allergy to Lindenblossom herbal tea d4 drops; since 2019; "
              "Drug allergy to cefalexin; since 2021.")
    fact = read_fact(listed, decision)
    assert fact is not None and "Lindenblossom herbal tea d4 drops" in fact.line() and "cefalexin" in fact.line()
    assert read_fact("Drug allergy to the one she was given in the clinic in 2019 which made her swell up.",
                     decision) is None
