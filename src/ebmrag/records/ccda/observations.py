"""C-CDA results, vital signs, social history, procedures and encounters -> FHIR R4 resources.

A result organizer becomes a DiagnosticReport listing its Observations (the FHIR reader then reads the panel as
one line); a result without a value becomes an Observation with a dataAbsentReason rather than vanishing, since
"BUN not resulted" is itself information. Each component is converted on its own: one malformed result costs that
result only, and the note says which.
"""

from __future__ import annotations

from xml.etree.ElementTree import Element

from ebmrag.records.ccda.values import (
    NS,
    SNOMED,
    Context,
    Resource,
    Section,
    absent,
    child,
    code_of,
    codeable,
    concept,
    has_template,
    inline_text,
    loinc,
    new_resource,
    number,
    quantity,
    related,
    status_code,
    times,
    ts,
    xsi_type,
)

_OBSERVATION_STATUS = {"completed": "final", "active": "preliminary", "aborted": "cancelled",
                       "cancelled": "cancelled", "nullified": "entered-in-error", "new": "registered",
                       "held": "registered", "suspended": "registered"}
_REPORT_STATUS = {"completed": "final", "active": "partial", "aborted": "cancelled", "cancelled": "cancelled",
                  "nullified": "entered-in-error"}
_PROCEDURE_STATUS = {"completed": "completed", "active": "in-progress", "aborted": "stopped",
                     "cancelled": "not-done", "new": "preparation", "held": "on-hold", "suspended": "on-hold",
                     "nullified": "entered-in-error"}
_ENCOUNTER_STATUS = {"completed": "finished", "active": "in-progress", "cancelled": "cancelled",
                     "aborted": "cancelled", "nullified": "entered-in-error"}
_OBS_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"

_CODED = {"CD", "CE", "CV", "CO", "CS"}
_PREGNANCY_TEMPLATE = "2.16.840.1.113883.10.20.15.3.8"
_ENCOUNTER_CLASSES = {"AMB", "IMP", "EMER", "HH", "ACUTE", "NONAC", "OBSENC", "PRENC", "SS", "VR", "FLD"}


def results(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    category = "vital-signs" if sec.kind == "vital-signs" else "laboratory"
    organizer = child(entry, "organizer")
    if organizer is None:
        obs = child(entry, "observation")
        if obs is None:
            raise ValueError("no organizer or observation")
        return [_observation(obs, None, category, sec, ctx)]
    when = _when(organizer)
    made: list[Resource] = []
    for n, obs in enumerate(organizer.findall("h:component/h:observation", NS), start=1):
        try:
            made.append(_observation(obs, when, category, sec, ctx))
        except (ValueError, KeyError, AttributeError, TypeError, IndexError) as exc:
            ctx.notes.append(f"{where} component {n}: {exc}; that result is left out")
    report = new_resource("report", "DiagnosticReport", ctx)
    report["status"] = _REPORT_STATUS.get(status_code(organizer), "unknown")
    if category == "laboratory":
        report["category"] = [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0074",
                                           "code": "LAB"}]}]
    report["code"] = concept(child(organizer, "code"), sec.refs) or {"text": "Vital signs" if category ==
                                                                      "vital-signs" else "Results"}
    if when:
        report["effectiveDateTime"] = when
    report["result"] = [{"reference": f"Observation/{o['id']}"} for o in made]
    return [*made, report]


def _when(el: Element) -> str | None:
    point, start, _ = times(child(el, "effectiveTime"))
    return point or start


def _observation(obs: Element, when: str | None, category: str, sec: Section, ctx: Context) -> Resource:
    code = concept(child(obs, "code"), sec.refs, inline_text(child(obs, "text")))
    if code is None:
        raise ValueError("observation has no code")
    resource = new_resource("observation", "Observation", ctx)
    resource["status"] = _OBSERVATION_STATUS.get(status_code(obs), "unknown")
    resource["category"] = [{"coding": [{"system": _OBS_CATEGORY, "code": category}]}]
    resource["code"] = code
    stamp = _when(obs) or when
    if stamp:
        resource["effectiveDateTime"] = stamp
    resource.update(value_of(child(obs, "value"), sec) or absent(child(obs, "value")))
    flags = [c for el in obs.findall("h:interpretationCode", NS) if (c := concept(el, sec.refs))]
    if flags:
        resource["interpretation"] = flags
    ranges = [r for el in obs.findall("h:referenceRange/h:observationRange", NS) if (r := _range(el))]
    if ranges:
        resource["referenceRange"] = ranges
    return resource


def value_of(value: Element | None, sec: Section) -> Resource:
    """An observation's <value> by its xsi:type -> {"valueQuantity": ...} and kin; {} when there is none."""
    if value is None or (value.get("nullFlavor") and not value.get("value") and child(value, "low") is None):
        return {}
    kind = xsi_type(value)
    if kind == "PQ" or (not kind and value.get("unit")):
        return {"valueQuantity": quantity(value)} if value.get("value") else {}
    if kind in ("INT", "REAL"):
        return {"valueQuantity": {"value": number(value.get("value"))}}
    if kind == "BL":
        return {"valueBoolean": value.get("value") == "true"}
    if kind == "TS":
        stamp = ts(value.get("value"))
        return {"valueDateTime": stamp} if stamp else {}
    if kind == "IVL_PQ":
        ends = {side: quantity(q) for side in ("low", "high") if (q := child(value, side)) is not None
                and q.get("value")}
        return {"valueRange": ends} if ends else {}
    if kind in _CODED or value.get("code"):
        coded = concept(value, sec.refs)
        return {"valueCodeableConcept": coded} if coded else {}
    text = inline_text(value)
    return {"valueString": text} if text else {}


