"""FHIR R4 Bundle -> patient fragments (AllergyIntolerance, Condition, Observation, DiagnosticReport,
Procedure, ImagingStudy).

The Bundle is validated with `fhir.resources.R4B` (an optional extra); statuses that the library lets
through are checked here. Each supported resource becomes one fragment whose section names the
resource type and category, so the tier rules see "Allergy" or "Pathology report" rather than
guessing from text. A Bundle that mixes patients is rejected: one record, one patient. Resources
marked entered-in-error are retractions and are skipped with a log line; unsupported resource types
are skipped with a log line too, never silently.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.evidence.fragment import Fragment, PatientRecord, parse_timestamp

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
_REPORT_CATEGORY = {
    "PAT": "Pathology report",
    "SP": "Pathology report",
    "CP": "Pathology report",
    "RAD": "Imaging report",
    "LAB": "Laboratory report",
    "GE": "Genetics report",
    "EC": "ECG report",
    "CUS": "Ultrasound report",
    "CT": "Imaging report",
}
_OBSERVATION_CATEGORY = {
    "laboratory": "Laboratory",
    "vital-signs": "Vital signs",
    "exam": "Physical exam",
    "imaging": "Imaging",
    "procedure": "Procedure",
    "survey": "Patient history",
    "social-history": "Social history",
}


def _text(concept: Any) -> str:
    """CodeableConcept -> its text, else the first coding's display or code."""
    if not isinstance(concept, Mapping):
        return ""
    if concept.get("text"):
        return str(concept["text"])
    for coding in concept.get("coding") or []:
        if coding.get("display") or coding.get("code"):
            return str(coding.get("display") or coding.get("code"))
    return ""


def _codes(concepts: Any) -> list[str]:
    return [str(c.get("code")) for concept in concepts or [] for c in concept.get("coding") or [] if c.get("code")]


def _value(resource: Mapping[str, Any]) -> str:
    if "valueQuantity" in resource:
        q = resource["valueQuantity"]
        return f"{q.get('comparator', '')}{q.get('value')} {q.get('unit') or q.get('code') or ''}".strip()
    for key in ("valueString", "valueBoolean", "valueInteger"):
        if key in resource:
            return str(resource[key])
    return _text(resource.get("valueCodeableConcept"))


def _allergy(r: Mapping[str, Any]) -> tuple[str, str]:
    reactions = "; ".join(
        ", ".join(_text(m) for m in reaction.get("manifestation") or [])
        + (f" ({reaction['severity']})" if reaction.get("severity") else "")
        for reaction in r.get("reaction") or []
    )
    parts = [f"Allergy to {_text(r.get('code')) or 'unspecified substance'}"]
    if r.get("criticality"):
        parts.append(f"criticality {r['criticality']}")
    if reactions:
        parts.append(f"reaction: {reactions}")
    return "Allergy", "; ".join(parts) + "."


def _condition(r: Mapping[str, Any]) -> tuple[str, str]:
    status = _text(r.get("clinicalStatus"))
    return "Diagnosis", f"Diagnosis: {_text(r.get('code'))}" + (f" ({status})" if status else "") + "."


def _observation(r: Mapping[str, Any]) -> tuple[str, str]:
    codes = _codes(r.get("category"))
    section = next((_OBSERVATION_CATEGORY[c] for c in codes if c in _OBSERVATION_CATEGORY), "Observation")
    text = f"{_text(r.get('code'))}: {_value(r) or 'no value recorded'}"
    flags = ", ".join(_text(i) for i in r.get("interpretation") or [] if _text(i))
    ranges = "; ".join(
        rr.get("text") or f"{rr.get('low', {}).get('value', '')}-{rr.get('high', {}).get('value', '')}"
        for rr in r.get("referenceRange") or []
    )
    components = "; ".join(f"{_text(c.get('code'))}: {_value(c)}" for c in r.get("component") or [])
    for extra, label in ((flags, "flag"), (ranges, "reference"), (components, "")):
        if extra:
            text += f" ({label + ' ' if label else ''}{extra})"
    return section, text + "."


def _report(r: Mapping[str, Any]) -> tuple[str, str]:
    codes = _codes(r.get("category"))
    section = next((_REPORT_CATEGORY[c] for c in codes if c in _REPORT_CATEGORY), "Diagnostic report")
    conclusion = r.get("conclusion") or ", ".join(_text(c) for c in r.get("conclusionCode") or [])
    return section, f"{_text(r.get('code'))}: {conclusion or 'no conclusion recorded'}".strip() + "."


def _procedure(r: Mapping[str, Any]) -> tuple[str, str]:
    outcome = _text(r.get("outcome"))
    return "Procedure", f"Procedure: {_text(r.get('code'))}" + (f"; outcome: {outcome}" if outcome else "") + "."


