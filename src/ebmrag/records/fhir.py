"""FHIR R4 Bundle -> one patient's fragments, as an EHR export holds them.

The Bundle is validated with `fhir.resources.R4B` (an optional extra); statuses that the library lets
through are checked here. Each clinical resource becomes one or more fragments (`fhir_resources`): a
note attachment one per section (`fhir_notes`), a lab panel one line with its results' values. The
section names the resource type and status ("Problem list > resolved", "Clinical note > allergies"),
so the tier rules decide from data, not from guessing at text. Resources are linked to their
Encounter (the packer's current encounter); the Patient's age and sex become one must-keep line. A
Bundle that mixes patients is rejected: one record, one patient. Everything not packed (billing
resources, retractions, a panel's member results, duplicate notes) is counted in `record.skipped`,
which the trace shows: never silently.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.records.fhir_resources import (
    BundleIndex,
    Rendered,
    Resource,
    Skip,
    allergy,
    care_plan,
    condition,
    document,
    encounter,
    imaging_study,
    immunization,
    medication,
    observation,
    procedure,
    report,
    text_of,
    value_of,
)
from ebmrag.records.fragment import Fragment, PatientRecord, parse_timestamp

log = logging.getLogger(__name__)

_OBSERVATION_STATUS = {
    "registered",
    "preliminary",
    "final",
    "amended",
    "corrected",
    "cancelled",
    "entered-in-error",
    "unknown",
}
# Billing, workflow and directory resources: not clinical evidence; counted in the trace, never packed.
_ADMINISTRATIVE = {
    "Claim", "ExplanationOfBenefit", "Coverage", "Provenance", "CareTeam", "SupplyDelivery", "Organization",
    "Practitioner", "PractitionerRole", "Location", "Device", "Account", "Invoice", "PaymentNotice",
    "AuditEvent", "Consent", "Group", "Endpoint", "HealthcareService", "Medication",
}
Renderer = Callable[[Resource, BundleIndex], Sequence[Rendered] | Skip]
_RENDERERS: dict[str, tuple[Renderer, str, tuple[str, ...]]] = {
    "AllergyIntolerance": (allergy, "patient", ("recordedDate", "onsetDateTime")),
    "Condition": (condition, "subject", ("onsetDateTime", "recordedDate")),
    "Observation": (observation, "subject", ("effectiveDateTime", "issued")),
    "DiagnosticReport": (report, "subject", ("effectiveDateTime", "issued")),
    "DocumentReference": (document, "subject", ("date",)),
    "Procedure": (procedure, "subject", ("performedDateTime",)),
    "ImagingStudy": (imaging_study, "subject", ("started",)),
    "MedicationRequest": (medication("MedicationRequest"), "subject", ("authoredOn",)),
    "MedicationStatement": (medication("MedicationStatement"), "subject", ("effectiveDateTime", "dateAsserted")),
    "MedicationAdministration": (medication("MedicationAdministration"), "subject", ("effectiveDateTime",)),
    "Immunization": (immunization, "patient", ("occurrenceDateTime",)),
    "CarePlan": (care_plan, "subject", ("created",)),
    "Encounter": (encounter, "subject", ()),
}


def _validate(bundle: Mapping[str, Any], origin: str) -> None:
    try:
        from fhir.resources.R4B.bundle import Bundle
    except ImportError as exc:
        raise RecordError(origin, "reading FHIR needs the fhir extra: pip install 'ebmrag[fhir]'") from exc
    try:
        Bundle.model_validate(dict(bundle))
    except Exception as exc:  # pydantic's ValidationError lists every failing field path
        raise RecordError(origin, f"not a valid FHIR R4 Bundle: {exc}") from None


def _patient_aliases(bundle: Mapping[str, Any], origin: str) -> dict[str, str]:
    """Reference -> the patient it names. A Patient is identified by its Bundle entry (fullUrl), not by its
    bare id: two Patient resources sharing an id (from two servers, or without fullUrls) are two people,
    and a record naming both is refused, with both entries named, rather than merged into one."""
    aliases: dict[str, str] = {}
    seen: dict[str, tuple[int, str]] = {}  # "Patient/<id>" -> (entry index, fullUrl)
    for index, entry in enumerate(bundle.get("entry") or []):
        resource = entry.get("resource") or {}
        if resource.get("resourceType") != "Patient" or not resource.get("id"):
            continue
        relative, full_url = f"Patient/{resource['id']}", str(entry.get("fullUrl") or "")
        if relative in seen:
            first, first_url = seen[relative]
            raise RecordError(origin, f"entry[{first}] ({first_url or 'no fullUrl'}) and entry[{index}] "
                                      f"({full_url or 'no fullUrl'}) are two Patient resources with id "
                                      f"{resource['id']!r}: a reference to {relative} could mean either; "
                                      "one record must hold exactly one patient")
        seen[relative] = (index, full_url)
        aliases[relative] = relative
        if full_url:
            aliases[full_url] = relative
    return aliases


def _index(bundle: Mapping[str, Any]) -> tuple[BundleIndex, dict[str, str]]:
    """Every resource under "Type/id" and its fullUrl; encounter references mapped to "Encounter/<id>"; the
    Observations that a report lists as its results (read into that report, not packed twice)."""
    index, encounters = BundleIndex(), {}
    for entry in bundle.get("entry") or []:
        resource = entry.get("resource") or {}
        kind, rid = resource.get("resourceType"), resource.get("id")
        names = [f"{kind}/{rid}"] if rid else []
        names += [str(entry["fullUrl"])] if entry.get("fullUrl") else []
        for name in names:
            index.resources[name] = resource
            if kind == "Encounter" and rid:
                encounters[name] = f"Encounter/{rid}"
    for resource in index.resources.values():
        if resource.get("resourceType") == "DiagnosticReport":
            for ref in resource.get("result") or []:
                member = index.resolve(ref)
                if member is not None and member.get("resourceType") == "Observation":
                    index.in_panel.add(id(member))
    return index, encounters


def _stamp(resource: Resource, part: Rendered, time_keys: Sequence[str], where: str) -> datetime | None:
    if part.timestamp:
        return parse_timestamp(str(part.timestamp), where)
    key = next((k for k in time_keys if resource.get(k)), None)
    return parse_timestamp(str(resource[key]), f"{where}.{key}") if key else None


def _encounter_of(resource: Resource, encounters: Mapping[str, str]) -> str | None:
    if resource.get("resourceType") == "Encounter" and resource.get("id"):
        return f"Encounter/{resource['id']}"
    link = resource.get("encounter") or resource.get("context")
    reference = link.get("reference") if isinstance(link, Mapping) else None
    return encounters.get(str(reference), str(reference)) if reference else None


def _identifiers(patient: Resource | None) -> tuple[tuple[str, str], ...]:
    """What identifies the person (name, MRN and other identifiers, birth date, address, telecom): never
    packed as such, kept so everything sent to an outside model can be redacted (generate.redact)."""
    if patient is None:
        return ()
    found: list[tuple[str, str]] = []
    for name in patient.get("name") or []:
        parts = [*(name.get("prefix") or []), *(name.get("given") or []), name.get("family") or ""]
        found += [("name", str(p)) for p in (name.get("text"), " ".join(str(x) for x in parts if x).strip(),
                                             *(name.get("given") or []), name.get("family")) if p]
    found += [("id", str(i["value"])) for i in patient.get("identifier") or [] if i.get("value")]
    found += [("birth_date", str(patient["birthDate"]))] if patient.get("birthDate") else []
    for address in patient.get("address") or []:
        found += [("address", str(v)) for v in (*(address.get("line") or []), address.get("city"),
                                                address.get("postalCode")) if v]
    found += [("contact", str(t["value"])) for t in patient.get("telecom") or [] if t.get("value")]
    return tuple(dict.fromkeys(found))


def _demographics(patient: Resource | None, subject: str, fragments: Sequence[Fragment]) -> Fragment | None:
    """Age and sex as one must-keep line ("Patient summary" in the tier rules), dated with the newest
    fragment so its age is the age at the time of the question."""
    if patient is None:
        return None
    sex = str(patient.get("gender") or "")
    newest = max((f.timestamp for f in fragments if f.timestamp), default=None)
    born = str(patient.get("birthDate") or "")
    deceased = str(patient.get("deceasedDateTime") or "")
    age = ""
    if len(born) >= 10 and (newest or deceased):
        birth = date.fromisoformat(born[:10])
        until = date.fromisoformat(deceased[:10]) if deceased else newest.date() if newest else birth
        years = until.year - birth.year - ((until.month, until.day) < (birth.month, birth.day))
        age = f"{years}-year-old"
    if not (sex or age):
        return None
    words = " ".join(w for w in (age, sex or "sex not recorded") if w)
    extra = f" (born {born[:10]}" + (f", died {deceased[:10]}" if deceased else "") + ")" if born else ""
    return Fragment(f"Patient/{patient.get('id') or 'patient'}", subject, f"Patient: {words}{extra}.",
                    "Patient summary", newest, source="fhir")


def _summaries(subject: str, fragments: Sequence[Fragment]) -> list[Fragment]:
    """One line each for the active problem list and the active medications (drug names, no strengths):
    must-keep in the tier rules, so even a small window knows what the patient has and takes; the dated
    entries stay too, with onset, dose and indication."""
    newest = max((f.timestamp for f in fragments if f.timestamp), default=None)
    lists = (("summary/active-problems", "Problem list > active summary", "Active problems",
              [f for f in fragments if f.section == "Problem list > active"], "Active problem: "),
             ("summary/active-medications", "Active medications", "Active medications",
              [f for f in fragments if (f.section or "").endswith("> active") and f.section != "Problem list > active"],
              ""))
    summaries = [_allergy_status(subject, fragments, newest)]
    for fid, section, title, items, prefix in lists:
        if len(items) < 2:
            continue
        names = list(dict.fromkeys(_item_name(f.text, prefix) for f in items))
        summaries.append(Fragment(fid, subject, f"{title} ({len(names)}): {'; '.join(names)}.", section, newest,
                                  source="fhir"))
    return summaries


def _allergy_status(subject: str, fragments: Sequence[Fragment], newest: datetime | None) -> Fragment:
    """The allergy banner: the recorded allergies, else what the newest note says, else that nothing is
    recorded (which is not "no known allergies", and a drug question must know the difference)."""
    recorded = [f.text.rstrip(".") for f in fragments if f.section == "Allergy"]
    noted = [f for f in fragments if f.timestamp and (f.section or "").lower() == "clinical note > allergies"]
    if recorded:
        text = f"Allergies ({len(recorded)}): " + "; ".join(r.removeprefix("Allergy to ") for r in recorded) + "."
    elif noted:
        latest = max(noted, key=lambda f: f.timestamp or datetime.min)
        stamp = latest.timestamp.date().isoformat() if latest.timestamp else "undated"
        text = f"Allergy status (clinical note of {stamp}): {latest.text}"
    else:
        text = "Allergy status: no allergy or allergy statement is recorded in this chart."
    return Fragment("summary/allergies", subject, text, "Patient summary", newest, source="fhir")


# The results a drug, dose or kidney question turns on, by the start of their display name (any coding).
_KEY_RESULTS = (("creatinine", r"creatinine(?! ?(clearance|ratio)|.*ratio)"),
                ("eGFR", r"(estimated )?glomerular filtration"), ("potassium", r"potassium"), ("sodium", r"sodium"),
                ("hemoglobin", r"hemoglobin(?! ?a1c)(?!.*a1c)"),
                ("platelets", r"platelets"), ("INR", r"inr\b|international normali[sz]ed ratio"),
                ("HbA1c", r"hemoglobin a1c|hba1c"), ("ALT", r"alanine aminotransferase|alt\b"),
                ("AST", r"aspartate aminotransferase|ast\b"))


def _latest_results(subject: str, index: BundleIndex) -> Fragment | None:
    """One line with the newest value of each key result, dated: a ten-year-old creatinine still belongs in a
    drug question's context, and one line costs less than the panels it comes from."""
    newest: dict[str, tuple[datetime, str]] = {}
    for resource in {id(r): r for r in index.resources.values()}.values():
        if resource.get("resourceType") != "Observation" or resource.get("status") == "entered-in-error":
            continue
        name, stamp = text_of(resource.get("code")), resource.get("effectiveDateTime") or resource.get("issued")
        value = resource.get("valueQuantity")
        if not (name and stamp and value):
            continue
        label = next((label for label, pattern in _KEY_RESULTS if re.match(pattern, name, re.IGNORECASE)), None)
        when = parse_timestamp(str(stamp), "Observation.effectiveDateTime")
        if label and when and (label not in newest or when > newest[label][0]):
            newest[label] = (when, f"{label} {value_of(resource)}")
    if not newest:
        return None
    by_date: dict[str, list[str]] = {}
    for label, _ in _KEY_RESULTS:
        if label in newest:
            when, value = newest[label]
            by_date.setdefault(when.date().isoformat(), []).append(value)
    groups = [f"{'; '.join(values)} ({day})" for day, values in sorted(by_date.items(), reverse=True)]
    return Fragment("summary/latest-results", subject, "Latest results: " + "; ".join(groups) + ".",
                    "Latest results", max(when for when, _ in newest.values()), source="fhir")


