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
from ebmrag.records.fhir.coding import (
    codings,
    concepts,
    is_garbage,
    is_placeholder,
    names_nothing,
    notes,
    obj,
    objects,
    says_unknown,
    states_absence,
    strings,
    text_of,
)
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.rendered import Rendered, Skip, status_code
from ebmrag.records.fhir.results import quantity, value_of
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


def named(value: Any, kind: str = "") -> str:
    """The words of one CodeableConcept or a list of them, ", "-joined once each (placeholders of `kind` left out)."""
    return ", ".join(dict.fromkeys(t for c in concepts(value) if (t := text_of(c, kind))))


def referenced(links: Any, index: ChartIndex) -> str:
    """What references point at, in words: the resource's concept (its code, a Goal's description, a medication's
    drug) with its value when it has one, else the reference's display."""
    said = []
    for link in objects(links):
        found = index.resolve(link)
        words = ""
        if found is not None:
            words = next((t for k in ("code", "description", "medicationCodeableConcept", "vaccineCode")
                          if (t := text_of(found.get(k)))), "")
            value = value_of(found) if found.get("resourceType") == "Observation" else ""
            words = f"{words} {value}".strip() if words else value
        display = link.get("display")
        words = words or (display.strip() if isinstance(display, str) and not is_garbage(display) else "")
        if words:
            said.append(words)
    return ", ".join(dict.fromkeys(said))


def _joined(*parts: tuple[str, str]) -> str:
    """"; label: words" for each part that says something ("" when none does)."""
    return "".join(f"; {label}: {words}" if label else f"; {words}" for label, words in parts if words)


