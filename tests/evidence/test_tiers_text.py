"""Tiering from the text a chart contains: stories, no section headers, English and Chinese."""

from __future__ import annotations

import pytest

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier
from ebmrag.vocab.lexicon import drug_mentions

RULES = TierClassifier()


@pytest.mark.parametrize(("text", "tier", "must_keep"), [
    ("Twenty minutes after the cefuroxime dose her throat felt tight and her skin broke out in hives.", Tier.T1, True),
    ("He came out in welts and his lips swelled after taking amoxicillin last spring.", Tier.T1, True),
    ("患者既往使用头孢类抗生素后出现全身皮疹及喉头水肿。", Tier.T1, True),
    ("Latex gloves cause a rash on her hands.", Tier.T1, True),
    ("Thyroid FNA: papillary carcinoma, Bethesda VI.", Tier.T1, True),
    ("Cytology of the pleural fluid shows malignant cells consistent with adenocarcinoma.", Tier.T1, True),
    ("Sequencing identified a pathogenic BRCA2 variant.", Tier.T1, True),
    ("Echocardiogram: LVEF 30 % with global hypokinesis.", Tier.T2, False),
    ("EF of 25% on the latest echo.", Tier.T2, False),
    ("Potassium 6.1 mmol/L, creatinine pending.", Tier.T2, False),
    ("Blood group O, Rh-negative.", Tier.T2, False),
    ("胸部增强CT示右肺上叶占位。", Tier.T2, False),
    ("Cranial nerves intact, reflexes 2+ and symmetric.", Tier.T3, False),
])
def test_critical_facts_told_without_a_header_are_found(text: str, tier: Tier, must_keep: bool) -> None:
    decision = RULES.classify(text)
    assert (decision.tier, decision.must_keep) == (tier, must_keep), decision.rule_id


@pytest.mark.parametrize("text", [
    "She denies any drug allergies.",
    "No known drug allergies; takes metformin daily.",
    "否认药物过敏史。",
    "No rash or hives after the amoxicillin course.",
])
def test_negated_allergies_are_not_allergies(text: str) -> None:
    assert RULES.classify(text).tier is not Tier.T1


def test_pathological_murmurs_and_reflexes_are_not_pathology() -> None:
    assert RULES.classify("心律齐，未闻及病理性杂音，病理反射未引出。").tier is not Tier.T1


def test_drug_lexicon_knows_names_classes_and_chinese() -> None:
    assert drug_mentions("started on ceftriaxone and a macrolide") == ["ceftriaxone", "macrolide"]
    assert "头孢" in drug_mentions("对头孢过敏")
    assert drug_mentions("walked to the kitchen") == []


@pytest.mark.model
def test_the_bundled_model_speaks_only_where_rules_are_silent(tiering) -> None:  # type: ignore[no-untyped-def]
    classifier = tiering.classifier
    ruled = classifier.classify("Biopsy shows adenocarcinoma.")
    assert ruled.rule_id == "text.pathology.result"
    assert RULES.rule_decision("Findings: Enlarged left ventricle and left atrium") is None, "no rule speaks"
    decided = classifier.classify("Findings: Enlarged left ventricle and left atrium")
    assert decided.rule_id.startswith("model:tier_ngram p=") and decided.tier is Tier.T2
    assert classifier.to_dict()["model_path"].endswith("tier_ngram.npz")


@pytest.mark.parametrize(("text", "named"), [
    ("CYP2C19 *2/*2, poor metabolizer.", ("CYP2C19", "*2/*2", "clopidogrel")),
    ("HLA-B*58:01 positive.", ("HLA-B", "*58:01", "allopurinol")),
    ("DPYD c.1905+1G>A heterozygous.", ("DPYD", "c.1905+1G>A", "fluorouracil")),
    ("PALB2 c.3113G>A pathogenic variant.", ("PALB2", "c.3113G>A")),
    ("CCDC6-RET fusion on RNA sequencing.", ("CCDC6::RET", "fusion")),
    ("检出PIK3CA基因E545K突变。", ("PIK3CA", "E545K")),
])
def test_a_genetic_result_of_any_gene_is_kept_with_its_gene_variant_and_drugs(text: str, named: tuple[str, ...]
                                                                              ) -> None:
    decision = RULES.classify(text)
    assert (decision.tier, decision.must_keep, decision.standing) == (Tier.T1, True, True), decision.rule_id
    assert decision.rule_id == "text.genetic.detected"
    assert all(part in decision.finding for part in named), decision.finding


@pytest.mark.parametrize("text", [
    "MET with the family to discuss discharge.", "Her CAT scan showed a focal ileus.",
    "C5-C6 anterior cervical discectomy and fusion.", "CD20 positive B cells on flow cytometry.",
])
def test_a_gene_symbol_that_is_also_a_word_is_no_genetic_result(text: str) -> None:
    assert not RULES.classify(text).rule_id.startswith("text.genetic")
