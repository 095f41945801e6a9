"""One FHIR R4 resource -> the fragments a clinician would read from it, or the reason it yields none.

Each renderer takes the resource and the Bundle's index (to resolve references: a panel's results, a
medication's name) and returns `Rendered` parts, or a `Skip` naming why nothing is packed. Sections are
chosen so the tier rules (rules/tiers.toml) can decide by resource type and status, never by a word
that happens to occur in a display name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ebmrag.records.fhir_notes import attachment_text, note_sections, slug

Resource = Mapping[str, Any]

_REPORT_CATEGORY = {
    "PAT": "Pathology report", "SP": "Pathology report", "CP": "Pathology report", "RAD": "Imaging report",
    "LAB": "Laboratory report", "GE": "Genetics report", "EC": "ECG report", "CUS": "Ultrasound report",
    "CT": "Imaging report",
}
_OBSERVATION_CATEGORY = {
    "laboratory": "Laboratory", "vital-signs": "Vital signs", "exam": "Physical exam", "imaging": "Imaging",
    "procedure": "Procedure", "survey": "Patient history", "social-history": "Social history",
}
_SEMANTIC_TAG = re.compile(r"\s+\((?:disorder|finding|situation|procedure|qualifier value|physical object|"
                           r"record artifact|regime/therapy|observable entity|morphologic abnormality|"
                           r"clinical drug|substance|event|body structure)\)")
_RESOLVED = {"resolved", "inactive", "remission"}
ACTIVE_MEDICATION = {"active", "on-hold", "intended"}  # MedicationRequest / MedicationStatement statuses
_RETRACTED = {"refuted", "entered-in-error"}


@dataclass(frozen=True)
class Rendered:
    section: str
    text: str
    id_suffix: str = ""  # "#allergies" for one section of a note
    timestamp: str | None = None  # overrides the resource's default time keys


@dataclass(frozen=True)
class Skip:
    reason: str  # "refuted or entered in error", ... (counted per resource type in the trace)


@dataclass
class BundleIndex:
    """References -> resources ("Type/id" and fullUrl both resolve), plus what one resource consumed of others."""

    resources: dict[str, Resource] = field(default_factory=dict)
    in_panel: set[int] = field(default_factory=set)  # id() of Observations a panel reads
    notes_seen: set[str] = field(default_factory=set)  # note texts already read (DiagnosticReport = DocumentReference)

    def resolve(self, reference: Any) -> Resource | None:
        return self.resources.get(str(reference.get("reference"))) if isinstance(reference, Mapping) else None


def text_of(concept: Any) -> str:
    """CodeableConcept -> its text, else the first coding's display or code; SNOMED's semantic tags
    ("(disorder)", "(finding)") are dropped: they cost tokens and tell a reader nothing."""
    if not isinstance(concept, Mapping):
        return ""
    if concept.get("text"):
        return _SEMANTIC_TAG.sub("", str(concept["text"]))
    for coding in concept.get("coding") or []:
        if coding.get("display") or coding.get("code"):
            return _SEMANTIC_TAG.sub("", str(coding.get("display") or coding.get("code")))
    return ""


def code_of(concept: Any) -> str:
    codings = concept.get("coding") if isinstance(concept, Mapping) else None
    return str((codings or [{}])[0].get("code") or "") if codings else ""


def _codes(concepts: Any) -> list[str]:
    return [str(c.get("code")) for concept in concepts or [] for c in concept.get("coding") or [] if c.get("code")]


def _quantity(q: Mapping[str, Any]) -> str:
    value = q.get("value")
    if isinstance(value, float):
        value = f"{value:.4g}"
    return f"{q.get('comparator', '')}{value} {q.get('unit') or q.get('code') or ''}".strip()


def value_of(resource: Resource) -> str:
    if "valueQuantity" in resource:
        return _quantity(resource["valueQuantity"])
    for key in ("valueString", "valueBoolean", "valueInteger", "valueDateTime"):
        if key in resource:
            return str(resource[key])
    return text_of(resource.get("valueCodeableConcept"))


def _flags(r: Resource) -> str:
    return ", ".join(t for i in r.get("interpretation") or [] if (t := text_of(i)))


def _measurement(r: Resource) -> str:
    """'Creatinine 1.2 mg/dL (flag high)', a blood pressure's components, or '' when nothing was measured."""
    value = value_of(r)
    components = ", ".join(f"{text_of(c.get('code'))} {v}" for c in r.get("component") or [] if (v := value_of(c)))
    measured = value or components
    if not measured:
        return ""
    flags = _flags(r)
    ranges = "; ".join(rr.get("text") or f"{rr.get('low', {}).get('value', '')}-{rr.get('high', {}).get('value', '')}"
                       for rr in r.get("referenceRange") or [])
    return measured + (f" (flag {flags})" if flags else "") + (f" (reference {ranges})" if ranges else "")


