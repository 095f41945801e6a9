"""What a pull refuses, against the real test FHIR server (security review of the pull, findings 2, 4, 7, 8): a
second person's chart under one store id, resources that are not the patient's, answers that do not decode or
link nowhere, and a pull that is too large or too slow in all."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ebmrag.ehr.fhir import EhrError
from ebmrag.ehr.pull import pull_patient, source_of
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.store.patients import PatientStore, SQLiteStore
from ebmrag.store.pulled import ChartSourceConflictError
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import (
    QUICK,
    STRANGER_IDS,
    TENANT,
    any_store,  # noqa: F401 (a fixture)
    load_one,
    quick,
    register,
    snapshot,
    strangers,
    texts,
)

NZ = "ips_nz_peter_jordan_labs_document.json"
EPIC = "ips_us_epic_document.json"


def test_a_second_source_is_refused_until_replace(fhir: FhirServer, tmp_path: Path,
                                                  any_store: PatientStore) -> None:  # noqa: F811
    nz, epic = load_one(fhir, NZ), load_one(fhir, EPIC)
    connection = register(fhir, tmp_path)
    result = Fragment("result:lab:1", nz, "Potassium 6.4 mmol/L (critical).", "Laboratory")
    any_store.upsert_fragments(TENANT, nz, PatientRecord(nz, (result,)))  # the tenant's own feed: it stays
    first = pull_patient(any_store, connection, nz, params=QUICK)
    held = snapshot(any_store, TENANT, nz, source_of(connection, nz))
    mark = len(fhir.requests())
    with pytest.raises(ChartSourceConflictError) as caught:
        pull_patient(any_store, connection, nz, params=QUICK, fhir_patient=epic)
    assert str(caught.value) == ("the patient already holds a chart pulled from another source (another FHIR "
                                 "server or patient id); nothing fetched (replace erases that chart and stores "
                                 "this one)")
    assert fhir.requests()[mark:] == [], "refused before anything is fetched"
    assert snapshot(any_store, TENANT, nz, source_of(connection, nz)) == held
    with pytest.raises(ChartSourceConflictError, match="nothing stored"):  # the store's own check, in the write
        any_store.put_pulled(TENANT, nz, source_of(connection, epic), PatientRecord(nz, ()), [], "", True)
    assert snapshot(any_store, TENANT, nz, source_of(connection, nz)) == held

    replaced = pull_patient(any_store, connection, nz, params=QUICK, fhir_patient=epic, replace_source=True)
    record = any_store.record(TENANT, nz)
    assert record is not None and [f.id for f in record.fragments] == [*replaced.fragment_ids, "result:lab:1"]
    assert texts(record)[:-1] == texts(_pulled_alone(fhir, tmp_path, epic)), "only the new chart, whole"
    assert (replaced.written.added, replaced.written.removed) == (len(replaced.fragment_ids),
                                                                  len(first.fragment_ids))
    assert any_store.pulled_sources(TENANT, nz) == [source_of(connection, epic)]
    assert any_store.pulled_resources(TENANT, nz, source_of(connection, nz)) == []
    assert any_store.pulled_state(TENANT, nz, source_of(connection, nz)) is None


def test_what_is_not_this_patients_is_not_kept_and_is_counted(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    clean = SQLiteStore(tmp_path / "clean.sqlite")
    pull_patient(clean, connection, patient, params=QUICK)
    fhir.load(strangers(patient))
    store = SQLiteStore(tmp_path / "s.sqlite")
    report = pull_patient(store, connection, patient, params=QUICK)
    assert report.fetched == 108 and report.kept == 108, "the four were handed over, none kept"
    dropped = [s for s in report.skipped if "not this patient's" in s]
    assert [s.split(":")[0] for s in dropped] == ["AllergyIntolerance x1", "Observation x3"]
    stored = store.record(TENANT, patient)
    assert stored is not None and list(stored.skipped) == list(report.skipped), "the count is kept with the chart"
    kept = store.pulled_resources(TENANT, patient, source_of(connection, patient))
    assert not any(f'"id":"{rid}"' in body for body in kept for rid in STRANGER_IDS)
    assert not any("marker" in text for text in texts(stored))
    before = {f.id: f.text for f in clean.record(TENANT, patient).fragments}  # type: ignore[union-attr]
    after = {f.id: f.text for f in stored.fragments}
    assert after.keys() == before.keys()
    changed = {fid for fid in after if after[fid] != before[fid]}
    assert changed == {"summary/allergies"}, "only the list whose kind lost a record says so"
    assert after["summary/allergies"] == before["summary/allergies"] + (
        " Not read: 1 more record of this kind on the FHIR server that do not name this patient by reference; the "
        "chart may hold more than this line says.")


def test_a_pull_over_its_total_cap_is_one_line_and_stores_nothing(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    store = SQLiteStore(tmp_path / "s.sqlite")
    with pytest.raises(EhrError) as caught:
        pull_patient(store, register(fhir, tmp_path), patient, params=quick(page_size=20, max_pull_mb=0.05))
    assert str(caught.value) == ("Patient $everything: more than 0.05 MB received in all ([ehr] max_pull_mb); "
                                 "stopped, nothing stored")
    assert store.record(TENANT, patient) is None


def test_a_slow_drip_stops_at_the_pulls_deadline(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    fhir.faults(drip_ms=20)  # a byte every 20 ms: each read is quick, the answer never ends
    store = SQLiteStore(tmp_path / "s.sqlite")
    params = quick(pull_seconds=1.5)
    started = time.monotonic()
    with pytest.raises(EhrError) as caught:
        pull_patient(store, connection, patient, params=params)
    assert time.monotonic() - started < 3 * params.pull_seconds, \
        "stopped at the deadline, not when the answer ends (minutes of dripping away)"
    assert str(caught.value) == ("Patient $everything: not done after 1.5 s ([ehr] pull_seconds); stopped, nothing "
                                 "stored")
    assert store.record(TENANT, patient) is None


@pytest.mark.parametrize(("fault", "expected"), [
    ({"bad_gzip": True}, "Patient $everything: the FHIR server's answer could not be read: the gzip body does not "
                         "decode (Error -3 while decompressing data: incorrect header check)"),
    ({"next_link": "http://[::1"}, "Patient $everything: the FHIR server's next link is not a valid URL; it is "
                                   "not followed"),
    ({"next_link": "http://127.0.0.1:notaport/fhir"}, "Patient $everything: the FHIR server's next link is not a "
                                                      "valid URL; it is not followed"),
])
def test_an_answer_that_cannot_be_read_is_one_line(fhir: FhirServer, tmp_path: Path, fault: dict[str, object],
                                                   expected: str) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    fhir.faults(**fault)
    store = SQLiteStore(tmp_path / "s.sqlite")
    with pytest.raises(EhrError) as caught:
        pull_patient(store, connection, patient, params=quick(page_size=20))
    assert str(caught.value) == expected
    assert store.record(TENANT, patient) is None


def _pulled_alone(fhir: FhirServer, tmp_path: Path, patient: str) -> PatientRecord:
    store = SQLiteStore(tmp_path / f"alone-{patient[:8]}.sqlite")
    pull_patient(store, register(fhir, tmp_path), patient, params=QUICK)
    record = store.record(TENANT, patient)
    assert record is not None
    return record