def family_history(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """"Family history: mother (deceased, age 67): breast cancer (onset age 45 a; outcome: died; contributed to
    death)": a relative's conditions, for risk questions, with what became of them."""
    if r.get("status") in ("entered-in-error", "health-unknown"):
        return Skip("entered in error or health unknown")
    who = text_of(r.get("relationship"), "FamilyMemberHistory.relationship") or "relative"
    deceased = _deceased(r)
    conditions = "; ".join(_relative_condition(c) for c in objects(r.get("condition"))
                           if text_of(c.get("code"), "FamilyMemberHistory.condition"))
    note = notes(r.get("note"))
    if not conditions and not note:
        said = next((s for c in objects(r.get("condition")) if (s := names_nothing(c.get("code"),
                                                                                 "FamilyMemberHistory.condition"))), "")
        return Skip(f"placeholder only: {said}" if said else "names no condition")
    text = f"Family history: {who}" + (f" ({deceased})" if deceased else "") + (f": {conditions}" if conditions else "")
    return [Rendered("Family history", text + _joined(("note", note)) + ".", timestamp=r.get("date"))]


def _deceased(r: Resource) -> str:
    """The relative's death as written: "deceased", "deceased at age 67", "deceased 2011" ("" when not said)."""
    age = quantity(r.get("deceasedAge"))
    ranged = "-".join(q for q in (quantity(obj(r.get("deceasedRange")).get(k)) for k in ("low", "high")) if q)
    said = r.get("deceasedString")
    detail = (f"at age {age}" if age else as_written(r.get("deceasedDate")) or (f"at age {ranged}" if ranged else "")
              or (" ".join(said.split())[:60] if isinstance(said, str) else ""))
    if detail:
        return f"deceased {detail}"
    return "deceased" if r.get("deceasedBoolean") is True else ""


def _relative_condition(c: Mapping[str, Any]) -> str:
    outcome = text_of(c.get("outcome"))
    details = [f"onset {onset_of(c)}" if onset_of(c) else "", f"outcome: {outcome}" if outcome else "",
               "contributed to death" if c.get("contributedToDeath") is True else "",
               f"note: {n}" if (n := notes(c.get("note"))) else ""]
    detail = "; ".join(d for d in details if d)
    return text_of(c.get("code"), "FamilyMemberHistory.condition") + (f" ({detail})" if detail else "")


def _allergen(r: Resource) -> str:
    """The substance: `code` (DSTU2: `substance`), else the reactions' `substance` (C-CDA conversions put it
    only there); placeholders ("Allergy", "Substance", "unknown") name no substance."""
    kind = "AllergyIntolerance"
    named_here = text_of(r.get("code"), kind) or text_of(r.get("substance"), kind)
    if named_here:
        return named_here
    substances = dict.fromkeys(text_of(reaction.get("substance"), kind) for reaction in objects(r.get("reaction")))
    return ", ".join(s for s in substances if s)


_SEVERITIES = ("mild", "moderate", "severe")
_MANIFESTATION = "AllergyIntolerance.reaction.manifestation"


def _manifestations(reactions: Sequence[Mapping[str, Any]]) -> str:
    """What happened, each once: the manifestations' words (their text or original text where the codings are
    garbage; R5 wraps each in a CodeableReference)."""
    return ", ".join(dict.fromkeys(t for reaction in reactions for m in concepts(reaction.get("manifestation"))
                                   if (t := text_of(m, _MANIFESTATION) or text_of(m.get("concept"), _MANIFESTATION))))


def _reaction_details(reactions: Sequence[Mapping[str, Any]], allergen: str, said: str, onset: str) -> str:
    """Each reaction's own words beyond its manifestations: its description, a substance other than the allergy's,
    when it began, the route of exposure and its notes ("reaction: throat closed within minutes, to amoxicillin,
    onset 2015-03-02")."""
    lines = []
    for reaction in reactions:
        description = reaction.get("description")
        description = " ".join(description.split()) if isinstance(description, str) else ""
        substance = text_of(reaction.get("substance"), "AllergyIntolerance")
        parts = [description if description and description.lower() not in said.lower() else "",
                 f"to {substance}" if substance and substance.lower() not in allergen.lower() else "",
                 f"onset {when}" if (when := as_written(reaction.get("onset"))) and when != onset else "",
                 f"exposure {route}" if (route := text_of(reaction.get("exposureRoute"))) else "",
                 f"note: {note}" if (note := notes(reaction.get("note"))) else ""]
        if any(parts):
            lines.append(", ".join(p for p in parts if p))
    return "; ".join(dict.fromkeys(lines))


def allergy(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A drug, food or other allergy in one short line ("Drug allergy to penicillin G (high criticality, severe
    reaction: hives); since 2007; reaction: ...; note: ..."), which the face sheet repeats verbatim so the two collapse
    into one when packed; "no known allergy" codes become an allergy status, never an allergy; an entry made only
    of placeholders ("Allergy", nothing else) is no allergy."""
    verification = status_of(r.get("verificationStatus"))  # the code, or its words where a code belongs
    if verification in RETRACTED:
        return Skip("refuted or entered in error")
    if states_absence(r.get("code"), "allergy"):
        return [Rendered("Allergy status", f"Allergy status: {text_of(r.get('code'))}.")]
    if taken_back(r):  # "Not allergic to penicillin": what the chart states, not an allergy
        return [Rendered("Allergy status", f"Allergy status: {_allergen(r)}.")]
    reactions = objects(r.get("reaction"))
    allergen, said, note = _allergen(r), _manifestations(reactions), notes(r.get("note"))
    onset = onset_of(r)
    extra = _reaction_details(reactions, allergen, said, onset)
    criticality = r.get("criticality") if isinstance(r.get("criticality"), str) else ""
    placeholder = names_nothing(r.get("code"), "AllergyIntolerance") or names_nothing(r.get("substance"),
                                                                                      "AllergyIntolerance")
    stated = criticality or text_of(r.get("type")) or any(isinstance(x.get("severity"), str) for x in reactions) \
        or r.get("category")  # an unnamed allergy that says how bad, what kind or to what class is still one
    if placeholder and not (allergen or said or extra or note or stated):
        return Skip(f"placeholder only: {placeholder}")
    words = _allergy_categories()
    category = next((words[c] for c in strings(r.get("category")) if c in words), "")
    allergen = allergen or "unspecified substance"
    kind = "intolerance" if status_code(r.get("type")) == "intolerance" else "allergy"  # R5 codes `type` as a concept
    if _SAYS_ALLERGY.search(allergen):  # SNOMED names the disorder: "Intolerance to lactose", "Allergy to egg"
        head = f"{allergen} ({category.lower()})" if category else allergen
    else:
        head = f"{category + ' ' + kind if category else kind.capitalize()} to {allergen}"
    status = [s for s in (status_of(r.get("clinicalStatus")), verification)
              if s in ("inactive", "resolved", "unconfirmed")]
    worst = max((str(x.get("severity")) for x in reactions if x.get("severity") in _SEVERITIES),
                key=_SEVERITIES.index, default="")
    bits = [*status, "high criticality" if criticality == "high" else f"criticality {criticality}" if criticality
            else "", f"{worst} reaction" if worst else ""]
    detail = ", ".join(b for b in bits if b)
    detail += (": " if detail and said else "") + said
    text = head + (f" ({detail})" if detail else "") + (f"; since {onset}" if onset else "") \
        + _joined(("reaction", extra), ("note", note))
    return [Rendered("Allergy" + (f" > {category.lower()}" if category else ""), text + ".")]


def _stages(r: Resource, index: ChartIndex) -> str:
    """Condition.stage: each summary with the staging system it belongs to ("3b (CKD stage)", "T2 N0 M0 (TNM)"),
    else what its assessments say."""
    said = []
    for stage in objects(r.get("stage")):
        summary = text_of(stage.get("summary")) or referenced(stage.get("assessment"), index)
        system = text_of(stage.get("type"))
        if summary:
            said.append(summary + (f" ({system})" if system and system.lower() not in summary.lower() else ""))
    return "; ".join(dict.fromkeys(said))


def _evidence(r: Resource, index: ChartIndex) -> str:
    return "; ".join(dict.fromkeys(t for e in objects(r.get("evidence"))
                                   if (t := ", ".join(w for w in (named(e.get("code")),
                                                                  referenced(e.get("detail"), index)) if w))))


def _qualified(r: Resource, index: ChartIndex, name: str) -> str:
    """The problem's name with what qualifies it, short enough for the face sheet's problem list ("Chronic kidney
    disease, stage G3b (KDIGO GFR category), severity moderate"): its body site (unless the name says it), stage
    and severity."""
    site = named(r.get("bodySite"))
    severity = text_of(r.get("severity"))
    said = [f"site {site}" if site and site.lower() not in name.lower() else "",
            f"stage {stage}" if (stage := _stages(r, index)) else "",
            f"severity {severity}" if severity and severity.lower() not in name.lower() else ""]
    return ", ".join([name, *(s for s in said if s)])


def condition(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """Active problems stand (no decay); resolved ones are dated by their abatement and weigh less; refuted
    and entered-in-error diagnoses are never packed; "no current problems" is a status, not a problem; a
    Condition coded only as "Problem" (a placeholder) is an absence, not a problem. Site, stage and severity
    qualify the name; evidence and notes are a second fragment of the problem ("#note"), so the face sheet's
    problem list stays one name per problem."""
    if status_code(r.get("verificationStatus")) in RETRACTED:
        return Skip("refuted or entered in error")
    if states_absence(r.get("code"), "problem"):
        return [Rendered("Problem list > status", f"Problem list: {text_of(r.get('code'))}.")]
    name = text_of(r.get("code"), "Condition")
    qualified = _qualified(r, index, name or "unnamed condition")
    remarks = _joined(("evidence", _evidence(r, index)), ("note", notes(r.get("note"))))
    placeholder = names_nothing(r.get("code"), "Condition")
    if placeholder and qualified == "unnamed condition" and not remarks:
        return Skip(f"placeholder only: {placeholder}")
    clinical = status_code(r.get("clinicalStatus"))
    onset = onset_of(r) or as_written(r.get("recordedDate"))
    ended = as_written(r.get("abatementDateTime")) or as_written(obj(r.get("abatementPeriod")).get("end"))
    if clinical in _RESOLVED or (not clinical and ended):
        when = ", ".join(w for w in (f"since {onset}" if onset else "", f"resolved {ended}" if ended else "") if w)
        section, head = "Problem list > resolved", "Resolved problem"
        text = f"Resolved problem: {qualified}" + (f" ({when})" if when else "") + "."
        stamp = r.get("abatementDateTime") or r.get("onsetDateTime") or r.get("recordedDate")
    else:
        notes_ = [n for n in ("unconfirmed" if status_code(r.get("verificationStatus")) in ("unconfirmed",
                                                                                              "provisional")
                              else "", "clinical status not recorded" if not clinical else "",
                              f"since {onset}" if onset else "") if n]
        section, head, stamp = "Problem list > active", "Active problem", None
        text = f"Active problem: {qualified}" + (f" ({', '.join(notes_)})" if notes_ else "") + "."
    parts = [Rendered(section, text, timestamp=stamp)]
    if remarks:
        parts.append(Rendered(f"{section} > note", f"{head} {qualified}{remarks}.", "#note", timestamp=stamp))
    return parts


def procedure(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A procedure with where, why and what came of it: its body site, reasons, outcome, complications, follow-up
    and notes; one coded only as "Procedure" with nothing else is no procedure."""
    if r.get("status") in ("entered-in-error", "not-done"):
        return Skip("not done or entered in error")
    if states_absence(r.get("code"), "procedure"):
        return [Rendered("Procedure", f"Procedures: {text_of(r.get('code'))}.")]
    reason = ", ".join(w for w in (named(r.get("reasonCode")), referenced(r.get("reasonReference"), index)) if w)
    complications = ", ".join(w for w in (named(r.get("complication")),
                                          referenced(r.get("complicationDetail"), index)) if w)
    details = _joined(("site", named(r.get("bodySite"))), ("reason", reason), ("outcome", text_of(r.get("outcome"))),
                      ("complications", complications), ("follow-up", named(r.get("followUp"))),
                      ("note", notes(r.get("note"))))
    placeholder = names_nothing(r.get("code"), "Procedure")
    if placeholder and not details:
        return Skip(f"placeholder only: {placeholder}")
    performed = r.get("performedDateTime") or obj(r.get("performedPeriod")).get("start")
    when = as_written(performed)
    return [Rendered("Procedure", f"Procedure: {text_of(r.get('code'), 'Procedure') or 'unnamed procedure'}"
                     + (f" ({when})" if when else "") + details + ".", timestamp=performed)]


_DRUG = "Medication"


def drug_name(r: Resource, index: ChartIndex) -> str:
    """The drug of a medication resource: its concept, else the referenced or contained Medication, else the
    reference's display; "unnamed medication" when none names a drug (a placeholder such as "Medication" names
    none: `names_no_drug`)."""
    if text_of(r.get("medicationCodeableConcept"), _DRUG):
        return text_of(r["medicationCodeableConcept"], _DRUG)
    if isinstance(r.get("medication"), Mapping):  # R5 CodeableReference: {"concept": ..., "reference": ...}
        concept = text_of(r["medication"].get("concept"), _DRUG)
        if concept:
            return concept
        r = {**r, "medicationReference": r["medication"].get("reference")}
    reference = obj(r.get("medicationReference"))
    medication = index.resolve(reference, within=r)
    named_here = text_of(medication.get("code"), _DRUG) if medication is not None else ""
    if not named_here and medication is not None:  # a compounded Medication lists its ingredients
        named_here = " + ".join(t for i in objects(medication.get("ingredient"))
                                if (t := text_of(i.get("itemCodeableConcept"), _DRUG)))
    display = reference.get("display")
    shown = display.strip() if isinstance(display, str) and not is_placeholder(display, _DRUG) else ""
    return named_here or shown or "unnamed medication"


def names_no_drug(r: Resource, index: ChartIndex) -> str:
    """The placeholder a medication record is named with ("Medication", "Drug"), when nothing else names its drug:
    such a record is no drug ("" otherwise)."""
    wrapped = obj(r.get("medication"))
    if drug_name(r, index) != "unnamed medication" or says_unknown(r.get("medicationCodeableConcept")) \
            or says_unknown(wrapped.get("concept")):
        return ""  # a drug not known by name is still a drug the patient takes
    said = [names_nothing(r.get("medicationCodeableConcept"), _DRUG), names_nothing(wrapped.get("concept"), _DRUG)]
    display = obj(r.get("medicationReference") or wrapped.get("reference")).get("display")
    said.append(display.strip() if isinstance(display, str) and display.strip() else "")
    return next((s for s in said if s), "")


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
        note = notes(r.get("note"))
        if (placeholder := names_no_drug(r, index)) and not (note or _dose(r) or named(r.get("reasonCode"))
                                                              or named(r.get("statusReason"))):
            return Skip(f"placeholder only: {placeholder}")
        state, why = index.medication_state.get(id(r), ("not active", ""))
        recorded = ", ".join(str(r[k]) for k in ("status", "intent") if isinstance(r.get(k), str))
        reasons = [text_of(c) for c in concepts(r.get("reasonCode"))]
        reasons += [text_of(found.get("code")) for ref in objects(r.get("reasonReference"))
                    if (found := index.resolve(ref)) is not None]
        reason = ", ".join(dict.fromkeys(x for x in reasons if x))
        dose, start = _dose(r), started(r)
        forbid = "do not give " if r.get("doNotPerform") is True else ""  # a prohibition, never the drug itself
        text = f"{label}: {forbid}{drug_name(r, index)}" + (f" ({recorded or 'status not recorded'})") \
            + (f" since {as_written(start)}" if as_written(start) else "") + (f" for {reason}" if reason else "") \
            + (f"; {dose}" if dose else "") + (f"; {why}" if why and not forbid else "") \
            + _joined(("status reason", named(r.get("statusReason"))), ("note", note)) + "."
        return [Rendered(f"{label} > {state}", text, timestamp=start if isinstance(start, str) else None)]
    return render


def started(r: Resource) -> Any:
    """When a medication record starts or was made: order date, effective start, assertion date."""
    period = obj(r.get("effectivePeriod"))
    return r.get("authoredOn") or r.get("dateWritten") or r.get("effectiveDateTime") or period.get("start") \
        or r.get("dateAsserted")


def immunization(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A vaccine given (its dose in the series, any reaction, notes) or not given and why ("not given: patient
    objection"): a vaccine withheld for a contraindication is as clinical as one given."""
    if r.get("status") == "entered-in-error":
        return Skip("entered in error")
    if states_absence(r.get("vaccineCode"), "immunization"):
        return [Rendered("Immunization", f"Immunizations: {text_of(r.get('vaccineCode'))}.")]
    kind = "Immunization.vaccineCode"
    not_given = r.get("status") == "not-done" or r.get("notGiven") is True  # DSTU2/STU3: notGiven
    why = named([*concepts(r.get("statusReason")), *concepts(obj(r.get("explanation")).get("reasonNotGiven"))])
    reasons = named([*concepts(r.get("reasonCode")), *concepts(obj(r.get("explanation")).get("reason"))])
    given = " ".join(w for w in (quantity(r.get("doseQuantity")), text_of(r.get("route")), text_of(r.get("site")))
                     if w)  # "0.5 mL Injection, intramuscular Left deltoid"
    details = _joined(("reason not given", why if not_given else ""), ("dose", _doses(r)), ("given", given),
                      ("reason", reasons), ("reaction", _vaccine_reactions(r, index)), ("note", notes(r.get("note"))))
    placeholder = names_nothing(r.get("vaccineCode"), kind)
    if placeholder and not details:
        return Skip(f"placeholder only: {placeholder}")
    when = as_written(r.get("occurrenceDateTime") or r.get("date"))
    head = "Immunization not given" if not_given else "Immunization"
    return [Rendered("Immunization", f"{head}: {text_of(r.get('vaccineCode'), kind) or 'vaccine not named'}"
                     + (f" ({when})" if when else "") + details + ".",
                     timestamp=r.get("occurrenceDateTime") or r.get("date"))]


def _doses(r: Resource) -> str:
    """protocolApplied (R4; STU3 vaccinationProtocol): "2 of 3 (hepatitis B series)"."""
    said = []
    for protocol in [*objects(r.get("protocolApplied")), *objects(r.get("vaccinationProtocol"))]:
        number = next((str(protocol[k]) for k in ("doseNumberPositiveInt", "doseNumberString", "doseSequence")
                       if isinstance(protocol.get(k), (int, str)) and not isinstance(protocol.get(k), bool)), "")
        of = next((str(protocol[k]) for k in ("seriesDosesPositiveInt", "seriesDosesString", "seriesDoses")
                   if isinstance(protocol.get(k), (int, str)) and not isinstance(protocol.get(k), bool)), "")
        series = protocol.get("series") if isinstance(protocol.get("series"), str) else ""
        against = named(protocol.get("targetDisease"))
        words = " ".join(w for w in (number, f"of {of}" if number and of else "") if w)
        extra = ", ".join(w for w in (series, f"against {against}" if against else "") if w)
        if words or extra:
            said.append(words + (f" ({extra})" if words and extra else extra))
    return "; ".join(dict.fromkeys(said))


def _vaccine_reactions(r: Resource, index: ChartIndex) -> str:
    """Immunization.reaction: what its detail Observation says, when, and whether the patient reported it."""
    said = []
    for reaction in objects(r.get("reaction")):
        words = referenced([reaction["detail"]] if isinstance(reaction.get("detail"), Mapping) else [], index)
        when = as_written(reaction.get("date"))
        parts = [words or "reaction recorded", when, "self-reported" if reaction.get("reported") is True else ""]
        said.append(" ".join(p if i == 0 else f"({p})" for i, p in enumerate(parts) if p))
    return "; ".join(dict.fromkeys(said))


def care_plan(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A care plan with what it is for and what it holds: its title and description, the problems it addresses, its
    goals (the Goal resources, resolved), each activity (its code, description and status, or what the activity's
    reference is: a referral, an order) and notes."""
    if r.get("status") in ("entered-in-error", "revoked"):
        return Skip("revoked or entered in error")
    kind = "CarePlan"
    names = ", ".join(t for c in concepts(r.get("category")) if (t := text_of(c, kind)))
    title = " ".join(r["title"].split()) if isinstance(r.get("title"), str) else ""
    description = " ".join(r["description"].split()) if isinstance(r.get("description"), str) else ""
    activities = "; ".join(dict.fromkeys(t for a in objects(r.get("activity")) if (t := _activity(a, index))))
    details = _joined(("", description), ("addresses", referenced(r.get("addresses"), index)),
                      ("goals", referenced(r.get("goal"), index)), ("activities", activities),
                      ("note", notes(r.get("note"))))
    status = r.get("status") if isinstance(r.get("status"), str) else "status unknown"
    name = ", ".join(w for w in (title, names) if w)
    if not name and not details:
        return Skip("names neither a category nor an activity")
    return [Rendered("Care plan", f"Care plan: {name or 'unnamed'} ({status})" + details + ".",
                     timestamp=obj(r.get("period")).get("start"))]


def _activity(activity: Mapping[str, Any], index: ChartIndex) -> str:
    """One CarePlan.activity: "diabetic diet education (completed; weekly sessions)", or its reference's words."""
    detail = obj(activity.get("detail"))
    code = text_of(detail.get("code"), "CarePlan.activity") or referenced(activity.get("reference"), index) \
        or named(detail.get("productCodeableConcept"), _DRUG)
    description = " ".join(detail["description"].split()) if isinstance(detail.get("description"), str) else ""
    status = str(detail["status"]) if isinstance(detail.get("status"), str) else ""
    why = named(detail.get("statusReason"))
    outcome = named(activity.get("outcomeCodeableConcept"))
    extras = [s for s in (status + (f": {why}" if why else ""), description if description != code else "",
                          f"outcome {outcome}" if outcome else "", notes(activity.get("progress"))) if s]
    if not code and not extras:
        return ""
    return (code or "activity") + (f" ({'; '.join(extras)})" if extras else "")


def goal(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A Goal: what it aims at, its targets ("HbA1c < 7 % by 2025-06-01"), whether it is still pursued and whether
    it is being met. A goal named only "Goal", with no target, is no goal."""
    if r.get("lifecycleStatus") == "entered-in-error" or r.get("status") == "entered-in-error":
        return Skip("entered in error")
    kind = "Goal"
    targets = "; ".join(dict.fromkeys(t for target in objects(r.get("target")) if (t := _target(target))))
    details = _joined(("target", targets), ("addresses", referenced(r.get("addresses"), index)),
                      ("note", notes(r.get("note"))))
    written = r.get("description")  # DSTU2: a string
    described = text_of(written, kind) or (" ".join(written.split()) if isinstance(written, str)
                                           and not is_placeholder(written, kind) else "")
    placeholder = names_nothing(written, kind) or (written.strip() if isinstance(written, str) else "")
    if not described and not details:
        return Skip(f"placeholder only: {placeholder}" if placeholder else "names no goal")
    lifecycle = r.get("lifecycleStatus") or r.get("status")  # STU3: status
    achievement = r.get("achievementStatus")
    achieved = (text_of(achievement) if obj(achievement).get("text") or any(d for _, _, d in codings(achievement))
                else status_code(achievement))  # a bare code says more than "<code> (goal-achievement)"
    states = ", ".join(s for s in (lifecycle if isinstance(lifecycle, str) else "", achieved.lower()) if s)
    start = as_written(r.get("startDate"))
    text = f"Goal: {described or 'not described'}" + (f" ({states})" if states else "") \
        + (f"; since {start}" if start else "") + details + "."
    return [Rendered("Care plan > goal", text, timestamp=r.get("startDate") or r.get("statusDate"))]


def _target(target: Mapping[str, Any]) -> str:
    """"HbA1c < 7 % by 2025-06-01": the measure, the detail[x] (value_of reads it as a value[x]), the due date."""
    measure = text_of(target.get("measure"))
    value = value_of({"value" + key.removeprefix("detail"): v for key, v in target.items() if key.startswith("detail")})
    due = as_written(target.get("dueDate")) or (f"within {q}" if (q := quantity(target.get("dueDuration"))) else "")
    said = " ".join(w for w in (measure, value) if w)
    if not said:
        return f"due {due}" if due else ""
    return said + (f" by {due}" if due.startswith(tuple("0123456789")) else f" {due}" if due else "")


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
    if (placeholder := names_nothing(r.get("code"), "Flag")):
        return Skip(f"placeholder only: {placeholder}")
    return [Rendered("Alert", f"Alert: {text_of(r.get('code'), 'Flag') or 'unnamed flag'}.",
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
