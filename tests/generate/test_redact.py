"""Identifiers never reach an outside model; the user reads them back in the answer."""

from __future__ import annotations

from datetime import date

import pytest

from ebmrag.generate.redact import Redactor, should_redact

TEXT = ("Lindsay928 Gerlach374 (MRN12345678), born 1950-10-24, phone 555-123-4567, mail l.g@example.org, "
        "seen 2020-03-14: creatinine 0.88 mg/dL, platelets 150000/mm3.")


def test_known_and_pattern_identifiers_become_stable_placeholders_and_come_back() -> None:
    redactor = Redactor((("name", "Lindsay928 Gerlach374"), ("name", "Lindsay928"), ("birth_date", "1950-10-24"),
                         ("id", "MRN12345678")), date(2020, 4, 7))
    sent = redactor.apply(TEXT)
    for value in ("Lindsay928", "Gerlach374", "MRN12345678", "1950-10-24", "555-123-4567", "l.g@example.org",
                  "2020-03-14"):
        assert value not in sent, value
    assert "[NAME-1]" in sent and "[DAY-24]" in sent, "an exact date becomes its distance from the newest record date"
    assert "creatinine 0.88 mg/dL" in sent and "150000/mm3" in sent, "clinical values are not identifiers"
    assert redactor.apply("Lindsay928 again") == "[NAME-2] again", "the same value, the same placeholder"
    assert redactor.restore("[NAME-1] was seen on [DAY-24]; call [PHONE-1].") == \
        "Lindsay928 Gerlach374 was seen on 2020-03-14; call 555-123-4567."
    assert redactor.summary() == {"birth_date": 1, "date": 1, "email": 1, "id": 1, "name": 2, "phone": 1}


@pytest.mark.parametrize(("mode", "url", "expected"), [
    ("auto", "http://127.0.0.1:8000/v1", False), ("auto", "http://localhost/v1", False),
    ("auto", "https://api.example.com/v1", True), ("always", "http://127.0.0.1/v1", True),
    ("never", "https://api.example.com/v1", False)])
def test_who_gets_redacted_text(mode: str, url: str, expected: bool) -> None:
    assert should_redact(mode, url) is expected
    with pytest.raises(ValueError, match="redact must be"):
        should_redact("sometimes", url)
