"""C-CDA entries -> FHIR R4 resources (as JSON-like dicts), one handler per section kind.

Each handler takes one <entry> and returns the resources it makes, or raises ValueError naming why the entry
cannot be read; the caller skips that entry and records the reason in `ccda_notes`, so one broken entry never
costs the document. Clinical judgement the FHIR reader relies on is made here, from codes, not titles:

- a negated allergy or problem with no particular substance or problem is a "no known ..." resource; a negated
  one naming a substance (not allergic to penicillin) is kept with verificationStatus "refuted";
- a completed allergy concern act is not evidence that the allergy resolved (C-CDA vendors close concern acts
  routinely), so only an allergy status observation or an active concern sets clinicalStatus;
- an allergy whose onset date or type is unreadable is still an allergy: it is kept, with a note, because
  dropping it would tell a prescriber the patient has one allergy fewer.
"""

from __future__ import annotations

from xml.etree.ElementTree import Element

from ebmrag.records.ccda.values import (
    NS,
    SNOMED,
    Context,
    Resource,
    Section,
    child,
    code_of,
    codeable,
    concept,
    has_template,
    inline_text,
    new_resource,
    number,
    quantity,
    related,
    resolve,
    status_code,
    status_concept,
    times,
    xsi_type,
)

_ALLERGY_CATEGORY = {"416098002": "medication", "419511003": "medication", "59037007": "medication",
                     "414285001": "food", "235719002": "food", "418471000": "food", "426232007": "environment"}
_INTOLERANCE = {"59037007", "235719002"}
_NO_KNOWN_ALLERGY = {"medication": ("409137002", "No known drug allergy"),
                     "food": ("429625007", "No known food allergy")}
_GENERIC_SUBSTANCES = {"105590001", "410942007", "373873005", "762766007"}  # "Substance", "Drug or medicament"...
_GENERIC_PROBLEMS = {"55607006", "404684003", "64572001", "282291009", "29308-4", "75326-9", "ASSERTION"}
_CLINICAL = {"55561003": "active", "73425007": "inactive", "413322009": "resolved"}
_CRITICALITY = {"399166001": "high", "24484000": "high", "371924009": "high", "62482003": "low",
                "255604002": "low", "371923003": "low"}
_SEVERITY = {"24484000": "severe", "371924009": "severe", "6736007": "moderate", "371923003": "moderate",
             "255604002": "mild"}
_MEDICATION_STATUS = {"active": "active", "completed": "completed", "aborted": "stopped", "cancelled": "cancelled",
                      "suspended": "on-hold", "nullified": "entered-in-error", "new": "intended", "held": "intended"}
_MEDICATION_STOPPED = {"aborted", "cancelled", "suspended", "nullified"}
_PERIOD_UNITS = {"s", "min", "h", "d", "wk", "mo", "a"}



def _onset(obs: Element) -> str | None:
    """When an observation began: its effectiveTime's low, else its value (ValueError when malformed)."""
    point, start, _ = times(child(obs, "effectiveTime"))
    return start or point or None

def _main(entry: Element, tag: str, template: str) -> tuple[Element | None, list[Element]]:
    """The concern act of an entry (or None) and the observations it is about (those with `template` if any)."""
    act = child(entry, "act")
    if act is None:
        direct = child(entry, tag)
        return None, [direct] if direct is not None else []
    held = [o for _, o in related(act, tag)]
    return act, [o for o in held if has_template(o, template)] or held



# --- allergies -------------------------------------------------------------------------------------------------


