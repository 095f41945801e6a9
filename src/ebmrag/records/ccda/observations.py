"""C-CDA results, vital signs, social history, procedures and encounters -> FHIR R4 resources.

A result organizer becomes a DiagnosticReport listing its Observations (the FHIR reader then reads the panel as
one line); a result without a value becomes an Observation with a dataAbsentReason rather than vanishing, since
"BUN not resulted" is itself information. Each component is converted on its own: one malformed result costs that
result only, and the note says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple
from xml.etree.ElementTree import Element

from ebmrag.records.ccda.values import (
    NS,
    SNOMED,
    Coded,
    Context,
    Resource,
    Section,
    absent,
    ccda_codes,
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
from ebmrag.rules import rule_file

_OBS_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"

_CODED = {"CD", "CE", "CV", "CO", "CS"}  # HL7 v3 coded data types
_PREGNANCY_TEMPLATE = "2.16.840.1.113883.10.20.15.3.8"  # Pregnancy Observation (C-CDA)
_ACT_CODE = "2.16.840.1.113883.5.4"  # HL7 v3 ActCode, the code system of an encounter's class


class PregnancyCodes(NamedTuple):
    pregnant: str  # the value of an ASSERTION that says "pregnant"
    status: Coded  # the code of the Observation it becomes
    not_pregnant: Coded  # the value of a negated one


@rule_file("records/drug_facts.toml")
def _pregnancy(raw: Mapping[str, Any]) -> PregnancyCodes:
    """drug_facts.toml [pregnancy.ccda]: the codes the reader writes, each one the [pregnancy] table lists."""
    table, ccda = raw["pregnancy"], raw["pregnancy"]["ccda"]
    codes = PregnancyCodes(str(ccda["pregnant"]), Coded.of(ccda.get("status"), "[pregnancy.ccda] status"),
                           Coded.of(ccda.get("not_pregnant"), "[pregnancy.ccda] not_pregnant"))
    for code, listed in ((codes.pregnant, "pregnant_answers"), (codes.status.code, "status_loinc"),
                         (codes.not_pregnant.code, "not_pregnant_answers")):
        if code not in table[listed]:
            raise ValueError(f"[pregnancy.ccda] writes {code}, which [pregnancy] {listed} does not list")
    return codes


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
    report["status"] = ccda_codes().act_status["report"].get(status_code(organizer), "unknown")
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
    resource["status"] = ccda_codes().act_status["observation"].get(status_code(obs), "unknown")
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
    codes, pregnancy_codes = ccda_codes(), _pregnancy()
    pregnancy = _PREGNANCY_TEMPLATE in {t.get("root") for t in obs.findall("h:templateId", NS)} or (
        code_of(obs) == "ASSERTION" and code_of(obs, "value") == pregnancy_codes.pregnant)
    negated = obs.get("negationInd") == "true"
    if negated and not pregnancy:
        raise ValueError("negated social history observation (nothing asserted)")
    resource = new_resource("observation", "Observation", ctx)
    resource["status"] = codes.act_status["observation"].get(status_code(obs), "final")
    resource["category"] = [{"coding": [{"system": _OBS_CATEGORY, "code": "social-history"}]}]
    if pregnancy:
        resource["code"] = loinc(*pregnancy_codes.status)
        resource["valueCodeableConcept"] = (codeable(SNOMED, *pregnancy_codes.not_pregnant) if negated
                                            else concept(child(obs, "value"), sec.refs))
        if resource["valueCodeableConcept"] is None:
            raise ValueError("pregnancy observation without a value")
    else:
        smoking = has_template(obs, "78") and code_of(obs) in ("ASSERTION", "")
        code = loinc(*codes.smoking) if smoking else concept(child(obs, "code"), sec.refs)
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
                          else ccda_codes().act_status["procedure"].get(status_code(act), "completed"))
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
    codes = ccda_codes()
    resource["status"] = "planned" if planned else codes.act_status["encounter"].get(status_code(encounter), "finished")
    code = child(encounter, "code")
    act_class = code_of(encounter) if code is not None and code.get("codeSystem") == _ACT_CODE else ""
    resource["class"] = {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                         "code": act_class if act_class in codes.encounter_classes else codes.unlisted_encounter_class}
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
