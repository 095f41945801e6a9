from __future__ import annotations

import re
from typing import Any

import pytest

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.generate.context import EVIDENCE, PATIENT, ContextItem, evidence_tier
from ebmrag.generate.extractive import extractive_brief
from ebmrag.generate.grounding import GroundingChecker
from ebmrag.records.fragment import Tier

RULES = TierClassifier()  # the bundled tier rules

ALLERGY = "Anaphylaxis to penicillin in 2014. Carries an adrenaline pen."
LABS = "Creatinine 2.8 mg/dL, up from 1.1 mg/dL."
HISTORY = "Fever and wound redness since yesterday."
GUIDE = "Avoid all penicillins after anaphylaxis. Choose a non-beta-lactam for wound infection."


def item(n: int, kind: str, fid: str, tier: Tier, body: str, rank: int) -> ContextItem:
    return ContextItem(n, kind, fid, tier, f"[{n}|{tier.value}]", body, rank)


def test_brief_copies_only_input_sentences_and_cites_each() -> None:
    items = [item(1, PATIENT, "hx", Tier.T4, HISTORY, 0), item(2, PATIENT, "labs", Tier.T2, LABS, 1),
             item(3, PATIENT, "allergy", Tier.T1, ALLERGY, 2), item(4, EVIDENCE, "guide#0", Tier.T3, GUIDE, 0)]
    brief = extractive_brief("Which antibiotic?", items, RULES, warning="Critical information is sparse.")
    lines = brief.text.splitlines()
    assert lines[0] == "Warning: Critical information is sparse."
    cited = [line for line in lines if line.startswith("- ")]
    for line in cited:
        sentence, number = re.fullmatch(r"- (.+) \[(\d+)\]", line).groups()  # type: ignore[union-attr]
        assert sentence in items[int(number) - 1].body, f"invented or miscited text: {line}"
    assert [(c.n, c.kind, c.id) for c in brief.citations] == [(1, "patient", "hx"), (2, "patient", "labs"),
                                                              (3, "patient", "allergy"), (4, "evidence", "guide#0")]
    assert brief.text.index("Anaphylaxis to penicillin") < brief.text.index("Creatinine 2.8") < brief.text.index(
        "Fever and wound") < brief.text.index("From the knowledge base:") < brief.text.index("Avoid all penicillins")
    assert "[3|T1]" not in brief.text, "line headers are not copied as claims"
    assert len(cited) == 4, "a line's off-topic, non-decisive second sentence stays in the context, not the brief"
    assert "Carries an adrenaline pen" not in brief.text


def test_evidence_tiers_follow_the_authority_of_the_source() -> None:
    assert [evidence_tier(a) for a in ("guideline", "systematic_review", "trial", "textbook", "other", "")] == [
        Tier.T3, Tier.T3, Tier.T4, Tier.T4, Tier.T4, Tier.T4]


@pytest.fixture(scope="module")
def checker(embedder: Any, extractor: Any) -> GroundingChecker:
    return GroundingChecker(embedder, extractor=extractor)


def test_grounding_flags_invented_and_altered_claims(checker: GroundingChecker) -> None:
    context = [ALLERGY, LABS, GUIDE]
    answer = ("Avoid all penicillins because of the anaphylaxis [1]. Creatinine is 2.8 mg/dL [3]. "
              "Start intravenous amoxicillin at once. The patient has a sulfonamide allergy.")
    supports = checker.run(answer, context)
    assert [s.supported for s in supports] == [True, True, False, False]
    assert supports[1].nearest.startswith("Creatinine 2.8") and supports[0].sentence.endswith("anaphylaxis.")
    assert [s.sentence for s in checker.unsupported(answer, context)] == [
        "Start intravenous amoxicillin at once.", "The patient has a sulfonamide allergy."]
    assert all(not s.supported for s in checker.run("Creatinine is normal.", []))
    altered = checker.run("Creatinine is 4.5 mg/dL. Anaphylaxis to amoxicillin in 2014.", context)
    assert [s.reason for s in altered] == ["number 4.5 is not in the context",
                                           "drug 'amoxicillin' is not in the context"]
    with pytest.raises(ValueError, match="threshold"):
        GroundingChecker(checker.embedder, threshold=0, extractor=checker.extractor)


def test_a_copied_sentence_is_supported_but_a_copied_piece_that_drops_a_negation_is_not(
        checker: GroundingChecker) -> None:
    context = ["No evidence of malignancy in the resected nodes. Margins clear."]
    copied, piece = checker.run("Margins clear. Evidence of malignancy in the resected nodes.", context)
    assert (copied.supported, copied.score, copied.nearest) == (True, 1.0, "Margins clear.")
    assert piece.score < 1.0, "only whole sentences take the verbatim shortcut"


def test_brief_puts_key_facts_first_drops_nothing_recorded_lines_and_stays_short() -> None:
    """Issue 20.5: a Synthea brief was 80 bullets, 39 of them "no conclusion recorded", none on the question."""
    notes = [item(n, PATIENT, f"note{n}", Tier.T4, f"Walked {n} metres with the physiotherapist.", n)
             for n in range(1, 30)]
    empty = item(30, PATIENT, "panel", Tier.T2, "Lipid panel: no value recorded.", 30)
    age = ContextItem(31, PATIENT, "Patient/p", Tier.T3, "[31|T3]", "Patient: 69-year-old male.", 31, must_keep=True)
    kidney = item(32, PATIENT, "labs", Tier.T2, "Creatinine 2.8 mg/dL, eGFR 24.", 32)
    brief = extractive_brief("Which antibiotic is safe given his kidney function?", [*notes, empty, age, kidney], RULES,
                             patient_sentences=5)
    bullets = [line for line in brief.text.splitlines() if line.startswith("- ")]
    assert len(bullets) == 5 and "no value recorded" not in brief.text
    assert bullets[0] == "- Patient: 69-year-old male. [31]" and brief.text.startswith("Evidence brief for:")
    assert "Creatinine 2.8 mg/dL, eGFR 24. [32]" in brief.text
    assert "(27 more context lines in the packed context, not repeated here.)" in brief.text
    with pytest.raises(ValueError, match="brief needs"):
        extractive_brief("q", notes, RULES, patient_sentences=0)


def test_knowledge_base_sentences_are_tiered_once_patient_sentences_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: the brief tiered every evidence sentence on every ask. Knowledge-base sentences are no patient's
    data and recur, so the second brief reads them from memory; a patient's sentences are tiered afresh (nothing
    of a chart is kept in process memory, where an erasure could not reach it)."""
    rules = TierClassifier()
    items = [item(1, PATIENT, "allergy", Tier.T1, ALLERGY, 0), item(2, EVIDENCE, "guide#0", Tier.T3, GUIDE, 0)]
    first = extractive_brief("Which antibiotic?", items, rules).text
    seen: list[str] = []
    original = TierClassifier.rule_decision

    def counting(self: TierClassifier, text: str, section: str | None = None) -> Any:
        seen.append(text)
        return original(self, text, section)

    monkeypatch.setattr(TierClassifier, "rule_decision", counting)
    assert extractive_brief("Which antibiotic?", items, rules).text == first
    assert seen and all(text in ALLERGY for text in seen), seen