def _item_name(text: str, prefix: str) -> str:
    """'Active problem: Hypertension (since 2002-11-05).' -> 'Hypertension'; a medication line keeps the drug."""
    body = text.removeprefix(prefix).rstrip(".")
    if prefix:
        return re.sub(r" \((?:since|unconfirmed)[^)]*\)$", "", body)
    body = re.sub(r"^Medication (?:order|statement|administration): ", "", body)
    drug = re.split(r" \((?:active|on-hold|intended)", body)[0]
    drug = re.sub(r"^\d+(?:\.\d+)?\s*(?:HR|ML|MG)\s+", "", drug, flags=re.IGNORECASE)  # "24 HR metoprolol ..."
    return re.split(r"\s\d+(?:\.\d+)?\s*(?:MG|ML|MCG|UNT|G|%|MEQ|IU)\b", drug, flags=re.IGNORECASE)[0].strip(" ,")


def record_from_fhir_bundle(bundle: Mapping[str, Any], origin: str) -> PatientRecord:
    _validate(bundle, origin)
    aliases = _patient_aliases(bundle, origin)  # a reference may use the fullUrl (urn:uuid:...) or "Patient/<id>"
    patients = set(aliases.values())
    index, encounters = _index(bundle)
    fragments: list[tuple[str, Fragment]] = []
    unused: Counter[str] = Counter()
    patient: Resource | None = None
    for position, entry in enumerate(bundle.get("entry") or []):
        resource = entry.get("resource") or {}
        kind = str(resource.get("resourceType"))
        if kind == "Patient":
            patient = resource
            continue
        if kind not in _RENDERERS:
            unused[f"{kind}: " + ("billing or administrative, not clinical evidence" if kind in _ADMINISTRATIVE
                                  else "resource type not used for packing")] += 1
            continue
        fragments += _fragments(resource, position, origin, aliases, index, encounters, unused)
    subjects = {s for s, _ in fragments} | patients
    if len(subjects) != 1:
        raise RecordError(
            origin,
            f"the Bundle refers to {len(subjects)} patients ({sorted(subjects)}); "
            "one record must hold exactly one patient",
        )
    if not fragments:
        raise RecordError(origin, "the Bundle holds no supported clinical resource")
    subject = subjects.pop()
    found = [f for _, f in fragments]
    summary = [f for f in (_demographics(patient, subject, found), *_summaries(subject, found),
                           _latest_results(subject, index)) if f]
    skipped = tuple(f"{kind.split(': ')[0]} x{n}: {kind.split(': ', 1)[1]}" for kind, n in sorted(unused.items()))
    for note in skipped:
        log.info("%s: %s", origin, note)
    return PatientRecord(subject, tuple(summary) + tuple(found), origin, skipped, _identifiers(patient))


