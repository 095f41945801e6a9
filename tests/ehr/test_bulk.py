"""Group-level Bulk Data $export against the real test server: kick-off, polling with Retry-After, NDJSON
downloads with the token, one atomic store per patient, and the cancel when the export is given up."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ebmrag.ehr.bulk import export_group
from ebmrag.ehr.fhir import EhrError
from ebmrag.ehr.pull import PullReport, pull_patient, source_of
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.store.patients import SQLiteStore
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import QUICK, STRANGER_IDS, TENANT, Bystander, load_one, quick, register, strangers, texts

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
    assert str(caught.value) == "bulk export kick-off: the FHIR server refused (404 Not Found; issue not-found)"


def test_a_store_id_that_is_not_free_is_reported_and_left_as_it_is(fhir: FhirServer, tmp_path: Path) -> None:
    nz, italian, epic = _ward(fhir)
    connection = register(fhir, tmp_path)
    store = SQLiteStore(tmp_path / "s.sqlite")
    uploaded = PatientRecord(nz, (Fragment("note:1", nz, "An uploaded note about this store patient.", "Notes"),))
    store.put_record(TENANT, nz, uploaded)  # the tenant's own chart under the server's id: not the export's to merge
    pull_patient(store, connection, italian, params=QUICK)  # bound to the same source already: refreshed
    pull_patient(store, connection, epic, params=QUICK, fhir_patient=italian)  # bound to another source
    held_epic = store.record(TENANT, epic)
    fhir.faults(export_retry_after=0)
    report = export_group(store, connection, "ward-7", params=QUICK)
    assert [p.patient for p in report.patients] == [italian]
    assert sorted(report.not_stored) == sorted([(nz, "chart-source-conflict"), (epic, "chart-source-conflict")])
    assert sum("its store id already holds a chart from elsewhere" in p for p in report.problems) == 2
    kept = store.record(TENANT, nz)
    assert kept is not None and kept.fragments == uploaded.fragments
    assert store.record(TENANT, epic) == held_epic
    assert store.pulled_sources(TENANT, epic) == [source_of(connection, italian)]


def test_a_file_on_another_origin_is_never_fetched(fhir: FhirServer, tmp_path: Path) -> None:
    patients = _ward(fhir)
    connection = register(fhir, tmp_path)
    store = SQLiteStore(tmp_path / "s.sqlite")
    with Bystander(200, b"", "application/fhir+ndjson") as files:
        fhir.faults(manifest_file={"url": f"{files.origin}/Patient.ndjson", "requires_token": False},
                    export_retry_after=0)
        with pytest.raises(EhrError) as caught:
            export_group(store, connection, "ward-7", params=QUICK)
        assert str(caught.value) == ("bulk export download: output file #1 (Patient) is not on the FHIR base's origin "
                                     "nor one of [ehr.connections.ehr] bulk_file_origins; nothing fetched, nothing "
                                     "stored")
        assert files.received == [], "not even without the token"
        assert not any("$export-file" in r["path"] for r in fhir.requests()), "nothing fetched at all"
        assert ("DELETE", 202) in [(r["method"], r["status"]) for r in fhir.requests() if "$export-status" in r["path"]]
        assert all(store.record(TENANT, p) is None for p in patients)
        # An origin the operator lists is trusted with the files, and with the token when the manifest asks for it.
        fhir.faults(manifest_file={"url": f"{files.origin}/Patient.ndjson", "requires_token": True})
        export_group(store, replace(connection, bulk_file_origins=(files.origin,)), "ward-7", params=QUICK)
        assert [(method, path) for method, path, _ in files.received] == [("GET", "/Patient.ndjson")]
        sent = {name.lower(): value for name, value in files.received[0][2].items()}
        assert sent["authorization"].startswith("Bearer ")


def test_an_export_over_its_cap_is_one_line_and_stores_nothing(fhir: FhirServer, tmp_path: Path) -> None:
    patients = _ward(fhir)
    connection = register(fhir, tmp_path)
    store = SQLiteStore(tmp_path / "s.sqlite")
    fhir.faults(export_retry_after=0)
    with pytest.raises(EhrError) as caught:
        export_group(store, connection, "ward-7", params=quick(max_export_mb=0.05))
    assert re.fullmatch(r"bulk export download [A-Za-z]+: more than 0\.05 MB received in all \(\[ehr\] "
                        r"max_export_mb\); stopped, nothing stored", str(caught.value)), str(caught.value)
    assert all(store.record(TENANT, p) is None for p in patients)
    assert [r["method"] for r in fhir.requests() if "$export-status" in r["path"]][-1] == "DELETE"


def test_what_belongs_to_no_exported_patient_is_counted_not_stored(fhir: FhirServer, tmp_path: Path) -> None:
    patients = _ward(fhir)
    fhir.load(strangers(patients[0]))
    store = SQLiteStore(tmp_path / "s.sqlite")
    fhir.faults(export_retry_after=0)
    report = export_group(store, register(fhir, tmp_path), "ward-7", params=QUICK)
    assert sorted(p.patient for p in report.patients) == sorted(patients)
    assert [p.split(":")[0] for p in report.problems] == ["AllergyIntolerance x1", "Observation x3"]
    for patient in patients:
        kept = store.pulled_resources(TENANT, patient, source_of(register(fhir, tmp_path), patient))
        assert not any(marker in body for body in kept for marker in STRANGER_IDS)
