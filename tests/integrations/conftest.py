"""One scenario for every framework drop-in: the bundled demo patient and the bundled demo guidelines, a question
about antibiotics, and a budget in which the framework's own cut loses the penicillin anaphylaxis."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ebmrag.demo import demo_guidelines
from ebmrag.evidence.tiering import Tiering
from ebmrag.integrations.core import EvidencePacker, resolve_record
from ebmrag.packing.packer import ContextPacker
from ebmrag.records.fragment import PatientRecord

QUESTION = "Which antibiotic should treat his post-operative wound infection?"
BUDGET = 420
ALLERGY = "admission-2026-03-08"  # the admission assessment that tells of a penicillin anaphylaxis (must-keep)


@pytest.fixture(scope="session")
def guidelines() -> list[dict[str, str]]:
    return demo_guidelines()


@pytest.fixture(scope="session")
def record() -> PatientRecord:
    return resolve_record("demo-colon")


@pytest.fixture(scope="session")
def evidence_packer(context_packer: ContextPacker, tiering: Tiering, record: PatientRecord) -> EvidencePacker:
    return EvidencePacker(BUDGET, record, packer=context_packer, tiering=tiering)


def first_that_fit(texts: Sequence[str], packer: ContextPacker, budget: int = BUDGET) -> list[str]:
    """What a pipeline without EBM-Pack puts in the window: retrieved texts in rank order until the budget is full."""
    kept, used = [], 0
    for text in texts:
        cost = packer.token_counter.count(text)
        if used + cost > budget:
            break
        kept.append(text)
        used += cost
    return kept