def allergies(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    act, observations = _main(entry, "observation", "7")
    if not observations:
        raise ValueError("no allergy observation")
    return [_allergy(obs, act, f"{where}" + (f" observation {n}" if len(observations) > 1 else ""), sec, ctx)
            for n, obs in enumerate(observations, start=1)]


def _allergy(obs: Element, act: Element | None, where: str, sec: Section, ctx: Context) -> Resource:
    value = child(obs, "value")
    kind = code_of(obs, "value")
    category = _ALLERGY_CATEGORY.get(kind)
    entity = child(obs, "participant/participantRole/playingEntity")
    name = inline_text(child(entity, "name"))
    allergen = concept(child(entity, "code"), sec.refs, name) or ({"text": name} if name else None)
    generic = allergen is None or any(c.get("code") in _GENERIC_SUBSTANCES for c in allergen.get("coding", []))
    negated = obs.get("negationInd") == "true"
    if negated and generic:
        return _no_known_allergy(category, ctx)
    if allergen is None:
        raise ValueError("no allergen and no negation")
    resource = new_resource("allergy", "AllergyIntolerance", ctx, "patient")
    resource["verificationStatus"] = status_concept("allergyintolerance-verification",
                                                    "refuted" if negated else "confirmed")
    status = _allergy_status(obs, status_code(act))
    if status and not negated:
        resource["clinicalStatus"] = status_concept("allergyintolerance-clinical", status)
    if value is None or not kind:
        ctx.notes.append(f"{where}: allergy to {allergen.get('text') or 'a coded substance'} has no allergy type "
                         "(<value>); kept without type and category")
    else:
        resource["type"] = "intolerance" if kind in _INTOLERANCE else "allergy"
    if category:
        resource["category"] = [category]
    resource["code"] = allergen
    criticality = _criticality(obs) or _criticality(act)
    if criticality:
        resource["criticality"] = criticality
    try:
        if onset := _onset(obs):
            resource["onsetDateTime"] = onset
    except ValueError as exc:
        ctx.notes.append(f"{where}: onset of allergy to {allergen.get('text') or 'a coded substance'} unreadable "
                         f"({exc}); kept without onset")
    reactions = [r for type_code, o in related(obs) if type_code == "MFST" or has_template(o, "9")
                 if (r := _reaction(o, sec))]
    if reactions:
        resource["reaction"] = reactions
    return resource


def _no_known_allergy(category: str | None, ctx: Context) -> Resource:
    code, display = _NO_KNOWN_ALLERGY.get(category or "", ("716186003", "No known allergy"))
    resource = new_resource("allergy", "AllergyIntolerance", ctx, "patient")
    resource.update(clinicalStatus=status_concept("allergyintolerance-clinical", "active"),
                    verificationStatus=status_concept("allergyintolerance-verification", "confirmed"),
                    code=codeable(SNOMED, code, display))
    return resource


def _allergy_status(obs: Element, concern: str) -> str | None:
    for _, found in related(obs):
        if has_template(found, "28", "33999-4") and code_of(found, "value") in _CLINICAL:
            return _CLINICAL[code_of(found, "value")]
    return "active" if concern == "active" else None


def _criticality(el: Element | None) -> str | None:
    """A criticality observation, else a severity observation on the allergy itself (C-CDA R1.1 style; some
    documents hang it on the concern act), read as criticality."""
    held = [o for _, o in related(el)]
    found = [o for o in held if has_template(o, "145", "82606-5")] or [o for o in held if has_template(o, "8", "SEV")]
    if not found:
        return None
    return _CRITICALITY.get(code_of(found[0], "value"), "unable-to-assess")


def _reaction(obs: Element, sec: Section) -> Resource | None:
    value = child(obs, "value")
    manifestation = concept(value, sec.refs)
    said = resolve(child(obs, "text"), sec.refs)
    if manifestation is None:
        return {"manifestation": [{"text": said}]} if said else None
    if said and child(value, "originalText") is None:
        manifestation["text"] = said
    reaction: Resource = {"manifestation": [manifestation]}
    severity = next((_SEVERITY.get(code_of(o, "value")) for _, o in related(obs) if has_template(o, "8", "SEV")), None)
    if severity:
        reaction["severity"] = severity
    try:
        if onset := _onset(obs):
            reaction["onset"] = onset
    except ValueError:
        pass  # a reaction's onset is a detail; the reaction itself stays
    return reaction


# --- problems and diagnoses ------------------------------------------------------------------------------------


def problems(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    act, observations = _main(entry, "observation", "4")
    if not observations:
        raise ValueError("no problem observation")
    return [_condition(obs, status_code(act), sec, ctx) for obs in observations]


def _condition(obs: Element, concern: str, sec: Section, ctx: Context) -> Resource:
    code = concept(child(obs, "value"), sec.refs, resolve(child(obs, "text"), sec.refs))
    negated = obs.get("negationInd") == "true"
    generic = code is None or all(c.get("code") in _GENERIC_PROBLEMS for c in code.get("coding", [{}]))
    if negated and generic:
        resource = new_resource("condition", "Condition", ctx)
        resource.update(clinicalStatus=status_concept("condition-clinical", "active"),
                        verificationStatus=status_concept("condition-ver-status", "confirmed"),
                        code=codeable(SNOMED, "160245001", "No current problems or disability"))
        return resource
    if code is None:
        raise ValueError("problem observation has no value")
    point, start, end = times(child(obs, "effectiveTime"))
    resource = new_resource("condition", "Condition", ctx)
    status = next((_CLINICAL[code_of(o, "value")] for _, o in related(obs)
                   if has_template(o, "6", "33999-4") and code_of(o, "value") in _CLINICAL), None)
    status = status or ("resolved" if end else "active" if concern == "active" else None)
    if status and not negated:
        resource["clinicalStatus"] = status_concept("condition-clinical", status)
    resource["verificationStatus"] = status_concept("condition-ver-status", "refuted" if negated else "confirmed")
    category = "encounter-diagnosis" if sec.kind == "diagnoses" else "problem-list-item"
    resource["category"] = [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-category",
                                         "code": category}]}]
    resource["code"] = code
    if start or point:
        resource["onsetDateTime"] = start or point
    if end:
        resource["abatementDateTime"] = end
    return resource


