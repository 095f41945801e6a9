"""Whose resource it is (ehr.compartment): the shapes a server may hand over that are not this patient's
(security review finding 4), and the ones that are."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ebmrag.ehr.compartment import COMPARTMENT, belongs_to, is_shared, named_patients, names_nobody

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
]
_ELEMENT = {"MedicationOrder": "patient", "MedicationStatement": "patient", "Condition": "patient",
            "Encounter": "patient", "ProcedureRequest": "subject", "NutritionOrder": "subject",
            "DeviceUsage": "patient"}


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


def test_the_compartment_table_holds_every_r4_type_and_only_dotted_element_names() -> None:
    r4 = {"AllergyIntolerance": "patient", "Condition": "subject", "Encounter": "subject", "Observation": "subject",
          "MedicationRequest": "subject", "MedicationStatement": "subject", "Immunization": "patient",
          "Coverage": "beneficiary", "ResearchSubject": "individual", "EnrollmentRequest": "candidate",
          "SupplyRequest": "deliverTo", "Person": "link.target", "AuditEvent": "agent.who"}
    for kind, path in r4.items():
        assert path in COMPARTMENT[kind], kind
    for kind, paths in COMPARTMENT.items():
        assert kind.isalpha() and kind[0].isupper() and paths
        assert all(re.fullmatch(r"[a-z][A-Za-z]*(\.[a-z][A-Za-z]*)*", p) for p in paths), kind
