from __future__ import annotations

import re
from typing import Any

import pytest

from ebmrag.evidence.fragment import Tier
from ebmrag.generate.assembler import SelectedChunk
from ebmrag.generate.extractive import extractive_brief
from ebmrag.generate.grounding import GroundingChecker
from ebmrag.index.search import SearchHit
from ebmrag.packing.types import PackedFragment, PackReason, State

ALLERGY = "[allergy|T1|2015-02-01] Anaphylaxis to penicillin in 2014. Carries an adrenaline pen."
LABS = "[labs|T2|2026-03-13] Creatinine 2.8 mg/dL, up from 1.1 mg/dL."
HISTORY = "[hx|T4|2026-03-13] Fever and wound redness since yesterday."
GUIDE = "Avoid all penicillins after anaphylaxis. Choose a non-beta-lactam for wound infection."


def packed(fid: str, tier: Tier, text: str, order: int) -> PackedFragment:
    return PackedFragment(fid, tier, State.FULL, 20, 1.0, PackReason.OPTIMAL, text, order)


def chunk() -> SelectedChunk:
    hit = SearchHit("guide#0", "guide", 0.9, "", GUIDE, "guides", "", 0, len(GUIDE), "guideline", "")
    return SelectedChunk(1, hit, GUIDE, False)


def test_brief_copies_only_input_sentences_and_cites_each() -> None:
    fragments = [packed("hx", Tier.T4, HISTORY, 0), packed("labs", Tier.T2, LABS, 1),
                 packed("allergy", Tier.T1, ALLERGY, 2)]
    brief = extractive_brief("Which antibiotic?", fragments, [chunk()], warning="Critical information is sparse.")
    lines = brief.text.splitlines()
    assert lines[0] == "Warning: Critical information is sparse."
    cited = [line for line in lines if line.startswith("- ")]
    sources = " ".join([ALLERGY, LABS, HISTORY, GUIDE])
    for line in cited:
        sentence, number = re.fullmatch(r"- (.+) \[(\d+)\]", line).groups()  # type: ignore[union-attr]
        assert sentence in sources, f"invented text: {sentence}"
        assert int(number) in {c.n for c in brief.citations}
    assert [(c.n, c.kind, c.id) for c in brief.citations] == [(1, "evidence", "guide#0"), (2, "patient", "allergy"),
                                                              (3, "patient", "labs"), (4, "patient", "hx")]
    assert brief.text.index("Anaphylaxis to penicillin") < brief.text.index("Creatinine 2.8")
    assert "[allergy|T1" not in brief.text, "packer headers are not copied as claims"
    assert len(cited) == 2 + 1 + 1 + 2


@pytest.fixture(scope="module")
def checker(embedder: Any) -> GroundingChecker:
    return GroundingChecker(embedder)


def test_grounding_flags_invented_and_altered_claims(checker: GroundingChecker) -> None:
    context = [ALLERGY.split("] ", 1)[1], LABS.split("] ", 1)[1], GUIDE]
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
        GroundingChecker(checker.embedder, threshold=0)
