"""What a resource lacks or gets wrong against the base specification, said per resource for the trace.

Nothing here refuses anything: the renderers read what is there. A reader of the trace learns which
resource was read without its status, its code or its patient, so a surprising context can be traced to
the export that caused it. Checked: the elements the base specification requires of the resources that
become evidence, the status codes whose meaning the reader relies on, and the JSON shape of the elements
the result renderers read (fhir.shapes: an element of the wrong shape is passed over, and said so).
"""

from __future__ import annotations

from ebmrag.records.fhir.index import Resource
from ebmrag.records.fhir.shapes import shape_problems

# Required elements (R4 cardinality 1..1 or 1..*) of the resources that become fragments.
_REQUIRED = {
    "Observation": ("status", "code"),
    "DiagnosticReport": ("status", "code"),
    "MedicationRequest": ("status", "intent", "subject"),
    "MedicationStatement": ("status", "subject"),
    "MedicationAdministration": ("status", "subject"),
    "AllergyIntolerance": ("patient",),
    "FamilyMemberHistory": ("status", "patient", "relationship"),
    "Condition": ("subject",),
    "Procedure": ("status", "subject"),
    "Immunization": ("status", "vaccineCode", "patient"),
    "DocumentReference": ("status", "content"),
}
_STATUSES = {
    "Observation": {"registered", "preliminary", "final", "amended", "corrected", "cancelled", "entered-in-error",
                    "unknown"},
    "DiagnosticReport": {"registered", "partial", "preliminary", "final", "amended", "corrected", "appended",
                         "cancelled", "entered-in-error", "unknown"},
    "MedicationRequest": {"active", "on-hold", "cancelled", "completed", "entered-in-error", "stopped", "draft",
                          "unknown"},
    "MedicationStatement": {"active", "completed", "entered-in-error", "intended", "stopped", "on-hold", "unknown",
                            "not-taken"},
}


def defects(resource: Resource) -> list[str]:
    """"no status (required); read without it", "status 'done' is not a MedicationRequest status", ..."""
    kind = str(resource.get("resourceType"))
    found = [f"no {element} (required); read without it" for element in _REQUIRED.get(kind, ())
             if resource.get(element) in (None, "", [], {})]
    status = resource.get("status")
    if kind in _STATUSES and status not in (None, "") and (not isinstance(status, str)
                                                           or status not in _STATUSES[kind]):
        found.append(f"status {str(status)[:20]!r} is not a status of {kind}; read as recorded")
    found += [f"{element}; passed over" for problem in shape_problems(resource)
              if not (element := problem.split(".", 1)[1]).startswith("status ")]  # status: said above
    return found
