"""Whose resource it is (ehr.compartment): the shapes a server may hand over that are not this patient's
(security review finding 4), and the ones that are."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ebmrag.ehr import compartment
from ebmrag.ehr.compartment import belongs_to, is_shared, named_patients, names_nobody
from ebmrag.rules import RuleBook

BASE = "https://ehr.example/fhir"
OURS = {"reference": "Patient/p1"}


def _observation(**links: Any) -> dict[str, Any]:
    return {"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "potassium"}, **links}


@pytest.mark.parametrize(("resource", "expected"), [
    (_observation(subject=OURS), True),
    (_observation(subject={"reference": "Patient/p1/_history/3"}), True),
    (_observation(subject={"reference": f"{BASE}/Patient/p1"}), True),
    (_observation(subject={"reference": f"{BASE}/Patient/p1/_history/2"}), True),
    ({"resourceType": "AllergyIntolerance", "id": "a", "patient": [OURS]}, True),
    ({"resourceType": "Appointment", "id": "ap", "participant": [{"actor": {"reference": "Patient/p2"}},
                                                                 {"actor": OURS}]}, True),  # a group appointment
    ({"resourceType": "Patient", "id": "p1"}, True),
    # someone else's, or no one can tell whose
    (_observation(subject={"identifier": {"system": "urn:mrn", "value": "p1"}, "display": "Other Person"}), False),
    (_observation(subject={"display": "Other Person"}), False),
    (_observation(subject={"reference": "https://other.example/fhir/Patient/p1"}), False),
    (_observation(subject={"reference": "https://ehr.example/fhir2/Patient/p1"}), False),
    (_observation(subject={"reference": "Patient/p2"}), False),
    (_observation(subject={"reference": "Group/ward"}), False),
    (_observation(subject={"reference": "urn:uuid:p1"}), False),
    (_observation(subject={"reference": "#p1"}), False),
    (_observation(performer=[OURS]), False),  # performed by the patient, about nobody
    (_observation(), False),
    ({"resourceType": "AllergyIntolerance", "id": "a", "patient": [{"reference": "Patient/p2"}, OURS]}, False),
    (_observation(subject=OURS, focus=[{"reference": "Patient/p2"}]), True),  # focus does not say whose
    ({"resourceType": "Patient", "id": "p2", "link": [{"other": OURS}]}, False),
    ({"resourceType": "Device", "id": "d", "patient": {"reference": "Patient/p2"}}, False),
    ({"resourceType": "Device", "id": "d", "patient": OURS}, True),
    ({"resourceType": "Binary", "id": "b", "securityContext": {"reference": "Patient/p2"}}, False),
    # shared: nobody's, kept where the chart refers to it
    ({"resourceType": "Medication", "id": "m", "code": {"text": "ibuprofen"}}, None),
    ({"resourceType": "Practitioner", "id": "dr"}, None),
    ({"resourceType": "Device", "id": "d"}, None),
    ({"resourceType": "Organization", "id": "org"}, None),
])
def test_a_resource_belongs_only_by_a_reference_to_this_patient_on_this_server(resource: dict[str, Any],
                                                                              expected: bool | None) -> None:
    assert belongs_to(resource, "p1", BASE) is expected
    assert is_shared(resource) is (expected is None)


def test_nobody_is_told_apart_from_someone_else() -> None:
    assert names_nobody(_observation()) and names_nobody(_observation(performer=[OURS]))
    assert not names_nobody(_observation(subject={"display": "Other Person"}))
    assert not names_nobody(_observation(subject={"identifier": {"value": "x"}}))
    assert not names_nobody(_observation(subject={"reference": "Patient/p2"}))
    assert not names_nobody({"resourceType": "Medication", "id": "m"}), "shared, not a compartment type"


def test_the_candidates_of_an_export_are_this_servers_patients_only() -> None:
    resource = {"resourceType": "Appointment", "id": "ap", "participant": [
        {"actor": {"reference": "Patient/p2"}}, {"actor": OURS},
        {"actor": {"reference": "https://other.example/fhir/Patient/p3"}}, {"actor": {"reference": "Practitioner/d"}}]}
    assert named_patients(resource, BASE) == {"p1", "p2"}
    assert named_patients({"resourceType": "Patient", "id": "p9"}, BASE) == {"p9"}
    assert named_patients({"resourceType": "Medication", "id": "m"}, BASE) == set()


OTHER = {"reference": "Patient/p2"}
# one resource per FHIR version whose patient sits where R4's table does not look
OLDER_AND_NEWER = [
    {"resourceType": "MedicationOrder", "id": "m1", "status": "active"},  # DSTU2: `patient`
    {"resourceType": "MedicationStatement", "id": "m2", "status": "active"},  # DSTU2: `patient`, R4: `subject`
    {"resourceType": "Condition", "id": "c1", "verificationStatus": "confirmed"},  # DSTU2: `patient`
    {"resourceType": "Encounter", "id": "e1", "status": "finished"},  # DSTU2: `patient`
    {"resourceType": "ProcedureRequest", "id": "pr1", "status": "active"},  # DSTU2/STU3: `subject`
    {"resourceType": "NutritionOrder", "id": "n1", "status": "active"},  # R5: `subject`, R4: `patient`
    {"resourceType": "DeviceUsage", "id": "d1", "status": "active"},  # R5: `patient`
    {"resourceType": "MedicationAdministration", "id": "ma1", "status": "completed"},  # DSTU2: `patient`
    {"resourceType": "DiagnosticOrder", "id": "do1", "status": "requested"},  # DSTU2: `subject`
    {"resourceType": "Account", "id": "ac1", "status": "active"},  # DSTU2 too
    {"resourceType": "ImagingManifest", "id": "im1"},  # STU3: `patient`
    {"resourceType": "DetectedIssue", "id": "di1", "status": "final"},  # R5: `subject`, R4: `patient`
    {"resourceType": "Task", "id": "t1", "status": "requested", "intent": "order"},  # R5: `for`
    {"resourceType": "GuidanceResponse", "id": "g1", "status": "success"},  # R5: `subject`
    {"resourceType": "Provenance", "id": "pv1", "recorded": "2023-03-26T00:00:00Z"},  # R5: `patient`
    {"resourceType": "AuditEvent", "id": "ae1", "action": "R"},  # R5: `patient`, R4: `agent.who`, `entity.what`
]
_ELEMENT = {"MedicationOrder": "patient", "MedicationStatement": "patient", "Condition": "patient",
            "Encounter": "patient", "ProcedureRequest": "subject", "NutritionOrder": "subject",
            "DeviceUsage": "patient", "MedicationAdministration": "patient", "DiagnosticOrder": "subject",
            "Account": "subject", "ImagingManifest": "patient", "DetectedIssue": "subject", "Task": "for",
            "GuidanceResponse": "subject", "Provenance": "patient", "AuditEvent": "patient"}


@pytest.mark.parametrize("resource", OLDER_AND_NEWER, ids=lambda r: r["resourceType"])
def test_every_fhir_versions_patient_element_says_whose_it_is(resource: dict[str, Any]) -> None:
    """Read by R4's table alone, a DSTU2 MedicationStatement naming another patient in `patient` named nobody, and a
    chart could take it in as this patient's active medication."""
    element = _ELEMENT[resource["resourceType"]]
    assert belongs_to({**resource, element: OURS}, "p1", BASE) is True
    assert belongs_to({**resource, element: OTHER}, "p1", BASE) is False
    assert not names_nobody({**resource, element: OTHER}), "it names someone: never adopted as nobody's"
    assert named_patients({**resource, element: OTHER}, BASE) == {"p2"}
    assert names_nobody(resource), "naming no one at all is still nobody"


