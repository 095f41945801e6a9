"""A kind of record a pull could not read is marked "not read" on the stored chart, never left to read as none; ids
that would steer a URL elsewhere are refused (issue 43)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.cds.hooks import SERVICES, HookRequestError, parse_request
from ebmrag.ehr.chart import as_patient
from ebmrag.ehr.fhir import EhrError, FhirClient
from ebmrag.ehr.ids import is_fhir_id, safe_path
from ebmrag.ehr.pull import pull_patient
from ebmrag.ehr.scopes import scope_reads
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.store.patients import PatientStore
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import QUICK, TENANT, any_store, load_one, quick, register  # noqa: F401 (any_store: a fixture)

NZ = "ips_nz_peter_jordan_labs_document.json"
NONE_RECORDED = "no allergy or allergy statement is recorded"


def _allergy_line(store: PatientStore, patient: str) -> str:
    record = store.record(TENANT, patient)
    assert record is not None
    return next(f.text for f in record.fragments if f.id == "summary/allergies")


@pytest.mark.parametrize(("granted", "kind", "reads"), [
    ("system/*.rs", "AllergyIntolerance", True),
    ("system/*.read", "AllergyIntolerance", True),
    ("system/Patient.rs system/Observation.rs", "AllergyIntolerance", False),
    ("system/AllergyIntolerance.s", "AllergyIntolerance", True),
    ("system/AllergyIntolerance.c", "AllergyIntolerance", False),
    ("system/Observation.rs?category=laboratory", "Observation", False),  # part of the kind only
    ("patient/AllergyIntolerance.read launch/patient", "AllergyIntolerance", True),
    ("system/*.write", "Condition", False),
    ("openid offline_access", "Condition", True),  # no resource scope: the grant says nothing of kinds
])
def test_granted_scopes_say_which_kinds_are_read_whole(granted: str, kind: str, reads: bool) -> None:
    assert scope_reads(granted, kind) is reads


@pytest.mark.parametrize(("value", "valid"), [
    ("7", True), ("a-b.c", True), ("x" * 64, True), (".", False), ("..", False), ("...", False), ("", False),
    ("x" * 65, False), ("a/b", False), ("a:b", False), ("a%2e", False)])
def test_fhir_ids_by_the_grammar_and_never_a_dot_segment(value: str, valid: bool) -> None:
    assert is_fhir_id(value) is valid


def test_paths_that_a_url_would_resolve_elsewhere_are_refused() -> None:
    assert safe_path("Patient/7/$everything") and safe_path("/fhir/$export-status/9?x=..")
    for path in ("Patient/..", "Patient/./7", "Patient//7", "Patient/%2e%2e", "Patient/a%2Fb", "Patient/a\\b"):
        assert not safe_path(path), path
    client = FhirClient("http://127.0.0.1:9/fhir", QUICK)
    with pytest.raises(EhrError, match="dot or encoded segment"):
        client.url("Patient/..", operation="read Patient")
    client.close()


@pytest.mark.parametrize("patient", [".", ".."])
def test_a_cds_patient_id_of_dots_is_refused(patient: str) -> None:
    body = {"hook": "patient-view", "hookInstance": "h-1",
            "context": {"patientId": patient, "userId": "Practitioner/1"}}
    service = next(s for s in SERVICES.values() if s.hook == "patient-view")
    with pytest.raises(HookRequestError, match="not only dots"):
        parse_request(body, service)


def test_an_unread_kind_rewrites_the_face_sheet_lines_it_feeds() -> None:
    fragments = (Fragment("summary/allergies", "p", f"Allergy status: {NONE_RECORDED} in this chart.", "Summary"),
                 Fragment("summary/active-medications", "p", "Active medications (1): metformin.", "Medications"))
    record = as_patient(PatientRecord("p", fragments, "pull"), "p",
                        unread={"AllergyIntolerance": "could not be downloaded", "Condition": "were not all read",
                                "MedicationRequest": "were not all read"})
    lines = {f.id: f.text for f in record.fragments}
    assert NONE_RECORDED not in lines["summary/allergies"]
    assert lines["summary/allergies"].startswith("Allergy status: not known. AllergyIntolerance records could not be "
                                                 "downloaded")
    assert lines["summary/active-medications"].startswith("Active medications (1): metformin. Not read from the FHIR "
                                                          "server: MedicationRequest records were not all read")
    assert lines["summary/active-problems"].startswith("Active problems: not known. Condition records")
    assert any(s.startswith("AllergyIntolerance: not read from the FHIR server") for s in record.skipped)


def test_kinds_outside_the_granted_scopes_are_marked_not_read(fhir: FhirServer, tmp_path: Path,
                                                             any_store: PatientStore) -> None:  # noqa: F811
    """$everything answers with what the token may see: allergies outside its scopes are silently missing."""
    patient = load_one(fhir, NZ)
    granted = "system/Patient.rs system/Observation.rs system/Condition.rs system/MedicationStatement.rs"
    connection = register(fhir, tmp_path, scope=granted, registered=granted)
    pull_patient(any_store, connection, patient, params=quick(reference_depth=0))  # no Organization scope either
    line = _allergy_line(any_store, patient)
    assert NONE_RECORDED not in line
    assert line.startswith("Allergy status: not known. AllergyIntolerance records are outside the access token's "
                           "granted scopes")


def test_a_kind_the_server_cannot_search_by_patient_is_marked_not_read(fhir: FhirServer, tmp_path: Path,
                                                                      any_store: PatientStore) -> None:  # noqa: F811
    patient = load_one(fhir, NZ)
    fhir.faults(everything=False, no_patient_search=["AllergyIntolerance"])
    pull_patient(any_store, register(fhir, tmp_path), patient, params=QUICK)
    line = _allergy_line(any_store, patient)  # a statement fetched as what the Composition refers to stays, marked
    assert NONE_RECORDED not in line
    assert "Not read from the FHIR server: AllergyIntolerance records are not searchable by patient" in line


def test_a_resource_holding_a_nul_is_not_stored_and_its_kind_is_marked(fhir: FhirServer, tmp_path: Path,
                                                                      any_store: PatientStore) -> None:  # noqa: F811
    """PostgreSQL refuses NUL in text: before, the whole pull was a 500 there."""
    patient = load_one(fhir, NZ)
    fhir.load([{"resourceType": "AllergyIntolerance", "id": "nul-1", "patient": {"reference": f"Patient/{patient}"},
                "code": {"text": "latex\u0000 dust"}}])
    pull_patient(any_store, register(fhir, tmp_path), patient, params=QUICK)
    record = any_store.record(TENANT, patient)
    assert record is not None and not any("\x00" in f.text for f in record.fragments)
    line = _allergy_line(any_store, patient)
    assert NONE_RECORDED not in line and "NUL character" in line
    report = pull_patient(any_store, register(fhir, tmp_path), patient, params=QUICK)  # a refresh
    assert report.incremental and report.fetched > 1, "what was not read is asked for again, not only changes"
    assert "NUL character" in _allergy_line(any_store, patient)
