"""The chart a pull stores, and what it says of what the pull could not read.

A pulled chart is read by the same reader as a file of its resources (records.fhir.bundle), under the store's
patient id. Two things a file never has are then said on it, never left silent:

- records the server handed over that are not this patient's by the compartment rule (ehr.compartment): counted by
  type among the chart's skipped parts, and the face-sheet line of their kind says how many were not read;
- kinds of record the pull could not read whole (a kind the server cannot search by patient, one outside the
  token's granted scopes, a Bulk Data file refused or cut short, a record holding a NUL character): the face-sheet
  line they feed says so, an allergy line that would say none is recorded says instead that it is not known, and a
  kind without a line gets one. "No allergy recorded" over allergy records that were never read is the most
  dangerous thing a pull could store (issue 43).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from ebmrag.records.fhir.bundle import DEFAULT_STALE_AFTER, record_from_entries
from ebmrag.records.fhir.index import Entry
from ebmrag.records.fragment import Fragment, PatientRecord

Resource = Mapping[str, Any]

# the kinds whose absence a chart states (the face sheet: allergies, problems, medications, drug facts): one that
# could not be read is marked so, never left to read as "none"
WATCHED_TYPES = ("AllergyIntolerance", "Condition", "MedicationRequest", "MedicationStatement", "Observation")


def has_nul(value: Any) -> bool:
    """Whether a NUL character is anywhere in a resource, its keys included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def chart_record(resources: Iterable[Resource], patient: str, origin: str,
                 stale_after: timedelta = DEFAULT_STALE_AFTER) -> PatientRecord:
    """The chart of the pulled resources, read as a file of them would be, under the store's patient id."""
    entries = [Entry(r, "", f"{r['resourceType']}/{r['id']}") for r in sorted(resources, key=_key)]
    return as_patient(record_from_entries(entries, origin, stale_after=stale_after), patient)


def as_patient(record: PatientRecord, patient: str, dropped: Mapping[str, int] | None = None,
               unread: Mapping[str, str] | None = None) -> PatientRecord:
    """The record under the store's patient id (the server's `Patient/<id>` is not the store's key), with what
    the pull dropped as not this patient's, and the kinds of record it could not read (`unread`: type -> why),
    among its skipped parts and on the face-sheet lines they feed."""
    unread = unread or {}
    skipped = (*record.skipped, *dropped_parts(dropped or {}), *unread_parts(unread))
    fragments = [_flag_left_out(replace(f, patient_id=patient), dropped or {}) for f in record.fragments]
    fragments = _flag_unread(fragments, patient, unread)
    return PatientRecord(patient, tuple(fragments), record.origin, skipped, record.identifiers)


# The face sheet's lists and the resource types they are made of: a list built without some of its records must
# not read as the whole chart ("no allergy ... is recorded") when the server held records it could not attribute.
FACE_SHEET_TYPES = {"summary/allergies": ("AllergyIntolerance",), "summary/active-problems": ("Condition",),
                    "summary/active-medications": ("MedicationRequest", "MedicationStatement"),
                    "summary/drug-facts": ("Observation",), "summary/latest-results": ("Observation",)}
# A face-sheet line for a kind that could not be read at all, where the chart has none (problems, medications and
# drug facts have no line when there are none): (section, what the line is about)
_UNREAD_LINES = {"summary/allergies": ("Patient summary", "Allergy status"),
                 "summary/active-problems": ("Problem list > active summary", "Active problems"),
                 "summary/active-medications": ("Active medications", "Active medications"),
                 "summary/drug-facts": ("Patient summary", "Drug decision facts")}
_NONE_RECORDED = "Allergy status: no allergy or allergy statement is recorded"  # records.fhir.facts' words


def _flag_left_out(fragment: Fragment, dropped: Mapping[str, int]) -> Fragment:
    """The face-sheet line, with how many records of its kind the server handed over that were not read."""
    left_out = sum(dropped.get(kind, 0) for kind in FACE_SHEET_TYPES.get(fragment.id, ()) if kind != "Observation")
    if not left_out:
        return fragment
    records = f"{left_out} more record{'s' if left_out > 1 else ''} of this kind on the FHIR server that do not name " \
              "this patient by reference"
    if fragment.text.startswith(_NONE_RECORDED):  # "none recorded" over allergy records not read: not known
        return replace(fragment, text=f"Allergy status: not known. Not read: {records}; this chart does not say "
                                      "whether the patient has an allergy (it is not a statement that there is none).")
    return replace(fragment, text=f"{fragment.text} Not read: {records}; the chart may hold more than this line says.")


def _flag_unread(fragments: list[Fragment], patient: str, unread: Mapping[str, str]) -> list[Fragment]:
    """Each face-sheet line whose kinds were not (all) read says so; an allergy line that would say none is
    recorded says instead that it is not known; a kind with no line gets one. The absence of what could not be
    read is never stated (issue 43: a redirect stored as "no allergy recorded")."""
    if not unread:
        return fragments
    newest = max((f.timestamp for f in fragments if f.timestamp and not f.date_in_future), default=None)
    for line, kinds in FACE_SHEET_TYPES.items():
        missing = [k for k in kinds if k in unread]
        if not missing:
            continue
        said = "; ".join(f"{k} records {unread[k]}" for k in missing)
        at = next((n for n, f in enumerate(fragments) if f.id == line), None)
        if at is not None:
            old = fragments[at]
            if old.text.startswith(_NONE_RECORDED):
                text = (f"Allergy status: not known. {said}: this chart does not say whether the patient has an "
                        "allergy (it is not a statement that there is none).")
            else:
                text = f"{old.text} Not read from the FHIR server: {said}; the chart may hold more than this line says."
            fragments[at] = replace(old, text=text)
        elif line in _UNREAD_LINES:
            section, about = _UNREAD_LINES[line]
            text = (f"{about}: not known. {said}: this chart does not say what they hold (it is not a statement "
                    "that there are none).")
            fragments.insert(0, Fragment(line, patient, text, section, newest, source="fhir"))
    return fragments


def unread_parts(unread: Mapping[str, str]) -> tuple[str, ...]:
    """The skipped-part lines of the kinds of record that could not be read."""
    return tuple(f"{kind}: not read from the FHIR server ({why}); the chart may lack its records"
                 for kind, why in sorted(unread.items()))


def dropped_parts(dropped: Mapping[str, int]) -> tuple[str, ...]:
    """The skipped-part lines of resources a server handed over that are not this patient's."""
    return tuple(f"{kind} x{count}: not this patient's (another patient's, named by identifier or display only, "
                 f"on another server, or naming no patient); not kept" for kind, count in sorted(dropped.items()))


def _key(resource: Resource) -> tuple[str, str]:
    return str(resource["resourceType"]), str(resource["id"])
