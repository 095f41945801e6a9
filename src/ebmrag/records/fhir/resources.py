"""One clinical FHIR resource (allergy, problem, medication, procedure, immunization, care plan, visit,
flag) -> the fragments a clinician would read from it, or the reason it yields none; results and reports
are in fhir.results.

Each renderer takes the resource and the chart's index (to resolve references: a medication's name, a
contained Medication) and returns `Rendered` parts, or a `Skip` naming why nothing is packed. Sections
are chosen so the tier rules (rules/evidence/tiers.toml) decide by resource type, category and status,
never by a word that happens to occur in a display name. Renderers read what a resource does say: an
element of the wrong shape is passed over (the caller reports a resource that cannot be read at all),
dates keep the precision the chart wrote, and statements of absence ("no known allergy") set a status
instead of becoming an allergy (rules/records/absent.toml).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ebmrag.records.codes import text_table
from ebmrag.records.dates import as_written
from ebmrag.records.fhir.chart_facts import RETRACTED, status_of, taken_back
from ebmrag.records.fhir.coding import concepts, obj, objects, states_absence, strings, text_of
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.rendered import Rendered, Skip, status_code
from ebmrag.records.fhir.results import quantity
from ebmrag.rules import rule_file

_RESOLVED = {"resolved", "inactive", "remission"}

_SAYS_ALLERGY = re.compile(r"\b(allerg|intoleran|hypersensitiv|unverträglich|overgevoelig)", re.IGNORECASE)


@rule_file("records/fhir.toml")
def _allergy_categories(raw: Mapping[str, Any]) -> dict[str, str]:
    """fhir.toml [allergy_category]: AllergyIntolerance.category -> the word its line opens with."""
    return text_table(raw.get("allergy_category"), "allergy_category")


def onset_of(r: Resource) -> str:
    """onset[x] as written: a (partial) date, a period's start, an age ("age 40") or the chart's words."""
    age = obj(r.get("onsetAge"))
    said = r.get("onsetString")
    return (as_written(r.get("onsetDateTime")) or as_written(obj(r.get("onsetPeriod")).get("start"))
            or (f"age {quantity(age)}" if age.get("value") is not None else "")
            or (said.strip()[:60] if isinstance(said, str) else ""))


def family_history(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """"Family history: mother: breast cancer (onset age 45 a)": a relative's conditions, for risk questions."""
    if r.get("status") in ("entered-in-error", "health-unknown"):
        return Skip("entered in error or health unknown")
    who = text_of(r.get("relationship")) or "relative"
    conditions = "; ".join(text_of(c.get("code")) + (f" (onset {onset_of(c)})" if onset_of(c) else "")
                           for c in objects(r.get("condition")) if text_of(c.get("code")))
    if not conditions:
        return Skip("names no condition")
    return [Rendered("Family history", f"Family history: {who}: {conditions}.", timestamp=r.get("date"))]


def _allergen(r: Resource) -> str:
    """The substance: `code` (DSTU2: `substance`), else the reactions' `substance` (C-CDA conversions put it
    only there)."""
    named = text_of(r.get("code")) or text_of(r.get("substance"))
    if named:
        return named
    substances = dict.fromkeys(text_of(reaction.get("substance")) for reaction in objects(r.get("reaction")))
    return ", ".join(s for s in substances if s)