def test_an_acting_element_naming_the_patient_is_not_whose_record_it_is() -> None:
    """A DSTU2 MedicationStatement told by the patient (`informationSource`) about nobody, or a MedicationOrder whose
    prescriber is the patient, names no one whose record it is: not this patient's, and not someone else's either."""
    told = {"resourceType": "MedicationStatement", "id": "m3", "status": "active", "informationSource": OURS}
    prescribed = {"resourceType": "MedicationOrder", "id": "m4", "prescriber": {"reference": "Patient/p1"}}
    for resource in (told, prescribed):
        assert belongs_to(resource, "p1", BASE) is False
        assert names_nobody(resource) and named_patients(resource, BASE) == set()


# The R4 table compartment.py held before issue 43 (R4 4.0.1 CompartmentDefinition, whose-record elements only)
R4_BEFORE = {
    "Account": ("subject",), "AdverseEvent": ("subject",), "AllergyIntolerance": ("patient",),
    "Appointment": ("participant.actor",), "AppointmentResponse": ("actor",),
    "AuditEvent": ("agent.who", "entity.what"), "Basic": ("subject",), "BodyStructure": ("patient",),
    "CarePlan": ("subject",), "CareTeam": ("subject",), "ChargeItem": ("subject",), "Claim": ("patient",),
    "ClaimResponse": ("patient",), "ClinicalImpression": ("subject",),
    "Communication": ("subject",), "CommunicationRequest": ("subject",), "Composition": ("subject",),
    "Condition": ("subject",), "Consent": ("patient",), "Coverage": ("beneficiary",),
    "CoverageEligibilityRequest": ("patient",), "CoverageEligibilityResponse": ("patient",),
    "DetectedIssue": ("patient",), "DeviceRequest": ("subject",), "DeviceUseStatement": ("subject",),
    "DiagnosticReport": ("subject",), "DocumentManifest": ("subject",), "DocumentReference": ("subject",),
    "Encounter": ("subject",), "EnrollmentRequest": ("candidate",), "EpisodeOfCare": ("patient",),
    "ExplanationOfBenefit": ("patient",), "FamilyMemberHistory": ("patient",), "Flag": ("subject",),
    "Goal": ("subject",), "Group": ("member.entity",), "ImagingStudy": ("subject",), "Immunization": ("patient",),
    "ImmunizationEvaluation": ("patient",), "ImmunizationRecommendation": ("patient",), "Invoice": ("subject",),
    "List": ("subject",), "MeasureReport": ("subject",), "Media": ("subject",),
    "MedicationAdministration": ("subject",), "MedicationDispense": ("subject",), "MedicationRequest": ("subject",),
    "MedicationStatement": ("subject",), "MolecularSequence": ("patient",), "NutritionOrder": ("patient",),
    "Observation": ("subject",), "Person": ("link.target",), "Procedure": ("subject",), "Provenance": ("target",),
    "QuestionnaireResponse": ("subject",), "RelatedPerson": ("patient",), "RequestGroup": ("subject",),
    "ResearchSubject": ("individual",), "RiskAssessment": ("subject",), "Schedule": ("actor",),
    "ServiceRequest": ("subject",), "Specimen": ("subject",), "SupplyDelivery": ("patient",),
    "SupplyRequest": ("deliverTo",), "VisionPrescription": ("patient",),
}
_TABLE = tomllib.loads((Path(compartment.__file__).parents[1] / "rules" / "ehr" / "compartment.toml").read_text(
    encoding="utf-8"))
