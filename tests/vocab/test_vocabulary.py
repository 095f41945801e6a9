"""The shared vocabulary (vocab.drugs, vocab.lexicon, vocab.negation): one drug read the same by its brand, its
generic name, its class, its codes and its Chinese name; one list of negation cues; each file's errors name it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ebmrag.errors import ConfigError
from ebmrag.rules import RuleBook, bundled
from ebmrag.vocab.drugs import DrugVocabulary, Relation, concept_parts, vocabulary
from ebmrag.vocab.lexicon import TERMS, TERMS_PATH, drug_mentions, terms, zh_drug_names
from ebmrag.vocab.negation import NEGATION, negation

SNOMED, RXNORM = "http://snomed.info/sct", "http://www.nlm.nih.gov/research/umls/rxnorm"


def coded(system: str, code: str) -> dict[str, Any]:
    return {"coding": [{"system": system, "code": code}]}


# (brand, generic, class id, class label, a code that names the generic with no word)
DRUGS = [
    ("Lipitor 20 mg", "atorvastatin", "statins", "statin class (HMG-CoA reductase inhibitors)", coded(RXNORM, "83367")),
    ("Amoxil 500 mg capsule", "amoxicillin", "penicillins", "penicillin class", coded(SNOMED, "372687004")),
    ("Advil", "ibuprofen", "nsaids", "NSAID class (aspirin and the non-selective NSAIDs)", coded(RXNORM, "5640")),
]


@pytest.mark.parametrize(("brand", "generic", "class_id", "label", "code"), DRUGS)
def test_brand_generic_class_and_code_name_one_drug(brand: str, generic: str, class_id: str, label: str,
                                                    code: dict[str, Any]) -> None:
    v = vocabulary()
    by_brand, by_generic, by_code = v.identify([brand]), v.identify([generic]), v.identify([code])
    assert by_brand.ingredients == by_generic.ingredients == by_code.ingredients == {generic}
    assert class_id in by_brand.classes and class_id in by_generic.classes and class_id in by_code.classes
    by_class = v.identify([class_id.rstrip("s") if class_id != "nsaids" else "NSAIDs"])
    assert not by_class.ingredients and class_id in by_class.classes
    # each way round: the brand ordered against the generic (or its code) as an allergy, and back
    assert v.relation(by_brand, by_code) == Relation("ingredient", generic)
    assert v.relation(by_code, by_brand) == Relation("ingredient", generic)
    assert v.relation(by_brand, by_class) == Relation("class", label, order_class=label)


def test_a_chinese_allergy_and_an_english_order_are_one_drug() -> None:
    v = vocabulary()
    allergy, order = v.identify([{"text": "阿莫西林过敏"}]), v.identify([coded(RXNORM, "308182")])  # amoxicillin 250 MG
    assert allergy.ingredients == {"amoxicillin"} and "penicillins" in allergy.classes
    assert v.relation(order, allergy) == Relation("ingredient", "amoxicillin")
    assert v.relation(v.identify(["ceftriaxone 1 g IV"]), v.identify(["对头孢类过敏"])) == Relation(
        "class", "cephalosporin class", order_class="cephalosporin class")
    assert v.relation(v.identify(["Amoxil"]), v.identify(["青霉素皮试阳性"])) == Relation(
        "class", "penicillin class", order_class="penicillin class")
    assert v.identify(["布洛芬"]).ingredients == {"ibuprofen"}
    assert v.identify(["阿司匹林"]).ingredients == {"acetylsalicylic acid"}


def test_general_words_identify_no_drug_in_either_language() -> None:
    """"药物过敏" (drug allergy) and an order given "注射" (by injection) are not the same drug; nor are two
    -mycins that share only the stem 霉素."""
    v = vocabulary()
    assert v.relation(v.identify(["头孢曲松 注射"]), v.identify(["药物过敏"])) is None
    assert v.relation(v.identify(["链霉素"]), v.identify(["红霉素过敏"])) is None
    assert v.relation(v.identify(["medication"]), v.identify(["medication allergy"])) is None
    assert "霉素" in drug_mentions("红霉素过敏"), "the lexicon still finds the drug for tiering"



def test_a_harvested_chinese_brand_is_a_drug_mention() -> None:
    """A brand or preparation with no INN stem and no class word (zh_drug_names.txt) names a drug; a general word
    does not, and a name already found as a longer one is not found again inside it."""
    assert {"希罗达", "速效救心丸"} <= set(zh_drug_names())
    assert drug_mentions("服用希罗达后出现皮疹") == ["希罗达"]
    assert drug_mentions("予奥沙利铂联合希罗达化疗") == ["奥沙利铂", "希罗达"]
    assert drug_mentions("含服速效救心丸后胸闷缓解") == ["速效救心丸"]
    assert drug_mentions("口服卡培他滨片") == ["卡培他滨片"], "longest first: not 卡培他滨 a second time"
    assert drug_mentions("阿司匹林肠溶片") == ["阿司匹林"], "a known name keeps its ingredient; no second drug"
    assert drug_mentions("服用中药后出现皮疹") == []
    assert all(len(name) >= 2 and name not in terms().chinese for name in zh_drug_names())

def test_every_chinese_name_says_what_it_names() -> None:
    chinese = terms().chinese
    assert chinese["阿莫西林"].kind == "ingredient" and chinese["头孢"].value == "cephalosporins"
    assert {"药物", "注射", "霉素"} <= terms().chinese_general


def test_a_chinese_name_the_tables_lack_is_an_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "drug_terms.toml"
    bad.write_text(TERMS_PATH.read_text(encoding="utf-8") + '"某药" = { ingredient = "notadrugatall" }\n', "utf-8")
    with pytest.raises(ConfigError, match=r"drug_terms\.toml.*某药"):
        DrugVocabulary.from_files(names_path=None, codes_path=None, terms_path=bad)
    shapeless = tmp_path / "shapeless" / TERMS
    shapeless.parent.mkdir(parents=True)
    shapeless.write_text('version = 1\n[general]\nen = ["drug"]\n[chinese]\n"药" = "drug"\n', "utf-8")
    with pytest.raises(ConfigError, match=r"shapeless/drugs/drug_terms\.toml: \[chinese\] '药'"):
        terms(RuleBook(tmp_path / "shapeless"))


def test_a_codeable_concept_is_read_without_the_chart_reader() -> None:
    assert concept_parts({"text": "Penicillin", "coding": {"system": "s", "code": "1"}}) == (
        ["Penicillin"], [("s", "1", "")])
    assert concept_parts({"coding": [{"code": 5, "display": "x"}, "junk"]}) == ([], [("", "5", "x")])
    assert concept_parts(None) == ([], [])


# ------------------------------------------------------------------------------------------------ negation
@pytest.mark.parametrize("text", [
    "no fever", "denies chest pain", "negative for malignancy", "pulses absent", "deny any rash",
    "never had a reaction", "I don't smoke", "nope", "无发热", "否认药物过敏", "排除肺炎", "没有皮疹", "不伴咳嗽",
    "no  evidence of disease",
])
def test_every_reader_gets_the_same_cues(text: str) -> None:
    assert negation().cue.search(text)


@pytest.mark.parametrize("text", ["nothing noted", "a no-reflow phenomenon", "cannot", "knowledge", "发热"])
def test_a_cue_is_a_whole_english_word(text: str) -> None:
    assert not negation().cue.search(text)


def test_the_patient_and_leading_cues() -> None:
    cues = negation()
    assert cues.patient.search("well I didn't have a fever") and not cues.patient.search("no fever")
    assert cues.leading.match("  without cough") and not cues.leading.match("fever without cough")


def test_a_bad_negation_file_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / NEGATION
    bad.write_text(bundled().source(NEGATION).replace("after = [", "later = ["), "utf-8")
    with pytest.raises(ConfigError, match=r"negation\.toml: \[english\] after"):
        negation(RuleBook(tmp_path))
    bad.write_text("version = 1\n[english\n", "utf-8")
    with pytest.raises(ConfigError, match=r"negation\.toml"):
        negation(RuleBook(tmp_path))


def test_a_book_builds_its_own_cues_once(tmp_path: Path) -> None:
    (tmp_path / NEGATION).write_text(bundled().source(NEGATION).replace('"nope"', '"nah"'), "utf-8")
    book = RuleBook(tmp_path)
    assert negation(book) is negation(book) and negation() is negation()
    assert negation(book).patient.search("nah") and not negation().patient.search("nah")
    assert negation(book).source == (tmp_path / NEGATION).read_text("utf-8")


def test_a_chinese_brand_without_an_inn_stem_is_linked_to_its_reaction() -> None:
    """A harvested Chinese drug name (rules/drugs/zh_drug_names.txt) stands where the ADR recogniser looks for a
    drug: a reaction after a brand or a preparation is an adverse reaction, as after an INN-stem name."""
    from ebmrag.evidence.adr import adr_mentions
    from ebmrag.vocab.lexicon import chinese_drug_spans

    text = "患者自行服用希罗达两周后手足出现皮疹。"
    assert [name for *_, name in chinese_drug_spans(text)] == ["希罗达"]
    assert [m.drug for m in adr_mentions(text)] == ["希罗达"]
    assert not adr_mentions("患者服用希罗达两周，无不适。")