# --- medications -----------------------------------------------------------------------------------------------


def medications(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    _, administrations = _main(entry, "substanceAdministration", "16")
    if not administrations:
        raise ValueError("no substanceAdministration")
    return [_medication(sa, sec, ctx) for sa in administrations]


def _medication(sa: Element, sec: Section, ctx: Context) -> Resource:
    material = child(sa, "consumable/manufacturedProduct/manufacturedMaterial")
    name = inline_text(child(material, "name"))
    drug = concept(child(material, "code"), sec.refs, name) or ({"text": name} if name else None)
    if drug is None:
        raise ValueError("medication has neither a code nor a name")
    resource = new_resource("medication", "MedicationStatement", ctx)
    resource["status"] = _medication_status(sa)
    resource["medicationCodeableConcept"] = drug
    interval, frequency = _medication_times(sa)
    if interval.get("point"):
        resource["effectiveDateTime"] = interval["point"]
    elif interval:
        resource["effectivePeriod"] = interval
    dosage = _dosage(sa, frequency, sec)
    if dosage:
        resource["dosage"] = [dosage]
    reasons = [c for type_code, o in related(sa) if type_code == "RSON" or has_template(o, "19")
               if (c := concept(child(o, "value"), sec.refs))]
    if reasons:
        resource["reasonCode"] = reasons
    return resource


def _medication_status(sa: Element) -> str:
    """negationInd -> not-taken; a medication status observation (Active/Inactive) wins over statusCode, which
    vendors set to "completed" once the order is written; an intended (INT) administration that is not
    explicitly stopped or completed is "intended"."""
    if sa.get("negationInd") == "true":
        return "not-taken"
    said = next((code_of(o, "value") for _, o in related(sa) if code_of(o) == "33999-4"), "")
    if said in _CLINICAL:
        return "active" if said == "55561003" else "completed"
    status = status_code(sa)
    if status in _MEDICATION_STOPPED or (status == "completed" and sa.get("moodCode") == "INT"):
        return _MEDICATION_STATUS[status]
    if sa.get("moodCode") == "INT":
        return "intended"
    return _MEDICATION_STATUS.get(status, "unknown")


def _medication_times(sa: Element) -> tuple[dict[str, str], str]:
    interval: dict[str, str] = {}
    frequency = ""
    for el in sa.findall("h:effectiveTime", NS):
        period = child(el, "period")
        if xsi_type(el) in ("PIVL_TS", "EIVL_TS") or period is not None:
            if period is not None and period.get("value"):
                frequency = f"every {number(period.get('value'))} {period.get('unit') or ''}".strip()
            continue
        point, start, end = times(el)
        interval = {k: v for k, v in (("start", start), ("end", end)) if v} or ({"point": point} if point else {})
    return interval, frequency


def _dosage(sa: Element, frequency: str, sec: Section) -> Resource:
    dosage: Resource = {}
    parts = []
    dose = child(sa, "doseQuantity")
    if dose is not None and dose.get("value"):
        parts.append(f"dose {number(dose.get('value'))} {dose.get('unit') or ''}".strip())
        dosage["doseAndRate"] = [{"doseQuantity": quantity(dose)}]
    elif dose is not None and child(dose, "low") is not None:  # IVL_PQ: "dose 1-2 puff"
        ends = [q for q in (child(dose, "low"), child(dose, "high")) if q is not None and q.get("value")]
        parts.append(f"dose {'-'.join(str(number(q.get('value'))) for q in ends)} {ends[0].get('unit') or ''}"
                     .strip() if ends else "")
    route = concept(child(sa, "routeCode"), sec.refs)
    if route:
        dosage["route"] = route
        parts.append(str(route.get("text") or ""))
    if frequency:
        parts.append(frequency)
        value, unit = frequency.split()[1], frequency.split()[-1]
        if unit in _PERIOD_UNITS:
            dosage["timing"] = {"repeat": {"period": number(value), "periodUnit": unit}}
    if child(sa, "precondition") is not None:
        dosage["asNeededBoolean"] = True
        parts.append("as needed")
    instructions = [t for _, act in related(sa, "act") if has_template(act, "20") if (t := resolve(child(act, "text"),
                                                                                            sec.refs))]
    if instructions:
        dosage["patientInstruction"] = "; ".join(instructions)
    if parts:
        dosage["text"] = ", ".join(p for p in parts if p)
    return dosage


# --- immunizations ---------------------------------------------------------------------------------------------


def immunizations(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    sa = child(entry, "substanceAdministration")
    if sa is None:
        raise ValueError("no substanceAdministration")
    if sa.get("moodCode") not in (None, "EVN"):
        raise ValueError(f"planned immunization (moodCode {sa.get('moodCode')}), not a record of one given")
    material = child(sa, "consumable/manufacturedProduct/manufacturedMaterial")
    vaccine = concept(child(material, "code"), sec.refs, inline_text(child(material, "name")))
    if vaccine is None:
        raise ValueError("immunization has no vaccine code or name")
    resource = new_resource("immunization", "Immunization", ctx, "patient")
    negated = sa.get("negationInd") == "true"
    resource["status"] = ("not-done" if negated else "entered-in-error" if status_code(sa) == "nullified"
                          else "completed")
    resource["vaccineCode"] = vaccine
    point, start, _ = times(child(sa, "effectiveTime"))
    if point or start:
        resource["occurrenceDateTime"] = point or start
    else:
        resource["occurrenceString"] = "date not recorded"
    reason = next((c for type_code, o in related(sa) if type_code == "RSON" if (c := concept(child(o, "code"),
                                                                                               sec.refs))), None)
    if negated and reason:
        resource["statusReason"] = reason
    route = concept(child(sa, "routeCode"), sec.refs)
    if route:
        resource["route"] = route
    lot = inline_text(child(material, "lotNumberText"))
    if lot:
        resource["lotNumber"] = lot
    return [resource]