def _imaging_study(r: Mapping[str, Any]) -> tuple[str, str]:
    modalities = ", ".join(m.get("code", "") for m in r.get("modality") or [])
    description = r.get("description") or "; ".join(s.get("description", "") for s in r.get("series") or [])
    return "Imaging study", f"Imaging study ({modalities or 'modality not stated'}): {description}".strip() + "."


def _medication(kind: str) -> Callable[[Mapping[str, Any]], tuple[str, str]]:
    """MedicationRequest (an order: what the patient is meant to take) or MedicationStatement (what the patient
    says they take); a current warfarin order is exactly what a safe-antibiotic question needs."""
    def render(r: Mapping[str, Any]) -> tuple[str, str]:
        drug = _text(r.get("medicationCodeableConcept")) or str((r.get("medicationReference") or {}).get("display")
                                                                 or "unnamed medication")
        state = ", ".join(str(r[k]) for k in ("status", "intent") if r.get(k))
        dosages = r.get("dosageInstruction") or r.get("dosage") or []
        dose = "; ".join(str(d.get("text")) for d in dosages if d.get("text"))
        label = "Medication order" if kind == "MedicationRequest" else "Medication statement"
        return label, f"{label}: {drug}" + (f" ({state})" if state else "") + (f"; {dose}" if dose else "") + "."
    return render


_RENDERERS = {
    "AllergyIntolerance": (_allergy, "patient", ("recordedDate", "onsetDateTime")),
    "Condition": (_condition, "subject", ("recordedDate", "onsetDateTime")),
    "Observation": (_observation, "subject", ("effectiveDateTime", "issued")),
    "DiagnosticReport": (_report, "subject", ("effectiveDateTime", "issued")),
    "Procedure": (_procedure, "subject", ("performedDateTime",)),
    "ImagingStudy": (_imaging_study, "subject", ("started",)),
    "MedicationRequest": (_medication("MedicationRequest"), "subject", ("authoredOn",)),
    "MedicationStatement": (_medication("MedicationStatement"), "subject", ("effectiveDateTime", "dateAsserted")),
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


def record_from_fhir_bundle(bundle: Mapping[str, Any], origin: str) -> PatientRecord:
    _validate(bundle, origin)
    aliases = _patient_aliases(bundle, origin)  # a reference may use the fullUrl (urn:uuid:...) or "Patient/<id>"
    patients = set(aliases.values())
    fragments: list[tuple[str, Fragment]] = []
    unused: Counter[str] = Counter()
    for index, entry in enumerate(bundle.get("entry") or []):
        resource = entry.get("resource") or {}
        kind = resource.get("resourceType")
        where = f"{origin}: entry[{index}] ({kind})"
        if kind == "Patient":
            continue
        if kind not in _RENDERERS:
            unused[str(kind)] += 1
            continue
        status = resource.get("status") or resource.get("verificationStatus", {}).get("coding", [{}])[0].get("code")
        if kind == "Observation" and status not in _OBSERVATION_STATUS:
            raise RecordError(f"{where}.status", f"{status!r} is not an Observation status")
        if status == "entered-in-error":
            log.warning("%s: entered-in-error, skipped", where)
            continue
        render, subject_key, time_keys = _RENDERERS[kind]
        subject = (resource.get(subject_key) or {}).get("reference")
        if not subject:
            raise RecordError(f"{where}.{subject_key}", "has no patient reference")
        subject = aliases.get(subject, subject)
        section, text = render(resource)
        stamp_key = next((k for k in time_keys if resource.get(k)), None)
        stamp = parse_timestamp(str(resource[stamp_key]), f"{where}.{stamp_key}") if stamp_key else None
        fragment_id = f"{kind}/{resource.get('id') or index}"
        encounter = (resource.get("encounter") or {}).get("reference") if isinstance(resource.get("encounter"),
                                                                                       dict) else None
        fragments.append((subject, Fragment(fragment_id, subject, text, section, stamp, source="fhir",
                                            encounter=encounter)))
    subjects = {s for s, _ in fragments} | patients
    if len(subjects) != 1:
        raise RecordError(
            origin,
            f"the Bundle refers to {len(subjects)} patients ({sorted(subjects)}); "
            "one record must hold exactly one patient",
        )
    if not fragments:
        raise RecordError(origin, "the Bundle holds no supported clinical resource")
    skipped = tuple(f"{kind} x{n}: resource type not used for packing" for kind, n in sorted(unused.items()))
    for note in skipped:
        log.warning("%s: %s", origin, note)
    return PatientRecord(subjects.pop(), tuple(f for _, f in fragments), origin, skipped)
