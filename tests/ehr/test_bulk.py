"""Group-level Bulk Data $export against the real test server: kick-off, polling with Retry-After, NDJSON
downloads with the token, one atomic store per patient, and the cancel when the export is given up."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ebmrag.ehr.bulk import export_group
from ebmrag.ehr.fhir import EhrError
from ebmrag.ehr.pull import PullReport, pull_patient
from ebmrag.store.patients import SQLiteStore
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import QUICK, TENANT, load_one, quick, register, texts

WARD = ("ips_nz_peter_jordan_labs_document.json", "ips_it_italian_codes_document.json",
        "ips_us_epic_document.json")


def _ward(fhir: FhirServer) -> list[str]:
    patients = [load_one(fhir, name) for name in WARD]
    fhir.load([{"resourceType": "Group", "id": "ward-7", "type": "person", "actual": True,
                "member": [{"entity": {"reference": f"Patient/{p}"}} for p in patients]}])
    return patients


def test_a_group_export_stores_each_patient_as_a_pull_would(fhir: FhirServer, tmp_path: Path) -> None:
    patients = _ward(fhir)
    connection = register(fhir, tmp_path)
    store = SQLiteStore(tmp_path / "bulk.sqlite")
    heard: list[PullReport] = []
    started = time.monotonic()
    report = export_group(store, connection, "ward-7", params=QUICK, on_stored=heard.append)
    assert time.monotonic() - started >= 1.0, "the status poll's Retry-After: 1 was waited for"
    assert sorted(p.patient for p in report.patients) == sorted(patients) == sorted(h.patient for h in heard)
    assert report.problems == () and report.files >= 5
    log = [(r["method"], r["path"].split("/")[2], r["status"]) for r in fhir.requests() if r["path"] != "/auth/token"]
    assert log[:4] == [("GET", "metadata", 200), ("GET", ".well-known", 200), ("GET", "Group", 202),
                       ("GET", "$export-status", 202)]
    assert log[4] == ("GET", "$export-status", 200) and {entry[1:] for entry in log[5:]} == {("$export-file", 200)}
    pulled = SQLiteStore(tmp_path / "pulled.sqlite")
    for patient in patients:  # the same chart as $everything gives, and a later pull refreshes from the export
        pull_patient(pulled, connection, patient, params=QUICK)
        exported, fetched = store.record(TENANT, patient), pulled.record(TENANT, patient)
        assert exported is not None and fetched is not None and texts(exported) == texts(fetched)
        again = pull_patient(store, connection, patient, params=QUICK)
        assert again.incremental and again.fetched == 0 and again.written.changed == 0


def test_an_export_given_up_is_cancelled_and_stores_nothing(fhir: FhirServer, tmp_path: Path) -> None:
    patients = _ward(fhir)
    connection = register(fhir, tmp_path)
    fhir.faults(export_polls=20)
    store = SQLiteStore(tmp_path / "s.sqlite")
    with pytest.raises(EhrError) as caught:
        export_group(store, connection, "ward-7", params=quick(export_wait_seconds=1.5))
    assert str(caught.value) == "bulk export: not complete after 1.5 s ([ehr] export_wait_seconds); cancelled"
    status = [(r["method"], r["status"]) for r in fhir.requests() if "$export-status" in r["path"]]
    assert status[-1] == ("DELETE", 202) and status.count(("GET", 202)) == 2
    assert all(store.record(TENANT, p) is None for p in patients)


def test_an_unknown_group_is_one_line(fhir: FhirServer, tmp_path: Path) -> None:
    _ward(fhir)
    connection = register(fhir, tmp_path)
    with pytest.raises(EhrError) as caught:
        export_group(SQLiteStore(tmp_path / "s.sqlite"), connection, "ward-8", params=QUICK)
    assert str(caught.value) == ("bulk export kick-off: the FHIR server refused (404 Not Found): Group/ward-8 not "
                                 "found")