def _range(observation_range: Element) -> Resource | None:
    text = inline_text(child(observation_range, "text"))
    value = child(observation_range, "value")
    out: Resource = {}
    if value is not None and xsi_type(value) == "IVL_PQ":
        for side in ("low", "high"):
            q = child(value, side)
            if q is not None and q.get("value"):
                out[side] = quantity(q)
    if not text and out:
        text = "-".join(str(out[s]["value"]) for s in ("low", "high") if s in out)
        unit = next((out[s].get("unit") for s in ("low", "high") if s in out), None)
        text += f" {unit}" if unit else ""
    if text:
        out["text"] = text
    return out or None


def social_history(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    obs = child(entry, "observation")
    if obs is None:
        raise ValueError("no observation")
    pregnancy = _PREGNANCY_TEMPLATE in {t.get("root") for t in obs.findall("h:templateId", NS)} or (
        code_of(obs) == "ASSERTION" and code_of(obs, "value") == "77386006")
    negated = obs.get("negationInd") == "true"
    if negated and not pregnancy:
        raise ValueError("negated social history observation (nothing asserted)")
    resource = new_resource("observation", "Observation", ctx)
    resource["status"] = _OBSERVATION_STATUS.get(status_code(obs), "final")
    resource["category"] = [{"coding": [{"system": _OBS_CATEGORY, "code": "social-history"}]}]
    if pregnancy:
        resource["code"] = loinc("82810-3", "Pregnancy status")
        resource["valueCodeableConcept"] = (codeable(SNOMED, "60001007", "Not pregnant") if negated
                                            else concept(child(obs, "value"), sec.refs))
        if resource["valueCodeableConcept"] is None:
            raise ValueError("pregnancy observation without a value")
    else:
        smoking = has_template(obs, "78") and code_of(obs) in ("ASSERTION", "")
        code = loinc("72166-2", "Tobacco smoking status") if smoking else concept(child(obs, "code"), sec.refs)
        if code is None:
            raise ValueError("social history observation has no code")
        resource["code"] = code
        resource.update(value_of(child(obs, "value"), sec) or absent(child(obs, "value")))
    point, start, end = times(child(obs, "effectiveTime"))
    if point or (start and not end):
        resource["effectiveDateTime"] = point or start
    elif start or end:
        resource["effectivePeriod"] = {k: v for k, v in (("start", start), ("end", end)) if v}
    return [resource]


def procedures(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    act = next((el for tag in ("procedure", "observation", "act") if (el := child(entry, tag)) is not None), None)
    if act is None:
        raise ValueError("no procedure, observation or act")
    if act.get("moodCode") not in (None, "EVN"):
        raise ValueError(f"planned procedure (moodCode {act.get('moodCode')}), not one performed")
    code = concept(child(act, "code"), sec.refs, inline_text(child(act, "text")))
    if code is None:
        raise ValueError("procedure has no code")
    resource = new_resource("procedure", "Procedure", ctx)
    resource["status"] = ("not-done" if act.get("negationInd") == "true"
                          else _PROCEDURE_STATUS.get(status_code(act), "completed"))
    resource["code"] = code
    point, start, end = times(child(act, "effectiveTime"))
    if point:
        resource["performedDateTime"] = point
    elif start or end:
        resource["performedPeriod"] = {k: v for k, v in (("start", start), ("end", end)) if v}
    outcome = concept(child(act, "value"), sec.refs) if child(act, "value") is not None else None
    if outcome:
        resource["outcome"] = outcome
    reasons = [c for type_code, o in related(act) if type_code == "RSON" if (c := concept(child(o, "value"),
                                                                                            sec.refs))]
    if reasons:
        resource["reasonCode"] = reasons
    return [resource]


def encounters(entry: Element, where: str, sec: Section, ctx: Context) -> list[Resource]:
    encounter = child(entry, "encounter")
    if encounter is None:
        raise ValueError("no encounter")
    resource = new_resource("encounter", "Encounter", ctx)
    planned = encounter.get("moodCode") not in (None, "EVN")
    resource["status"] = "planned" if planned else _ENCOUNTER_STATUS.get(status_code(encounter), "finished")
    code = child(encounter, "code")
    act_class = code_of(encounter) if code is not None and code.get("codeSystem") == "2.16.840.1.113883.5.4" else ""
    resource["class"] = {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                         "code": act_class if act_class in _ENCOUNTER_CLASSES else "AMB"}
    kind = concept(code, sec.refs)
    if kind:
        resource["type"] = [kind]
    point, start, end = times(child(encounter, "effectiveTime"))
    start = start or point
    if start or end:
        resource["period"] = {k: v for k, v in (("start", start), ("end", end)) if v}
    reasons = [c for _, o in related(encounter) if has_template(o, "19") if (c := concept(child(o, "value"), sec.refs))]
    for _, act in related(encounter, "act"):  # encounter diagnoses (4.80) hold problem observations
        reasons += [c for _, o in related(act) if (c := concept(child(o, "value"), sec.refs))]
    if reasons:
        resource["reasonCode"] = reasons
    return [resource]
