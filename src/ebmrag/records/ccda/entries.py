"""C-CDA entries -> FHIR R4 resources (as JSON-like dicts), one handler per section kind.

Each handler takes one <entry> and returns the resources it makes, or raises ValueError naming why the entry
cannot be read; the caller skips that entry and records the reason in `ccda_notes`, so one broken entry never
costs the document. Clinical judgement the FHIR reader relies on is made here, from codes (rules/records/ccda.toml
and absent.toml), not titles:

- a negated allergy or problem with no particular substance or problem is a "no known ..." resource; a negated
  one naming a substance (not allergic to penicillin) is kept with verificationStatus "refuted";
- a completed allergy concern act is not evidence that the allergy resolved (C-CDA vendors close concern acts
  routinely), so only an allergy status observation or an active concern sets clinicalStatus;
- an allergy whose onset date or type is unreadable is still an allergy: it is kept, with a note, because
  dropping it would tell a prescriber the patient has one allergy fewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from xml.etree.ElementTree import Element

from ebmrag.records.ccda.values import (
    NS,
    SNOMED,
    Coded,
    Context,
    Resource,
    Section,
    ccda_codes,
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
from ebmrag.rules import rule_file


@rule_file("records/absent.toml")
def _no_known(raw: Mapping[str, Any]) -> dict[str, dict[str, Coded]]:
    """What a negated allergy or problem that names nothing in particular becomes (absent.toml [<kind>.ccda]): by
    the allergy's category, else `default`; each code one of that kind's statements of absence."""
    written: dict[str, dict[str, Coded]] = {}
    for kind in ("allergy", "problem"):
        table = raw[kind]["ccda"]
        written[kind] = {key: Coded.of(value, f"[{kind}.ccda] {key}") for key, value in table.items()}
        if "default" not in written[kind]:
            raise ValueError(f"[{kind}.ccda] needs a `default`")
        stray = [c.code for c in written[kind].values() if c.code not in raw[kind]["snomed"]]
        if stray:
            raise ValueError(f"[{kind}.ccda] writes {stray[0]}, which is not in [{kind}] snomed")
    return written


_PERIOD_UNITS = {"s", "min", "h", "d", "wk", "mo", "a"}  # FHIR Timing.periodUnit (UCUM units of time)


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
    codes = ccda_codes()
    category = codes.allergy_category.get(kind)
    entity = child(obs, "participant/participantRole/playingEntity")
    name = inline_text(child(entity, "name"))
    allergen = concept(child(entity, "code"), sec.refs, name) or ({"text": name} if name else None)
    generic = allergen is None or any(c.get("code") in codes.generic_substances for c in allergen.get("coding", []))
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
        resource["type"] = "intolerance" if kind in codes.intolerance else "allergy"
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
    written = _no_known()["allergy"]
    code, display = written.get(category or "", written["default"])
    resource = new_resource("allergy", "AllergyIntolerance", ctx, "patient")
    resource.update(clinicalStatus=status_concept("allergyintolerance-clinical", "active"),
                    verificationStatus=status_concept("allergyintolerance-verification", "confirmed"),
                    code=codeable(SNOMED, code, display))
    return resource


def _allergy_status(obs: Element, concern: str) -> str | None:
    codes = ccda_codes()
    for _, found in related(obs):
        if has_template(found, "28", codes.status_observation) and code_of(found, "value") in codes.clinical_status:
            return codes.clinical_status[code_of(found, "value")]
    return "active" if concern == "active" else None


def _criticality(el: Element | None) -> str | None:
    """A criticality observation, else a severity observation on the allergy itself (C-CDA R1.1 style; some
    documents hang it on the concern act), read as criticality."""
    codes = ccda_codes()
    held = [o for _, o in related(el)]
    found = ([o for o in held if has_template(o, "145", codes.criticality_observation)]
             or [o for o in held if has_template(o, "8", codes.severity_observation)])
    if not found:
        return None
    return codes.criticality.get(code_of(found[0], "value"), "unable-to-assess")


def _reaction(obs: Element, sec: Section) -> Resource | None:
    value = child(obs, "value")
    manifestation = concept(value, sec.refs)
    said = resolve(child(obs, "text"), sec.refs)
    if manifestation is None:
        return {"manifestation": [{"text": said}]} if said else None
    if said and child(value, "originalText") is None:
        manifestation["text"] = said
    reaction: Resource = {"manifestation": [manifestation]}
    codes = ccda_codes()
    severity = next((codes.severity.get(code_of(o, "value")) for _, o in related(obs)
                     if has_template(o, "8", codes.severity_observation)), None)
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
    codes = ccda_codes()
    generic = code is None or all(c.get("code") in codes.generic_problems for c in code.get("coding", [{}]))
    if negated and generic:
        resource = new_resource("condition", "Condition", ctx)
        statement = _no_known()["problem"]["default"]
        resource.update(clinicalStatus=status_concept("condition-clinical", "active"),
                        verificationStatus=status_concept("condition-ver-status", "confirmed"),
                        code=codeable(SNOMED, *statement))
        return resource
    if code is None:
        raise ValueError("problem observation has no value")
    point, start, end = times(child(obs, "effectiveTime"))
    resource = new_resource("condition", "Condition", ctx)
    status = next((codes.clinical_status[code_of(o, "value")] for _, o in related(obs)
                   if has_template(o, "6", codes.status_observation) and code_of(o, "value") in codes.clinical_status),
                  None)
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
    codes = ccda_codes()
    said = next((code_of(o, "value") for _, o in related(sa) if code_of(o) == codes.status_observation), "")
    if said in codes.clinical_status:
        return "active" if codes.clinical_status[said] == "active" else "completed"
    status, mapped = status_code(sa), codes.act_status["medication"]
    if status in codes.medication_ended or (status == "completed" and sa.get("moodCode") == "INT"):
        return mapped[status]
    if sa.get("moodCode") == "INT":
        return "intended"
    return mapped.get(status, "unknown")


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
