"""The allergy reading of the shared negation vocabulary (vocab.negation, rules/negation.toml): a denial, an
exclusion or a de-labelling takes an allergy back in its own clause, in English and Chinese clinical grammar;
doubt, plans, an intolerance and a negation about something else never do.

The sentences are written for these tests from how clinicians write; none is taken from a corpus or a rule file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.rules import RuleBook, bundled
from ebmrag.vocab.negation import NEGATION, negation

TAKEN_BACK = [
    # denials and statuses of none
    "He says he has never been allergic to any antibiotic.",
    "Allergies: none on file.",
    "Drug allergy status: NKA",
    "No known medicine, food, or contrast allergies.",
    "患者否认食物及药物过敏史。",
    "既往体健，无明确药物过敏史。",
    "药物过敏史：否认",
    "过敏史（无）",
    "对头孢类药物不过敏。",
    # exclusions written after what they exclude
    "Sulfonamide allergy was excluded by the allergist.",
    "磺胺类药物过敏已排除。",
    "碘造影剂过敏可除外。",
    # de-labelling after a challenge, a test and a course, or by decision
    "Cefaclor allergy de-labelled in clinic after she passed a two-step graded challenge.",
    "Amoxicillin direct oral challenge on 3 March was negative; label taken off.",
    "Historic 'penicillin allergy' (childhood rash): skin testing negative, then tolerated a 5-day amoxicillin "
    "course, so the label is wrong.",
    "Previously labelled allergic to co-trimoxazole, the label has been removed from her record.",
    "青霉素过敏标签经口服激发试验阴性后撤销。",
    "既往自述头孢过敏，行药物激发试验后证实非真性过敏。",
    "阿莫西林皮试阴性，随后静滴阿莫西林3天，耐受良好，青霉素过敏史予删除。",
]

STANDS = [
    # a negation in another clause or sentence, or about something else
    "无发热，头孢曲松过敏。",
    "否认高血压病史，有磺胺类药物过敏史。",
    "No fever or chills, allergic to clindamycin.",
    "She has no food allergies but is allergic to cefuroxime.",
    "No pets at home. Sulfa allergy (hives).",
    "She could never take cefaclor because of an allergy.",
    "无明显诱因出现药物过敏样皮疹。",
    "无法完成增强CT（碘造影剂过敏）。",  # 无法: cannot, an inability
    "未规律随访以及对造影剂过敏的患者。",  # a conjunction opening 对…过敏 is a new predicate
    # doubt and plans: a label stays until it is taken back
    "头孢呋辛过敏（未确认）",
    "可疑青霉素过敏，待查。",
    "Possible allergy to ciprofloxacin, not confirmed.",
    "Penicillin allergy: referred to the allergy clinic for de-labelling.",
    "Plan: graded amoxicillin challenge next week to de-label her penicillin allergy.",
    "不能排除碘造影剂过敏。",
    # an intolerance is still a reaction
    "对阿片类药物不耐受。",
    "Morphine intolerance (itching), not a true allergy.",
    # a test alone, or the wrong way round
    "青霉素过敏史，皮试阴性。",
    "Penicillin skin test negative on the ward.",
    "Skin test negative, but the oral challenge caused hives; penicillin allergy confirmed.",
    "已知对非甾体类抗炎药过敏者。",
    "经口服激发试验证实为非甾体抗炎药过敏。",
]


@pytest.mark.parametrize("text", TAKEN_BACK)
def test_a_denial_an_exclusion_or_a_delabelling_takes_the_allergy_back(text: str) -> None:
    assert negation().allergy_taken_back(text), text


@pytest.mark.parametrize("text", STANDS)
def test_doubt_plans_intolerance_and_another_clause_leave_the_allergy_standing(text: str) -> None:
    assert negation().allergy_taken_back(text) == "", text


@pytest.mark.parametrize(("entry", "taken_back"), [
    ("Not allergic to cephalexin", True),
    ("Cephalexin: completed a course in 2022 without any reaction", True),
    ("Cephalexin (denied)", True),
    ("头孢氨苄（否认）", True),
    ("Oral challenge to cefalexin negative", True),
    ("Cephalexin", False),
    ("Cephalexin - not confirmed", False),
    ("头孢氨苄过敏（未确认）", False),
    ("Cephalexin (no rash, vomiting)", False),
    ("Cephalexin: unable to tolerate", False),
])
def test_an_entry_names_its_allergy_in_its_head(entry: str, taken_back: bool) -> None:
    """An allergy entry's own words: its head is the allergy ("Cephalexin"), and a course tolerated in the same
    clause speaks of it; a free text's tolerance of one drug never takes back the allergy to another."""
    assert bool(negation().allergy_taken_back(entry, entry=True)) is taken_back, entry
    assert negation().allergy_taken_back("Allergic to penicillin, tolerates cephalexin.") == ""


def test_a_pseudo_negation_is_no_cue_for_any_reader() -> None:
    cues = negation()
    for text in ("过敏（未确认）", "cannot rule out a drug rash", "did not tolerate codeine", "不除外药疹"):
        assert not cues.cue.search(text), text
        assert not cues.leading.match(text), text
    assert cues.cue.search("未见皮疹") and cues.cue.search("did not react") and cues.cue.search("rule out PE")


def test_a_reader_asks_about_spans_of_its_own() -> None:
    """Beside the allergy words, a reader names what it asks about (the ADR recogniser: a reaction)."""
    text = "Hives after amoxicillin in 2015; oral challenge in 2023 was negative, hives excluded."
    first, second = text.index("Hives"), text.rindex("hives")
    assert negation().taken_back(text, [(first, first + 5), (second, second + 5)]) == ["", "excluded"]


def test_every_list_of_the_grammar_is_required(tmp_path: Path) -> None:
    from ebmrag.errors import ConfigError

    (tmp_path / NEGATION).write_text(bundled().source(NEGATION).replace("delabel = [", "labels_off = ["), "utf-8")
    with pytest.raises(ConfigError, match=r"\[english\] delabel"):
        negation(RuleBook(tmp_path))