def allergy(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A drug, food or other allergy in one short line ("Drug allergy to penicillin G (high criticality:
    hives); since 2007"), which the face sheet repeats verbatim so the two collapse into one when packed;
    "no known allergy" codes become an allergy status, never an allergy."""
    verification = status_of(r.get("verificationStatus"))  # the code, or its words where a code belongs
    if verification in RETRACTED:
        return Skip("refuted or entered in error")
    if states_absence(r.get("code"), "allergy"):
        return [Rendered("Allergy status", f"Allergy status: {text_of(r.get('code'))}.")]
    if taken_back(r):  # "Not allergic to penicillin": what the chart states, not an allergy
        return [Rendered("Allergy status", f"Allergy status: {_allergen(r)}.")]
    words = _allergy_categories()
    category = next((words[c] for c in strings(r.get("category")) if c in words), "")
    allergen = _allergen(r) or "unspecified substance"
    kind = "intolerance" if status_code(r.get("type")) == "intolerance" else "allergy"  # R5 codes `type` as a concept
    if _SAYS_ALLERGY.search(allergen):  # SNOMED names the disorder: "Intolerance to lactose", "Allergy to egg"
        head = f"{allergen} ({category.lower()})" if category else allergen
    else:
        head = f"{category + ' ' + kind if category else kind.capitalize()} to {allergen}"
    reactions = objects(r.get("reaction"))
    said = ", ".join(dict.fromkeys(t for reaction in reactions for m in concepts(reaction.get("manifestation"))
                                   if (t := text_of(m) or text_of(m.get("concept")))))  # R5: CodeableReference
    status = [s for s in (status_of(r.get("clinicalStatus")), verification)
              if s in ("inactive", "resolved", "unconfirmed")]
    bits = [*status, "high criticality" if r.get("criticality") == "high" else "",
            "severe reaction" if any(x.get("severity") == "severe" for x in reactions) else ""]
    detail = ", ".join(b for b in bits if b)
    detail += (": " if detail and said else "") + said
    onset = onset_of(r)
    text = head + (f" ({detail})" if detail else "") + (f"; since {onset}" if onset else "")
    return [Rendered("Allergy" + (f" > {category.lower()}" if category else ""), text + ".")]


def condition(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """Active problems stand (no decay); resolved ones are dated by their abatement and weigh less; refuted
    and entered-in-error diagnoses are never packed; "no current problems" is a status, not a problem."""
    if status_code(r.get("verificationStatus")) in RETRACTED:
        return Skip("refuted or entered in error")
    name, clinical = text_of(r.get("code")) or "unnamed condition", status_code(r.get("clinicalStatus"))
    if states_absence(r.get("code"), "problem"):
        return [Rendered("Problem list > status", f"Problem list: {name}.")]
    onset = onset_of(r) or as_written(r.get("recordedDate"))
    ended = as_written(r.get("abatementDateTime")) or as_written(obj(r.get("abatementPeriod")).get("end"))
    if clinical in _RESOLVED or (not clinical and ended):
        when = ", ".join(w for w in (f"since {onset}" if onset else "", f"resolved {ended}" if ended else "") if w)
        return [Rendered("Problem list > resolved", f"Resolved problem: {name}" + (f" ({when})" if when else "") + ".",
                         timestamp=r.get("abatementDateTime") or r.get("onsetDateTime") or r.get("recordedDate"))]
    notes = [n for n in ("unconfirmed" if status_code(r.get("verificationStatus")) in ("unconfirmed", "provisional")
                         else "", "clinical status not recorded" if not clinical else "",
                         f"since {onset}" if onset else "") if n]
    return [Rendered("Problem list > active", f"Active problem: {name}" + (f" ({', '.join(notes)})" if notes else "")
                     + ".")]


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


def drug_name(r: Resource, index: ChartIndex) -> str:
    """The drug of a medication resource: its concept, else the referenced or contained Medication, else the
    reference's display."""
    if text_of(r.get("medicationCodeableConcept")):
        return text_of(r["medicationCodeableConcept"])
    if isinstance(r.get("medication"), Mapping):  # R5 CodeableReference: {"concept": ..., "reference": ...}
        concept = text_of(r["medication"].get("concept"))
        if concept:
            return concept
        r = {**r, "medicationReference": r["medication"].get("reference")}
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
        dose = next((quantity(d.get("doseQuantity")) for d in objects(dosage.get("doseAndRate"))), "") \
            or quantity(dosage.get("dose"))
        repeat = obj(obj(dosage.get("timing")).get("repeat"))
        every = f"{repeat.get('frequency', 1)} per {repeat.get('period')} {repeat.get('periodUnit', '')}".strip() \
            if repeat.get("period") else ""
        said.append(" ".join(w for w in (dose, text_of(dosage.get("route")), every) if w))
    return "; ".join(s for s in said if s)


def medication(kind: str) -> Callable[[Resource, ChartIndex], Sequence[Rendered] | Skip]:
    """MedicationRequest (an order), MedicationStatement (what the patient takes) or MedicationAdministration
    (a dose given). Whether it is current comes from reconciliation (fhir.medications), not its status alone."""
    label = {"MedicationRequest": "Medication order", "MedicationOrder": "Medication order",
             "MedicationStatement": "Medication statement",
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
    return r.get("authoredOn") or r.get("dateWritten") or r.get("effectiveDateTime") or period.get("start") \
        or r.get("dateAsserted")


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