def allergy(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    verification = code_of(r.get("verificationStatus"))
    if verification in _RETRACTED:
        return Skip("refuted or entered in error")
    reactions = "; ".join(
        ", ".join(text_of(m) for m in reaction.get("manifestation") or [])
        + (f" ({reaction['severity']})" if reaction.get("severity") else "")
        for reaction in r.get("reaction") or []
    )
    parts = [f"Allergy to {text_of(r.get('code')) or 'unspecified substance'}"]
    status = [s for s in (code_of(r.get("clinicalStatus")), verification) if s in ("inactive", "resolved",
                                                                                    "unconfirmed")]
    if status:
        parts.append(" and ".join(status))
    if r.get("criticality"):
        parts.append(f"criticality {r['criticality']}")
    if reactions:
        parts.append(f"reaction: {reactions}")
    return [Rendered("Allergy", "; ".join(parts) + ".")]


def condition(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    """Active problems stand (no decay); resolved ones are dated by their abatement and weigh less; refuted
    and entered-in-error diagnoses are never packed."""
    if code_of(r.get("verificationStatus")) in _RETRACTED:
        return Skip("refuted or entered in error")
    name, clinical = text_of(r.get("code")) or "unnamed condition", code_of(r.get("clinicalStatus"))
    onset = str(r.get("onsetDateTime") or r.get("recordedDate") or "")[:10]
    if clinical in _RESOLVED:
        ended = str(r.get("abatementDateTime") or "")[:10]
        when = f" ({'since ' + onset if onset else ''}{', ' if onset and ended else ''}"\
               f"{'resolved ' + ended if ended else ''})" if onset or ended else ""
        return [Rendered("Problem list > resolved", f"Resolved problem: {name}{when}.",
                         timestamp=r.get("abatementDateTime") or r.get("onsetDateTime") or r.get("recordedDate"))]
    unconfirmed = " (unconfirmed)" if code_of(r.get("verificationStatus")) in ("unconfirmed", "provisional") else ""
    return [Rendered("Problem list > active", f"Active problem: {name}{unconfirmed}"
                     + (f" (since {onset})" if onset else "") + ".")]


def observation(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    if id(r) in index.in_panel:
        return Skip("read as part of their panel (DiagnosticReport)")
    codes = _codes(r.get("category"))
    section = next((_OBSERVATION_CATEGORY[c] for c in codes if c in _OBSERVATION_CATEGORY), "Observation")
    absent = text_of(r.get("dataAbsentReason"))
    measured = _measurement(r) or "no value recorded" + (f" ({absent})" if absent else "")
    return [Rendered(section, f"{text_of(r.get('code'))}: {measured}.")]


def report(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    """A report's conclusion, its results (a lab panel lists its Observations' values) and its note."""
    codes = _codes(r.get("category"))
    section = next((_REPORT_CATEGORY[c] for c in codes if c in _REPORT_CATEGORY), "Diagnostic report")
    name = text_of(r.get("code")) or "Report"
    parts: list[Rendered] = []
    conclusion = r.get("conclusion") or ", ".join(text_of(c) for c in r.get("conclusionCode") or [])
    members = [(text_of(o.get("code")), m) for ref in r.get("result") or []
               if (o := index.resolve(ref)) is not None and (m := _measurement(o))]
    names, shared = _without_shared_suffix([n for n, _ in members])
    if shared:
        name = f"{name} ({shared.strip()})"
    results = [f"{n} {m}" for n, (_, m) in zip(names, members, strict=True)]
    if results or conclusion:
        body = "; ".join(results) + (". " if results and conclusion else "") + (f"Conclusion: {conclusion}"
                                                                                 if conclusion else "")
        parts.append(Rendered(section, f"{name}: {body}."))
    parts += _notes(r.get("presentedForm") or [], index)
    return parts or Skip("no conclusion, results or readable note")


def _without_shared_suffix(names: Sequence[str], least: int = 20) -> tuple[list[str], str]:
    """A panel's result names often end alike ("... in Respiratory system specimen by NAA with probe
    detection"): say it once, after the panel's name, instead of once per result."""
    if len(names) < 2:
        return list(names), ""
    suffix = names[0]
    for name in names[1:]:
        while suffix and not name.endswith(suffix):
            suffix = suffix[1:]
    suffix = suffix[suffix.find(" "):] if " " in suffix else ""  # whole words only
    if len(suffix.strip()) < least or any(len(n) <= len(suffix) for n in names):
        return list(names), ""
    return [n[: len(n) - len(suffix)] for n in names], suffix


def document(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") == "entered-in-error" or r.get("docStatus") == "entered-in-error":
        return Skip("refuted or entered in error")
    attachments = [c.get("attachment") or {} for c in r.get("content") or []]
    parts = _notes(attachments, index)
    if parts:
        return parts
    return Skip("the same note as a DiagnosticReport (read once)" if attachments and all(
        (text := attachment_text(a)[0]) is not None and text.strip() in index.notes_seen for a in attachments)
                else "no readable note")


def _notes(attachments: Sequence[Mapping[str, Any]], index: BundleIndex) -> list[Rendered]:
    parts: list[Rendered] = []
    for attachment in attachments:
        text, _ = attachment_text(attachment)
        if text is None or not text.strip() or text.strip() in index.notes_seen:
            continue
        index.notes_seen.add(text.strip())
        for section in note_sections(text):
            heading = section.heading or "note"
            parts.append(Rendered(f"Clinical note > {heading}", _SEMANTIC_TAG.sub("", section.text),
                                  f"#{slug(heading)}"))
    return parts


def procedure(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") in ("entered-in-error", "not-done"):
        return Skip("not done or entered in error")
    outcome, reason = text_of(r.get("outcome")), ", ".join(text_of(c) for c in r.get("reasonCode") or [])
    return [Rendered("Procedure", f"Procedure: {text_of(r.get('code'))}" + (f"; reason: {reason}" if reason else "")
                     + (f"; outcome: {outcome}" if outcome else "") + ".",
                     timestamp=r.get("performedDateTime") or (r.get("performedPeriod") or {}).get("start"))]


def imaging_study(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    modalities = ", ".join(m.get("code", "") for m in r.get("modality") or [])
    description = r.get("description") or "; ".join(s.get("description", "") for s in r.get("series") or [])
    return [Rendered("Imaging study", f"Imaging study ({modalities or 'modality not stated'}): {description}".strip()
                     + ".")]


def _drug(r: Resource, index: BundleIndex) -> str:
    if r.get("medicationCodeableConcept"):
        return text_of(r["medicationCodeableConcept"])
    reference = r.get("medicationReference") or {}
    medication = index.resolve(reference)
    return (text_of(medication.get("code")) if medication else "") or str(reference.get("display")
                                                                         or "unnamed medication")


def medication(kind: str) -> Callable[[Resource, BundleIndex], Sequence[Rendered] | Skip]:
    """MedicationRequest (an order), MedicationStatement (what the patient takes) or MedicationAdministration
    (a dose given); a current warfarin order is exactly what a safe-antibiotic question needs."""
    label = {"MedicationRequest": "Medication order", "MedicationStatement": "Medication statement",
             "MedicationAdministration": "Medication administration"}[kind]

    def render(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
        if r.get("status") == "entered-in-error":
            return Skip("refuted or entered in error")
        state = ", ".join(str(r[k]) for k in ("status", "intent") if r.get(k))
        dosages = r.get("dosageInstruction") or r.get("dosage") or []
        if isinstance(dosages, Mapping):  # MedicationAdministration.dosage is one object
            dosages = [dosages]
        dose = "; ".join(str(d.get("text")) for d in dosages if d.get("text"))
        period = r.get("effectivePeriod") or {}
        reasons = [text_of(c) for c in r.get("reasonCode") or []]
        reasons += [text_of(found.get("code")) for ref in r.get("reasonReference") or []
                    if (found := index.resolve(ref)) is not None]
        why = ", ".join(dict.fromkeys(x for x in reasons if x))
        status = "active" if r.get("status") in ACTIVE_MEDICATION else "not active"
        return [Rendered(f"{label} > {status}", f"{label}: {_drug(r, index)}" + (f" ({state})" if state else "")
                         + (f" for {why}" if why else "") + (f"; {dose}" if dose else "") + ".",
                         timestamp=r.get("authoredOn") or r.get("effectiveDateTime") or period.get("start")
                         or r.get("dateAsserted"))]
    return render


def immunization(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") in ("entered-in-error", "not-done"):
        return Skip("not done or entered in error")
    return [Rendered("Immunization", f"Immunization: {text_of(r.get('vaccineCode'))}.",
                     timestamp=r.get("occurrenceDateTime"))]


def care_plan(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") in ("entered-in-error", "revoked"):
        return Skip("revoked or entered in error")
    names = ", ".join(text_of(c) for c in r.get("category") or [] if text_of(c) and text_of(c) != "assess-plan")
    activities = ", ".join(text_of(a.get("detail", {}).get("code")) for a in r.get("activity") or []
                           if text_of(a.get("detail", {}).get("code")))
    status = r.get("status") or "status unknown"
    return [Rendered("Care plan", f"Care plan: {names or 'unnamed'} ({status})"
                     + (f"; activities: {activities}" if activities else "") + ".",
                     timestamp=(r.get("period") or {}).get("start"))]


def encounter(r: Resource, index: BundleIndex) -> Sequence[Rendered] | Skip:
    """A visit is a fragment only when it says why it happened; otherwise it just groups its resources."""
    reasons = ", ".join(text_of(c) for c in r.get("reasonCode") or [] if text_of(c))
    if not reasons:
        return Skip("groups its resources by visit (no reason recorded)")
    kind = ", ".join(t for t in (str((r.get("class") or {}).get("code") or ""),
                                 *(text_of(t) for t in r.get("type") or [])) if t)
    return [Rendered("Encounter", f"Visit ({kind or 'type not stated'}): reason {reasons}.",
                     timestamp=(r.get("period") or {}).get("start"))]
