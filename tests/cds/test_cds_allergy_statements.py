"""An allergy entry that takes itself back in its own words gets no warning card; one that does not, still does
(cds/facts.py, records/vocab/allergy_statements.toml)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cds.test_cds_cards import allergy, cards, of_kind, order

AMOXICILLIN = order("o1", "amoxicillin 500 MG Oral Capsule", "308191")


def _warnings(entry: dict[str, Any]) -> list[str]:
    """The allergy cards' indicators, a `critical` one counted as the warning it is (an anaphylaxis is critical
    since issue 47)."""
    return [c.indicator.replace("critical", "warning") for c in of_kind(cards([entry], AMOXICILLIN), "allergy")]


@pytest.mark.parametrize("words", [
    "Not allergic to penicillin",
    "Denies penicillin allergy",
    "Penicillin allergy delabelled after direct oral challenge",
    "Penicillin - label removed, negative skin test",
    "Penicillin: tolerated amoxicillin course 2023",
    "Negative oral challenge to amoxicillin",
    "Penicillin allergy ruled out",
])
def test_an_entry_that_takes_the_allergy_back_gets_no_warning(words: str) -> None:
    assert "warning" not in _warnings(allergy("a1", words, "Anaphylaxis"))


@pytest.mark.parametrize("words", [
    "Penicillin", "Penicillin allergy", "Allergy to penicillins (anaphylaxis 2015)", "PENICILLIN G",
    "Penicillin allergy, confirmed by skin test", "Amoxicillin - hives",
])
def test_an_entry_that_states_the_allergy_still_warns(words: str) -> None:
    assert "warning" in _warnings(allergy("a1", words, "Anaphylaxis"))


@pytest.mark.parametrize(("status", "warns"), [
    ("Entered in Error", False), ("entered in error", False), ("Refuted", False), ("Confirmed", True),
    ("Unconfirmed", True),
])
def test_a_verification_status_written_only_as_text_is_read(status: str, warns: bool) -> None:
    entry = allergy("a1", "Penicillin", "Anaphylaxis", verificationStatus={"text": status})
    assert ("warning" in _warnings(entry)) is warns


def test_an_interpretation_that_says_no_critical_is_not_a_critical_result() -> None:
    from datetime import timedelta

    from tests.cds.test_cds_cards import NOW, lab

    potassium = lab("k1", "2823-3", 4.1, "mmol/L", NOW - timedelta(hours=2))
    said = dict(potassium, interpretation=[{"text": "No critical values"}])
    flagged = dict(potassium, interpretation=[{"text": "Critical value, called to ward"}])
    assert not of_kind(cards([said], hook="patient-view"), "critical-result")
    assert of_kind(cards([flagged], hook="patient-view"), "critical-result")
