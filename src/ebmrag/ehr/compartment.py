"""Whose resource it is: the FHIR Patient compartment of every version, read strictly, for what a server hands over.

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

The elements (rules/ehr/compartment.toml, which names its sources and each path's versions) are those of the Patient
compartments of FHIR DSTU2, STU3, R4 and R5, as element paths rather than search parameters, limited to the ones
that name whose record it is (`Observation.subject`, not `Observation.performer`: a patient may perform another
patient's measurement, which is still the other patient's). A type is read by the union of its versions' paths,
since a resource rarely says its version: a DSTU2 MedicationOrder or MedicationStatement names its patient in
`patient`, an R4 one in `subject` (and an R5 DetectedIssue in `subject`, not R4's `patient`); read by R4's table
alone, a DSTU2 MedicationStatement named nobody, so another patient's could be taken in as this one's (issue 43).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ebmrag.rules import rule_file

__all__ = ["Compartment", "belongs_to", "compartment", "is_shared", "named_patients", "names_nobody", "names_patient"]

_VERSIONS = frozenset({"DSTU2", "STU3", "R4", "R5"})
_ELEMENT_PATH = re.compile(r"[a-z][A-Za-z]*(\.[a-z][A-Za-z]*)*")


@dataclass(frozen=True)
class Compartment:
    """`types`: resource type -> the element paths (dotted; lists walked) that say whose the resource is, in any FHIR
    version; `names_patient_if_set`: shared types that may still name a patient; `many_people`: types whose elements
    name several people by design."""

    types: Mapping[str, tuple[str, ...]]
    names_patient_if_set: Mapping[str, tuple[str, ...]]
    many_people: frozenset[str]


@rule_file("ehr/compartment.toml")
def compartment(table: Mapping[str, Any]) -> Compartment:
    """The table, checked when the rules are (start-up): a misspelt path would match nothing, and a resource of its
    type would then name nobody, the wrong reading a missing path gave (issue 43)."""
    paths, if_set = _paths(table["types"]), _paths(table["names_patient_if_set"])
    many = frozenset(table["many_people"]["types"])
    if stray := sorted((many - paths.keys()) | (paths.keys() & if_set.keys())):
        raise ValueError(f"{stray}: a many_people type must be in [types], and no type may be both in [types] and "
                         "in [names_patient_if_set]")
    return Compartment(paths, if_set, many)


def _paths(section: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """resource type -> its element paths, from `Type = { "path" = ["R4", ...] }` (the versions are for a reader)."""
    for kind, elements in section.items():
        for path, versions in elements.items():
            if not _ELEMENT_PATH.fullmatch(path) or not versions or not set(versions) <= _VERSIONS:
                raise ValueError(f"{kind} {path!r} = {versions!r}: a dotted element name and a non-empty list of "
                                 f"{sorted(_VERSIONS)} are expected")
    return {kind: tuple(elements) for kind, elements in section.items()}

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
    table = compartment()
    references = list(_references(resource, table.types.get(kind) or table.names_patient_if_set.get(kind, _GENERIC)))
    ours = [r for r in references if names_patient(r, patient_id, fhir_base)]
    if not ours:
        return False
    if kind in table.many_people:
        return True
    # a single-valued element given as a list, or a second element, naming another patient: whose is it? not ours
    return not any(_is_patient_reference(r) and not names_patient(r, patient_id, fhir_base) for r in references)


def is_shared(resource: Mapping[str, Any]) -> bool:
    """Whether the resource belongs to nobody: its type is outside the Patient compartment (a Medication, a
    Practitioner) and it names no patient either (a Device's `patient`, a Binary's `securityContext`)."""
    kind = resource.get("resourceType")
    table = compartment()
    if not isinstance(kind, str) or kind == "Patient" or kind in table.types:
        return False
    return not any(_is_patient_reference(r) for r in _references(resource,
                                                                  table.names_patient_if_set.get(kind, _GENERIC)))


def names_nobody(resource: Mapping[str, Any]) -> bool:
    """Whether a resource of a compartment type leaves every element that says whose it is empty (an eCR
    reportability Observation, a converter's Encounter without `subject`): `belongs_to` is False for it, as for
    someone else's, but unlike someone else's it may be taken in where this patient's own resources refer to it
    (a chart does: ehr.pull). A reference by identifier or display only is someone, not nobody."""
    kind = resource.get("resourceType")
    types = compartment().types
    if not isinstance(kind, str) or kind not in types:
        return False
    return not any((isinstance(r, Mapping) and any(k in r for k in ("reference", "identifier", "display")))
                   or isinstance(r, str) for r in _references(resource, types[kind]))


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
    table = compartment()
    paths = table.types.get(str(kind)) or table.names_patient_if_set.get(str(kind), _GENERIC)
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