def _fragments(resource: Resource, position: int, origin: str, aliases: Mapping[str, str], index: BundleIndex,
               encounters: Mapping[str, str], unused: Counter[str]) -> list[tuple[str, Fragment]]:
    kind = str(resource.get("resourceType"))
    where = f"{origin}: entry[{position}] ({kind})"
    status = resource.get("status")
    if kind == "Observation" and status not in _OBSERVATION_STATUS:
        raise RecordError(f"{where}.status", f"{status!r} is not an Observation status")
    if status == "entered-in-error":
        unused[f"{kind}: refuted or entered in error"] += 1
        return []
    render, subject_key, time_keys = _RENDERERS[kind]
    subject = (resource.get(subject_key) or {}).get("reference")
    if not subject:
        raise RecordError(f"{where}.{subject_key}", "has no patient reference")
    subject = aliases.get(subject, subject)
    rendered = render(resource, index)
    if isinstance(rendered, Skip):
        unused[f"{kind}: {rendered.reason}"] += 1
        return []
    base = f"{kind}/{resource.get('id') or position}"
    visit = _encounter_of(resource, encounters)
    return [(subject, Fragment(base + part.id_suffix, subject, part.text, part.section,
                               _stamp(resource, part, time_keys, where), source="fhir", encounter=visit))
            for part in rendered]
