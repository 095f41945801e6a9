"""A fragment dated in the future keeps its flag through the patient store (SQLite and PostgreSQL), so a stored
chart's mistyped year stays flagged in its context line and never becomes the record's newest (issue 43)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.store.charts import fragment_from_json, fragment_to_json
from ebmrag.store.patients import PatientStore

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TYPO = datetime(2062, 3, 2, 9, 0, tzinfo=UTC)


def test_the_flag_survives_the_store_and_an_old_row_reads_unflagged(store: PatientStore) -> None:
    record = PatientRecord("p1", (Fragment("today", "p1", "Creatinine 2.4 mg/dL.", timestamp=NOW),
                                  Fragment("typo", "p1", "Creatinine 0.9 mg/dL.", timestamp=TYPO,
                                           date_in_future=True)))
    store.put_record("t1", "p1", record)
    back = store.record("t1", "p1")
    assert back is not None and [f.date_in_future for f in back.fragments] == [False, True]
    assert back.latest_timestamp == NOW
    assert "date_in_future" not in json.loads(fragment_to_json(record.fragments[0])), "the old shape, unchanged"
    old_row = json.dumps({"id": "x", "text": "t", "section": None, "timestamp": TYPO.isoformat(), "source": None,
                          "encounter": None})
    assert not fragment_from_json(old_row, "p1").date_in_future
