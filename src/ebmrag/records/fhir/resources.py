"""One FHIR R4 resource -> the fragments a clinician would read from it, or the reason it yields none.

Each renderer takes the resource and the chart's index (to resolve references: a panel's results, a
medication's name, a contained Medication) and returns `Rendered` parts, or a `Skip` naming why nothing
is packed. Sections are chosen so the tier rules (evidence/rules/tiers.toml) decide by resource type,
category and status, never by a word that happens to occur in a display name. Renderers read what a
resource does say: an element of the wrong shape is passed over (the caller reports a resource that
cannot be read at all), dates keep the precision the chart wrote, and statements of absence ("no known
allergy") set a status instead of becoming an allergy (vocab/absent.toml).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.records.attachments import attachment_text
from ebmrag.records.dates import as_written
from ebmrag.records.fhir.coding import concepts, obj, objects, states_absence, text_of, without_semantic_tags
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.notes import note_sections, slug

_REPORT_CATEGORY = {
    "PAT": "Pathology report", "SP": "Pathology report", "CP": "Pathology report", "RAD": "Imaging report",
    "LAB": "Laboratory report", "GE": "Genetics report", "EC": "ECG report", "CUS": "Ultrasound report",
    "CT": "Imaging report", "MB": "Microbiology report",
}
_OBSERVATION_CATEGORY = {
    "laboratory": "Laboratory", "vital-signs": "Vital signs", "exam": "Physical exam", "imaging": "Imaging",
    "procedure": "Procedure", "survey": "Patient history", "social-history": "Social history",
}
_RESOLVED = {"resolved", "inactive", "remission"}
_RETRACTED = {"refuted", "entered-in-error"}
# Antimicrobial susceptibility (HL7 ObservationInterpretation): a panel says S/I/R, a reader wants words.
_SUSCEPTIBILITY = {"S": "susceptible", "I": "intermediate", "R": "resistant", "SDD": "susceptible-dose dependent",
                   "NS": "non-susceptible", "SYN-R": "synergy resistant", "SYN-S": "synergy susceptible"}
_SAYS_ALLERGY = re.compile(r"\b(allerg|intoleran|hypersensitiv|unverträglich|overgevoelig)", re.IGNORECASE)
_ALLERGY_CATEGORY = {"medication": "Drug", "food": "Food", "environment": "Environmental", "biologic": "Biologic"}


@dataclass(frozen=True)
class Rendered:
    section: str
    text: str
    id_suffix: str = ""  # "#allergies" for one section of a note
    timestamp: str | None = None  # overrides the resource's default time keys


@dataclass(frozen=True)
class Skip:
    reason: str  # "refuted or entered in error", ... (counted per resource type in the trace)


def _code(concept: Any) -> str:
    return next((str(c.get("code")) for c in objects(obj(concept).get("coding")) if c.get("code")), "")


def _codes(items: Any) -> list[str]:
    return [str(c.get("code")) for concept in concepts(items) for c in objects(concept.get("coding")) if c.get("code")]


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _quantity(q: Any) -> str:
    q = obj(q)
    if q.get("value") is None:
        return ""
    unit = q.get("unit") or q.get("code") or ""
    return f"{q.get('comparator', '')}{_number(q['value'])} {unit if isinstance(unit, str) else ''}".strip()


def value_of(resource: Resource) -> str:
    """An Observation's (or component's) value[x], whatever its type, as a reader would say it."""
    if "valueQuantity" in resource:
        return _quantity(resource["valueQuantity"])
    if "valueCodeableConcept" in resource:
        return text_of(resource["valueCodeableConcept"])
    if isinstance(low_high := resource.get("valueRange"), Mapping):
        return "-".join(q for q in (_quantity(low_high.get("low")), _quantity(low_high.get("high"))) if q)
    if isinstance(ratio := resource.get("valueRatio"), Mapping):
        return f"{_quantity(ratio.get('numerator'))}/{_quantity(ratio.get('denominator'))}"
    if isinstance(period := resource.get("valuePeriod"), Mapping):
        return " to ".join(as_written(period.get(k)) for k in ("start", "end") if period.get(k))
    for key in ("valueString", "valueBoolean", "valueInteger", "valueDateTime", "valueTime"):
        value = resource.get(key)
        if isinstance(value, (str, int, float, bool)) and value != "":
            return as_written(value) if key == "valueDateTime" else _number(value)
    return ""


def _interpretation(r: Resource) -> str:
    words = [_SUSCEPTIBILITY.get(_code(c).upper()) or text_of(c) for c in concepts(r.get("interpretation"))]
    return ", ".join(w for w in words if w)


def _susceptibility(r: Resource) -> str:
    """'resistant' when the interpretation is a susceptibility (S/I/R), the result such a panel reports."""
    words = [_SUSCEPTIBILITY[code] for concept in concepts(r.get("interpretation"))
             if (code := _code(concept).upper()) in _SUSCEPTIBILITY]
    return ", ".join(words)


def _measurement(r: Resource, index: ChartIndex) -> str:
    """'1.2 mg/dL (flag high)', a blood pressure's components, a susceptibility ('resistant'), the members of an
    Observation panel, or '' when nothing was measured."""
    value = value_of(r)
    components = ", ".join(f"{text_of(c.get('code')) or 'component'} {v}" for c in objects(r.get("component"))
                           if (v := value_of(c) or _susceptibility(c)))
    members = [f"{text_of(m.get('code')) or 'result'} {v}" for link in objects(r.get("hasMember"))
               if (m := index.resolve(link)) is not None and (v := _measurement(m, index))]
    flags = _interpretation(r)
    measured = value or components or "; ".join(members)
    if not measured:
        return _susceptibility(r)  # a susceptibility given only as its interpretation: "resistant"
    ranges = "; ".join(str(rr.get("text") or "-".join(_quantity(rr.get(k)) for k in ("low", "high")))
                       for rr in objects(r.get("referenceRange")))
    return measured + (f" ({flags})" if flags and flags.lower() not in measured.lower() else "") \
        + (f" (reference {ranges})" if ranges.strip("- ") else "")


def _allergen(r: Resource) -> str:
    """The substance: `code`, else the reactions' `substance` (C-CDA conversions put it only there)."""
    named = text_of(r.get("code"))
    if named:
        return named
    substances = dict.fromkeys(text_of(reaction.get("substance")) for reaction in objects(r.get("reaction")))
    return ", ".join(s for s in substances if s)


