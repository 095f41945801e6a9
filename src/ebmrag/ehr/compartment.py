"""Whose resource it is: the FHIR R4 Patient compartment, read strictly, for what a server hands over.

A server's `$everything` page, a Bulk Data file or a CDS prefetch may hold resources that are not this patient's:
another patient's Observation, one whose subject is only an identifier or a display ("Other Person"), one that
points at the same id on another server, or one that names nobody. None of those may enter this patient's chart
or cards, so a resource of a compartment type belongs only when one of the elements that say whose it is holds a
*reference* that resolves to this patient on this server (`Patient/<id>`, `Patient/<id>/_history/<v>`, or either
absolute on the FHIR base), and none of them names someone else. Resource types outside the compartment
(Medication, Organization, Practitioner, Location, ...) belong to nobody: they are shared, kept when the chart
refers to them; a shared type that does name a patient anyway (a Device's `patient`, a Binary's
`securityContext`) must name this one. A compartment type that names nobody at all (`names_nobody`) is not this
patient's either; a chart may still take it in where the patient's own resources refer to it, as a file's reader
would.

The elements are the R4 CompartmentDefinition's, as element paths rather than search parameters, limited to the
ones that name whose record it is (`Observation.subject`, not `Observation.performer`: a patient may perform
another patient's measurement, which is still the other patient's).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["COMPARTMENT", "belongs_to", "is_shared", "named_patients", "names_nobody", "names_patient"]

# resource type -> the element paths (dotted; lists walked) that say whose the resource is
COMPARTMENT: Mapping[str, tuple[str, ...]] = {
    "Account": ("subject",),
    "AdverseEvent": ("subject",),
    "AllergyIntolerance": ("patient",),
    "Appointment": ("participant.actor",),
    "AppointmentResponse": ("actor",),
    "AuditEvent": ("agent.who", "entity.what"),
    "Basic": ("subject",),
    "BodyStructure": ("patient",),
    "CarePlan": ("subject",),
    "CareTeam": ("subject",),
    "ChargeItem": ("subject",),
    "Claim": ("patient",),
    "ClaimResponse": ("patient",),
    "ClinicalImpression": ("subject",),
    "Communication": ("subject",),
    "CommunicationRequest": ("subject",),
    "Composition": ("subject",),
    "Condition": ("subject",),
    "Consent": ("patient",),
    "Coverage": ("beneficiary",),
    "CoverageEligibilityRequest": ("patient",),
    "CoverageEligibilityResponse": ("patient",),
    "DetectedIssue": ("patient",),
    "DeviceRequest": ("subject",),
    "DeviceUseStatement": ("subject",),
    "DiagnosticReport": ("subject",),
    "DocumentManifest": ("subject",),
    "DocumentReference": ("subject",),
    "Encounter": ("subject",),
    "EnrollmentRequest": ("candidate",),
    "EpisodeOfCare": ("patient",),
    "ExplanationOfBenefit": ("patient",),
    "FamilyMemberHistory": ("patient",),
    "Flag": ("subject",),
    "Goal": ("subject",),
    "Group": ("member.entity",),
    "ImagingStudy": ("subject",),
    "Immunization": ("patient",),
    "ImmunizationEvaluation": ("patient",),
    "ImmunizationRecommendation": ("patient",),
    "Invoice": ("subject",),
    "List": ("subject",),
    "MeasureReport": ("subject",),
    "Media": ("subject",),
    "MedicationAdministration": ("subject",),
    "MedicationDispense": ("subject",),
    "MedicationRequest": ("subject",),
    "MedicationStatement": ("subject",),
    "MolecularSequence": ("patient",),
    "NutritionOrder": ("patient",),
    "Observation": ("subject",),
    "Person": ("link.target",),
    "Procedure": ("subject",),
    "Provenance": ("target",),
    "QuestionnaireResponse": ("subject",),
    "RelatedPerson": ("patient",),
    "RequestGroup": ("subject",),
    "ResearchSubject": ("individual",),
    "RiskAssessment": ("subject",),
    "Schedule": ("actor",),
    "ServiceRequest": ("subject",),
    "Specimen": ("subject",),
    "SupplyDelivery": ("patient",),
    "SupplyRequest": ("deliverTo",),
    "VisionPrescription": ("patient",),
}
# shared types that may still name a patient (a Device implanted in one; a Binary's security context)
NAMES_PATIENT_IF_SET: Mapping[str, tuple[str, ...]] = {"Device": ("patient",), "Binary": ("securityContext",)}
# elements where several people may be named by design (a group appointment, a cohort, a provenance's targets)
MANY_PEOPLE = frozenset({"Appointment", "AuditEvent", "Group", "Provenance", "Schedule"})
_GENERIC = ("subject", "patient")  # a type this table does not know: checked when it names a patient here


def belongs_to(resource: Mapping[str, Any], patient_id: str, fhir_base: str) -> bool | None:
    """True when `resource` is patient `patient_id`'s on the server at `fhir_base`; False when it is someone
    else's or no one's although its type is always someone's (a Condition without a subject, a subject given only
    as an identifier or a display, the same id on another server); None when its type is shared (a Medication, a
    Practitioner) and it names no patient, so it is kept only as what the chart refers to.

    A Patient belongs when its id is `patient_id`. A malformed resource (no resourceType) belongs to nobody."""
    kind = resource.get("resourceType")
    if not isinstance(kind, str):
        return False
    if kind == "Patient":
        return resource.get("id") == patient_id
    if is_shared(resource):
        return None
    references = list(_references(resource, COMPARTMENT.get(kind) or NAMES_PATIENT_IF_SET.get(kind, _GENERIC)))
    ours = [r for r in references if names_patient(r, patient_id, fhir_base)]
    if not ours:
        return False
    if kind in MANY_PEOPLE:
        return True
    # a single-valued element given as a list, or a second element, naming another patient: whose is it? not ours
    return not any(_is_patient_reference(r) and not names_patient(r, patient_id, fhir_base) for r in references)


def is_shared(resource: Mapping[str, Any]) -> bool:
    """Whether the resource belongs to nobody: its type is outside the Patient compartment (a Medication, a
    Practitioner) and it names no patient either (a Device's `patient`, a Binary's `securityContext`)."""
    kind = resource.get("resourceType")
    if not isinstance(kind, str) or kind == "Patient" or kind in COMPARTMENT:
        return False
    return not any(_is_patient_reference(r) for r in _references(resource, NAMES_PATIENT_IF_SET.get(kind, _GENERIC)))


def names_nobody(resource: Mapping[str, Any]) -> bool:
    """Whether a resource of a compartment type leaves every element that says whose it is empty (an eCR
    reportability Observation, a converter's Encounter without `subject`): `belongs_to` is False for it, as for
    someone else's, but unlike someone else's it may be taken in where this patient's own resources refer to it
    (a chart does: ehr.pull). A reference by identifier or display only is someone, not nobody."""
    kind = resource.get("resourceType")
    if not isinstance(kind, str) or kind not in COMPARTMENT:
        return False
    return not any((isinstance(r, Mapping) and any(k in r for k in ("reference", "identifier", "display")))
                   or isinstance(r, str) for r in _references(resource, COMPARTMENT[kind]))


def names_patient(reference: Any, patient_id: str, fhir_base: str) -> bool:
    """Whether a Reference element (or a bare reference string) resolves to `Patient/<patient_id>` on the server
    at `fhir_base`: relative, versioned, or absolute on that base. An identifier or a display alone, a contained
    (`#x`) or `urn:` reference, and another server's URL do not."""
    return bool(patient_id) and _local_patient(reference, fhir_base) == patient_id


def named_patients(resource: Mapping[str, Any], fhir_base: str) -> set[str]:
    """The ids of this server's patients that the elements saying whose `resource` is refer to: the candidates
    `belongs_to` decides between (a Bulk Data export groups its resources by them). A Patient names itself."""
    kind = resource.get("resourceType")
    if kind == "Patient":
        return {resource["id"]} if isinstance(resource.get("id"), str) else set()
    paths = COMPARTMENT.get(str(kind)) or NAMES_PATIENT_IF_SET.get(str(kind), _GENERIC)
    return {found for r in _references(resource, paths) if (found := _local_patient(r, fhir_base))}


def _local_patient(reference: Any, fhir_base: str) -> str | None:
    """The id of the patient a reference names on the server at `fhir_base`, else None."""
    value = reference.get("reference") if isinstance(reference, Mapping) else reference
    if not isinstance(value, str):
        return None
    value = value.strip()
    base = fhir_base.rstrip("/")
    if "://" in value:
        if not base or not value.startswith(base + "/"):
            return None
        value = value[len(base) + 1:]
    parts = value.split("/")
    if len(parts) == 4 and parts[2] == "_history" and parts[3]:
        parts = parts[:2]
    return parts[1] if len(parts) == 2 and parts[0] == "Patient" and parts[1] else None


def _is_patient_reference(reference: Any) -> bool:
    """A Reference that names some patient: by reference string, or by its `type` with only an identifier."""
    if not isinstance(reference, Mapping):
        return isinstance(reference, str) and _names_type(reference, "Patient")
    value = reference.get("reference")
    if isinstance(value, str):
        return _names_type(value, "Patient")
    return reference.get("type") == "Patient" or "identifier" in reference


def _names_type(reference: str, kind: str) -> bool:
    parts = reference.strip().split("/")
    return any(parts[i] == kind and parts[i + 1] for i in range(len(parts) - 1))


def _references(resource: Mapping[str, Any], paths: tuple[str, ...]) -> Iterator[Any]:
    """The values at each dotted path (lists walked at every step): the Reference elements that say whose it is."""
    for path in paths:
        values: list[Any] = [resource]
        for step in path.split("."):
            found: list[Any] = []
            for value in values:
                item = value.get(step) if isinstance(value, Mapping) else None
                found += item if isinstance(item, list) else [item] if item is not None else []
            values = found
        yield from values