TABLE = compartment.compartment()
_DOTTED = re.compile(r"[a-z][A-Za-z]*(\.[a-z][A-Za-z]*)*")


def test_every_r4_type_of_the_old_table_keeps_its_r4_paths_and_they_are_marked_r4() -> None:
    for kind, paths in R4_BEFORE.items():
        assert set(paths) <= set(TABLE.types[kind]), kind
    marked_r4 = {kind: {p for p, versions in elements.items() if "R4" in versions}
                 for kind, elements in _TABLE["types"].items()}
    assert {kind: paths for kind, paths in marked_r4.items() if paths} == {k: set(v) for k, v in R4_BEFORE.items()}
    assert TABLE.names_patient_if_set == {"Device": ("patient",), "Binary": ("securityContext",)}
    assert sorted(TABLE.many_people) == ["Appointment", "AuditEvent", "Group", "Provenance", "Schedule"]


def test_every_type_of_the_data_file_loads_with_dotted_paths_and_known_versions() -> None:
    assert dict(TABLE.types) == {kind: tuple(elements) for kind, elements in _TABLE["types"].items()}
    assert {"MedicationOrder", "DiagnosticOrder", "DeviceUsage", "NutritionIntake"} <= TABLE.types.keys()
    for section in ("types", "names_patient_if_set"):
        for kind, elements in _TABLE[section].items():
            assert kind.isalpha() and kind[0].isupper() and elements, kind
            for path, versions in elements.items():
                assert _DOTTED.fullmatch(path), (kind, path)
                assert versions and set(versions) <= {"DSTU2", "STU3", "R4", "R5"}, (kind, path)
                assert versions == sorted(versions, key=["DSTU2", "STU3", "R4", "R5"].index), (kind, path)
    assert "Transport" not in TABLE.types, "R5 puts Transport outside the Patient compartment"


@pytest.mark.parametrize(("entry", "complaint"), [
    ('Observation = { "subject.reference[0]" = ["R4"] }', "dotted element name"),
    ('Observation = { subject = ["R6"] }', "dotted element name"),
    ("Observation = { subject = [] }", "dotted element name"),
    ('Device = { patient = ["R4"] }', "names_patient_if_set"),
])
def test_a_table_entry_that_would_match_nothing_is_refused_at_load(tmp_path: Path, entry: str,
                                                                     complaint: str) -> None:
    table = tmp_path / "ehr" / "compartment.toml"
    table.parent.mkdir()
    table.write_text(f'[types]\n{entry}\n[names_patient_if_set]\nDevice = {{ patient = ["R4"] }}\n'
                     '[many_people]\ntypes = []\n', encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(complaint)):
        compartment.compartment(RuleBook(tmp_path))