def allergy(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A drug, food or other allergy in one short line ("Drug allergy to penicillin G (high criticality:
    hives); since 2007"), which the face sheet repeats verbatim so the two collapse into one when packed;
    "no known allergy" codes become an allergy status, never an allergy."""
    verification = _code(r.get("verificationStatus"))
    if verification in _RETRACTED:
        return Skip("refuted or entered in error")
    if states_absence(r.get("code"), "allergy"):
        return [Rendered("Allergy status", f"Allergy status: {text_of(r.get('code'))}.")]
    categories = r.get("category") if isinstance(r.get("category"), list) else []
    category = next((_ALLERGY_CATEGORY[c] for c in categories if isinstance(c, str) and c in _ALLERGY_CATEGORY), "")
    allergen = _allergen(r) or "unspecified substance"
    kind = "intolerance" if r.get("type") == "intolerance" else "allergy"
    if _SAYS_ALLERGY.search(allergen):  # SNOMED names the disorder: "Intolerance to lactose", "Allergy to egg"
        head = f"{allergen} ({category.lower()})" if category else allergen
    else:
        head = f"{category + ' ' + kind if category else kind.capitalize()} to {allergen}"
    reactions = objects(r.get("reaction"))
    said = ", ".join(dict.fromkeys(t for reaction in reactions for m in concepts(reaction.get("manifestation"))
                                   if (t := text_of(m))))
    status = [s for s in (_code(r.get("clinicalStatus")), verification) if s in ("inactive", "resolved", "unconfirmed")]
    bits = [*status, "high criticality" if r.get("criticality") == "high" else "",
            "severe reaction" if any(x.get("severity") == "severe" for x in reactions) else ""]
    detail = ", ".join(b for b in bits if b)
    detail += (": " if detail and said else "") + said
    onset = as_written(r.get("onsetDateTime")) or as_written(obj(r.get("onsetPeriod")).get("start"))
    text = head + (f" ({detail})" if detail else "") + (f"; since {onset}" if onset else "")
    return [Rendered("Allergy" + (f" > {category.lower()}" if category else ""), text + ".")]


def condition(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """Active problems stand (no decay); resolved ones are dated by their abatement and weigh less; refuted
    and entered-in-error diagnoses are never packed; "no current problems" is a status, not a problem."""
    if _code(r.get("verificationStatus")) in _RETRACTED:
        return Skip("refuted or entered in error")
    name, clinical = text_of(r.get("code")) or "unnamed condition", _code(r.get("clinicalStatus"))
    if states_absence(r.get("code"), "problem"):
        return [Rendered("Problem list > status", f"Problem list: {name}.")]
    onset = as_written(r.get("onsetDateTime")) or as_written(obj(r.get("onsetPeriod")).get("start")) \
        or as_written(r.get("recordedDate"))
    ended = as_written(r.get("abatementDateTime")) or as_written(obj(r.get("abatementPeriod")).get("end"))
    if clinical in _RESOLVED or (not clinical and ended):
        when = ", ".join(w for w in (f"since {onset}" if onset else "", f"resolved {ended}" if ended else "") if w)
        return [Rendered("Problem list > resolved", f"Resolved problem: {name}" + (f" ({when})" if when else "") + ".",
                         timestamp=r.get("abatementDateTime") or r.get("onsetDateTime") or r.get("recordedDate"))]
    notes = [n for n in ("unconfirmed" if _code(r.get("verificationStatus")) in ("unconfirmed", "provisional")
                         else "", "clinical status not recorded" if not clinical else "",
                         f"since {onset}" if onset else "") if n]
    return [Rendered("Problem list > active", f"Active problem: {name}" + (f" ({', '.join(notes)})" if notes else "")
                     + ".")]


def observation(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if id(r) in index.in_panel:
        return Skip("read as part of their panel (DiagnosticReport or Observation.hasMember)")
    codes = _codes(r.get("category"))
    section = next((_OBSERVATION_CATEGORY[c] for c in codes if c in _OBSERVATION_CATEGORY), "Observation")
    absent = text_of(r.get("dataAbsentReason"))
    measured = _measurement(r, index) or "no value recorded" + (f" ({absent})" if absent else "")
    specimen = index.resolve(r.get("specimen"))
    where = f" ({text_of(specimen.get('type'))})" if specimen is not None and text_of(specimen.get("type")) else ""
    return [Rendered(section, f"{text_of(r.get('code')) or 'Unnamed observation'}{where}: {measured}.")]


def report(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A report's conclusion, its results (each with its analyte: a susceptibility panel names the organism,
    drug and S/I/R) and its note."""
    codes = _codes(r.get("category"))
    section = next((_REPORT_CATEGORY[c] for c in codes if c in _REPORT_CATEGORY), "Diagnostic report")
    name = text_of(r.get("code")) or "Report"
    parts: list[Rendered] = []
    conclusion = r.get("conclusion") if isinstance(r.get("conclusion"), str) else ""
    conclusion = conclusion or ", ".join(text_of(c) for c in concepts(r.get("conclusionCode")))
    members = [(text_of(o.get("code")) or "result", m) for ref in objects(r.get("result"))
               if (o := index.resolve(ref)) is not None and (m := _measurement(o, index))]
    names, shared = _without_shared_suffix([n for n, _ in members])
    if shared:
        name = f"{name} ({shared.strip()})"
    results = [f"{n} {m}" for n, (_, m) in zip(names, members, strict=True)]
    if results or conclusion:
        body = "; ".join(results) + (". " if results and conclusion else "") + (f"Conclusion: {conclusion}"
                                                                                 if conclusion else "")
        parts.append(Rendered(section, f"{name}: {body}."))
    parts += _notes(objects(r.get("presentedForm")), index)
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


def document(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") == "entered-in-error" or r.get("docStatus") == "entered-in-error":
        return Skip("refuted or entered in error")
    attachments = [obj(c.get("attachment")) for c in objects(r.get("content"))]
    parts = _notes(attachments, index)
    if parts:
        return parts
    unread = [why for a in attachments if (why := attachment_text(a)[1])]
    if attachments and not unread:
        return Skip("the same note as another report or section (read once)")
    return Skip(unread[0] if unread else "no attachment")


def _notes(attachments: Sequence[Mapping[str, Any]], index: ChartIndex) -> list[Rendered]:
    parts: list[Rendered] = []
    for attachment in attachments:
        text, _ = attachment_text(attachment)
        whole = " ".join((text or "").split())
        if not whole or whole in index.notes_seen:
            continue
        for section in note_sections(text or ""):
            heading = section.heading or "note"
            parts.append(Rendered(f"Clinical note > {heading}", without_semantic_tags(section.text),
                                  f"#{slug(heading)}"))
        index.notes_seen.add(whole)
    return parts


def procedure(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") in ("entered-in-error", "not-done"):
        return Skip("not done or entered in error")
    if states_absence(r.get("code"), "procedure"):
        return [Rendered("Procedure", f"Procedures: {text_of(r.get('code'))}.")]
    outcome = text_of(r.get("outcome"))
    reason = ", ".join(t for c in concepts(r.get("reasonCode")) if (t := text_of(c)))
    performed = r.get("performedDateTime") or obj(r.get("performedPeriod")).get("start")
    when = as_written(performed)
    return [Rendered("Procedure", f"Procedure: {text_of(r.get('code')) or 'unnamed procedure'}"
                     + (f" ({when})" if when else "") + (f"; reason: {reason}" if reason else "")
                     + (f"; outcome: {outcome}" if outcome else "") + ".", timestamp=performed)]


def imaging_study(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    modalities = ", ".join(str(m.get("code", "")) for m in objects(r.get("modality")))
    description = r.get("description") if isinstance(r.get("description"), str) else ""
    description = description or "; ".join(str(s.get("description", "")) for s in objects(r.get("series")))
    return [Rendered("Imaging study", f"Imaging study ({modalities or 'modality not stated'}): {description}".strip()
                     + ".")]


def drug_name(r: Resource, index: ChartIndex) -> str:
    """The drug of a medication resource: its concept, else the referenced or contained Medication, else the
    reference's display."""
    if r.get("medicationCodeableConcept"):
        return text_of(r["medicationCodeableConcept"])
    reference = obj(r.get("medicationReference"))
    medication = index.resolve(reference, within=r)
    named = text_of(medication.get("code")) if medication is not None else ""
    if not named and medication is not None:  # a compounded Medication lists its ingredients
        named = " + ".join(t for i in objects(medication.get("ingredient"))
                           if (t := text_of(i.get("itemCodeableConcept"))))
    display = reference.get("display")
    return named or (display if isinstance(display, str) else "") or "unnamed medication"


def _dose(r: Resource) -> str:
    """Dose and route: the dosage text, else its structured dose, route and timing."""
    dosages = r.get("dosageInstruction") or r.get("dosage") or []
    said = []
    for dosage in [dosages] if isinstance(dosages, Mapping) else objects(dosages):
        if isinstance(dosage.get("text"), str):
            said.append(dosage["text"])
            continue
        dose = next((_quantity(d.get("doseQuantity")) for d in objects(dosage.get("doseAndRate"))), "") \
            or _quantity(dosage.get("dose"))
        repeat = obj(obj(dosage.get("timing")).get("repeat"))
        every = f"{repeat.get('frequency', 1)} per {repeat.get('period')} {repeat.get('periodUnit', '')}".strip() \
            if repeat.get("period") else ""
        said.append(" ".join(w for w in (dose, text_of(dosage.get("route")), every) if w))
    return "; ".join(s for s in said if s)


def medication(kind: str) -> Callable[[Resource, ChartIndex], Sequence[Rendered] | Skip]:
    """MedicationRequest (an order), MedicationStatement (what the patient takes) or MedicationAdministration
    (a dose given). Whether it is current comes from reconciliation (fhir.medications), not its status alone."""
    label = {"MedicationRequest": "Medication order", "MedicationStatement": "Medication statement",
             "MedicationAdministration": "Medication administration"}[kind]

    def render(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
        if r.get("status") == "entered-in-error":
            return Skip("refuted or entered in error")
        if states_absence(r.get("medicationCodeableConcept"), "medication"):
            return [Rendered("Medication status", f"Medications: {text_of(r['medicationCodeableConcept'])}.")]
        state, why = index.medication_state.get(id(r), ("not active", ""))
        recorded = ", ".join(str(r[k]) for k in ("status", "intent") if isinstance(r.get(k), str))
        reasons = [text_of(c) for c in concepts(r.get("reasonCode"))]
        reasons += [text_of(found.get("code")) for ref in objects(r.get("reasonReference"))
                    if (found := index.resolve(ref)) is not None]
        reason = ", ".join(dict.fromkeys(x for x in reasons if x))
        dose, start = _dose(r), started(r)
        text = f"{label}: {drug_name(r, index)}" + (f" ({recorded or 'status not recorded'})") \
            + (f" since {as_written(start)}" if as_written(start) else "") + (f" for {reason}" if reason else "") \
            + (f"; {dose}" if dose else "") + (f"; {why}" if why else "") + "."
        return [Rendered(f"{label} > {state}", text, timestamp=start if isinstance(start, str) else None)]
    return render


def started(r: Resource) -> Any:
    """When a medication record starts or was made: order date, effective start, assertion date."""
    period = obj(r.get("effectivePeriod"))
    return r.get("authoredOn") or r.get("effectiveDateTime") or period.get("start") or r.get("dateAsserted")


def immunization(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") in ("entered-in-error", "not-done"):
        return Skip("not done or entered in error")
    if states_absence(r.get("vaccineCode"), "immunization"):
        return [Rendered("Immunization", f"Immunizations: {text_of(r.get('vaccineCode'))}.")]
    when = as_written(r.get("occurrenceDateTime"))
    return [Rendered("Immunization", f"Immunization: {text_of(r.get('vaccineCode')) or 'vaccine not named'}"
                     + (f" ({when})" if when else "") + ".", timestamp=r.get("occurrenceDateTime"))]


def care_plan(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") in ("entered-in-error", "revoked"):
        return Skip("revoked or entered in error")
    names = ", ".join(t for c in concepts(r.get("category")) if (t := text_of(c)) and t != "assess-plan")
    activities = ", ".join(t for a in objects(r.get("activity")) if (t := text_of(obj(a.get("detail")).get("code"))))
    status = r.get("status") if isinstance(r.get("status"), str) else "status unknown"
    if not names and not activities:
        return Skip("names neither a category nor an activity")
    return [Rendered("Care plan", f"Care plan: {names or 'unnamed'} ({status})"
                     + (f"; activities: {activities}" if activities else "") + ".",
                     timestamp=obj(r.get("period")).get("start"))]


def encounter(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A visit is a fragment only when it says why it happened; otherwise it just groups its resources."""
    reasons = ", ".join(t for c in concepts(r.get("reasonCode")) if (t := text_of(c)))
    if not reasons:
        return Skip("groups its resources by visit (no reason recorded)")
    kind = ", ".join(t for t in (str(obj(r.get("class")).get("code") or ""),
                                 *(text_of(t) for t in concepts(r.get("type")))) if t)
    return [Rendered("Encounter", f"Visit ({kind or 'type not stated'}): reason {reasons}.",
                     timestamp=obj(r.get("period")).get("start"))]


def flag(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A chart banner ("Shellfish free diet", "Falls risk"): short, and meant to be seen."""
    if r.get("status") in ("inactive", "entered-in-error"):
        return Skip("inactive or entered in error")
    return [Rendered("Alert", f"Alert: {text_of(r.get('code')) or 'unnamed flag'}.",
                     timestamp=obj(r.get("period")).get("start"))]


def summary_of(r: Resource) -> str:
    """What can still be said of a resource no renderer could read: its type, its main concept, its status.
    Used so a defect elsewhere in an allergy still leaves the allergen named."""
    kind = str(r.get("resourceType"))
    concept = next((text_of(r.get(k)) for k in ("code", "medicationCodeableConcept", "vaccineCode")
                    if text_of(r.get(k))), "")
    if kind == "AllergyIntolerance":
        concept = concept or ", ".join(t for x in objects(r.get("reaction")) if (t := text_of(x.get("substance"))))
        return f"Allergy to {concept} (recorded in a form that could be read only in part)." if concept else ""
    status = r.get("status") if isinstance(r.get("status"), str) else ""
    label = re.sub(r"(?<!^)(?=[A-Z])", " ", kind).lower()
    return f"{label.capitalize()}: {concept}" + (f" ({status})" if status else "") + \
        " (read only in part)." if concept else ""
