"""The classes of critical fact that rules with word lists lost (issue 45), each in words written for this test:
told this way, every one is still taken as critical by the default tier classifier (rules, then the recogniser,
then the possible-critical shapes), and routine ward text is not.

"Critical" here is what keeps a fact out of the utility pool at any age: a T1 finding, a critical result, or a
possible critical fact that stands. Which reader decided is printed on failure, and `CONFIRMED` lists the facts a
rule or the model must confirm outright (not merely hold as possible)."""

from __future__ import annotations

import pytest

from ebmrag.compose.resources import load_recogniser
from ebmrag.evidence.second_reading import POSSIBLE_CRITICAL
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier, TierDecision

FACTS = {
    "link before the drug": [
        "Developed a florid maculopapular eruption on day four of a course of co-trimoxazole.",
        "Lip and tongue swelling within an hour of the first ramipril tablet; ACE inhibitors to be avoided.",
    ],
    "drug-named toxicity": [
        "Admitted last spring with lithium toxicity: coarse tremor and confusion.",
        "Known digoxin toxicity in 2023 with a junctional bradycardia.",
    ],
    "a gene no list names": [
        "Genotyping: TPMT *3A heterozygous, intermediate metaboliser.",
        "Germline panel found a pathogenic CHEK2 c.1100delC variant.",
        "DPYD c.1905+1G>A, heterozygous carrier.",
    ],
    "pathology in shorthand": [
        "Core bx L breast 10 o'clock: IDC gr 2, ER+ PR+ HER2 negative.",
        "Prostate bx Gleason 4+3=7 in 5 of 12 cores.",
        "胃镜活检：低分化腺癌，见印戒细胞。",
    ],
    "critical result in ward shorthand": [
        "K 6.9 on the gas, peaked T waves, calcium gluconate given.",
        "血钾2.3mmol/L，已予静脉补钾。",
    ],
    "a Chinese reaction linked by a plain temporal word": [
        "静滴左氧氟沙星，次日出现双下肢皮疹。",
        "输注紫杉醇时患者胸闷、面色潮红，立即停药。",
    ],
}
ROUTINE = [
    "Mobilised to the chair with one assist, tolerated well.",
    "Family updated by phone; will visit tomorrow.",
    "Plan: continue current management, review in the morning.",
    "患者夜间睡眠可，饮食正常，二便如常。",
    "Pressure areas intact, repositioned two-hourly.",
]


@pytest.fixture(scope="module")
def classifier() -> TierClassifier:
    return TierClassifier(recogniser=load_recogniser("bundled"))


def critical(decision: TierDecision) -> bool:
    return decision.tier is Tier.T1 or decision.critical or (
        decision.rule_id.startswith(POSSIBLE_CRITICAL) and decision.standing)


@pytest.mark.parametrize(("kind", "text"), [(k, t) for k, texts in FACTS.items() for t in texts])
def test_a_critical_fact_told_in_words_no_list_holds_is_critical(classifier: TierClassifier, kind: str,
                                                                  text: str) -> None:
    decision = classifier.classify(text, "Nursing note")
    assert critical(decision), (kind, decision)


def test_routine_ward_text_stays_out_of_the_critical_levels(classifier: TierClassifier) -> None:
    decisions = classifier.classify_many([(text, "Nursing note") for text in ROUTINE])
    assert not any(critical(d) for d in decisions), list(zip(ROUTINE, decisions, strict=True))
