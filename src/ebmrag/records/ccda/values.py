"""HL7 v3 data types of a C-CDA document -> FHIR R4 JSON values, and the vocabulary tables the reader works from.

The tables are data at the top of the module (not code paths): which section LOINC code or templateId is read
by which handler, which code-system OID is which FHIR system URI. A TS keeps its precision ("1998" stays a year):
a reader that padded it to 1998-01-01 would invent a date. Every converter raises ValueError on a malformed value;
the entry that holds it is then skipped and reported, never the document.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from xml.etree.ElementTree import Element

Resource = dict[str, Any]
V3 = "urn:hl7-org:v3"
SDTC = "urn:hl7-org:sdtc"
NS = {"h": V3, "sdtc": SDTC}
XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"

# Code-system OID -> FHIR system URI; unknown OIDs become urn:oid:<oid>.
OID_SYSTEMS: dict[str, str] = {
    "2.16.840.1.113883.6.96": "http://snomed.info/sct",
    "2.16.840.1.113883.6.1": "http://loinc.org",
    "2.16.840.1.113883.6.88": "http://www.nlm.nih.gov/research/umls/rxnorm",
    "2.16.840.1.113883.6.90": "http://hl7.org/fhir/sid/icd-10-cm",
    "2.16.840.1.113883.6.3": "http://hl7.org/fhir/sid/icd-10",
    "2.16.840.1.113883.6.103": "http://hl7.org/fhir/sid/icd-9-cm",
    "2.16.840.1.113883.6.104": "http://hl7.org/fhir/sid/icd-9-cm",
    "2.16.840.1.113883.12.292": "http://hl7.org/fhir/sid/cvx",
    "2.16.840.1.113883.6.12": "http://www.ama-assn.org/go/cpt",
    "2.16.840.1.113883.6.4": "http://www.cms.gov/Medicare/Coding/ICD10",
    "2.16.840.1.113883.4.9": "http://fdasis.nlm.nih.gov",
    "2.16.840.1.113883.3.26.1.1": "http://ncithesaurus-stage.nci.nih.gov",
    "2.16.840.1.113883.6.8": "http://unitsofmeasure.org",
    "2.16.840.1.113883.5.83": "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation",
    "2.16.840.1.113883.5.4": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
    "2.16.840.1.113883.5.1": "http://terminology.hl7.org/CodeSystem/v3-AdministrativeGender",
}
# FHIR's own code systems registered under this arc: their OID says nothing a reader needs, the coding keeps no system.
FHIR_OID_ARC = "2.16.840.1.113883.4.642.3."
SNOMED, LOINC = OID_SYSTEMS["2.16.840.1.113883.6.96"], OID_SYSTEMS["2.16.840.1.113883.6.1"]

# Section kind by LOINC code, then by templateId (C-CDA R1.1 and R2.1 roots; "C-CDAV2-DDN" sections need it).
SECTION_CODES: dict[str, str] = {
    "48765-2": "allergies",
    "10160-0": "medications", "10183-2": "medications", "75311-1": "medications", "42346-7": "medications",
    "11450-4": "problems", "11348-0": "problems",
    "11535-2": "diagnoses", "78375-3": "diagnoses", "46241-6": "diagnoses", "42347-5": "diagnoses",
    "29548-5": "diagnoses",
    "30954-2": "results", "8716-3": "vital-signs", "47519-4": "procedures", "46240-8": "encounters",
    "11369-6": "immunizations", "29762-2": "social-history",
}
_T = "2.16.840.1.113883.10.20.22.2."
SECTION_TEMPLATES: dict[str, str] = {
    _T + "6": "allergies", _T + "6.1": "allergies",
    _T + "1": "medications", _T + "1.1": "medications", _T + "11": "medications", _T + "11.1": "medications",
    _T + "44": "medications",
    _T + "5": "problems", _T + "5.1": "problems", _T + "20": "problems",
    _T + "24": "diagnoses", _T + "43": "diagnoses",
    _T + "3": "results", _T + "3.1": "results", _T + "4": "vital-signs", _T + "4.1": "vital-signs",
    _T + "7": "procedures", _T + "7.1": "procedures", _T + "22": "encounters", _T + "22.1": "encounters",
    _T + "2": "immunizations", _T + "2.1": "immunizations", _T + "17": "social-history",
}
NULL_FLAVORS = {
    "NI": "no information", "NA": "not applicable", "UNK": "unknown", "ASKU": "asked but unknown",
    "NAV": "temporarily unavailable", "NASK": "not asked", "MSK": "masked", "OTH": "other", "NP": "not present",
}
_E = "2.16.840.1.113883.10.20.22.4."
_ABSENT = {"NI": "unknown", "UNK": "unknown", "ASKU": "asked-unknown", "NAV": "temp-unknown",
           "NASK": "not-asked", "MSK": "masked", "NA": "not-applicable"}
_TS = re.compile(r"(\d{4})(?:(\d{2})(?:(\d{2})(?:(\d{2})(?:(\d{2})(?:(\d{2})(\.\d{1,6})?)?)?)?)?)?"
                 r"([+-]\d{2}(?:\d{2})?)?")


@dataclass
class Context:
    """What every handler shares: the patient reference, the narrative's ID -> text map, the report of what was
    not read, and id counters (ccda-allergy-1, ccda-allergy-2, ...)."""

    patient: dict[str, str]
    refs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)

    def new_id(self, kind: str) -> str:
        self.counters[kind] += 1
        return f"ccda-{kind}-{self.counters[kind]}"


def ts(value: str | None) -> str | None:
    """HL7 TS -> FHIR date/dateTime at the same precision: 2014 -> "2014", 201409 -> "2014-09",
    20140917103026-0500 -> "2014-09-17T10:30:26-05:00". A zone on a date-only value is dropped (a FHIR date
    has none). None or "" -> None; anything else malformed -> ValueError."""
    if value is None or not value.strip():
        return None
    match = _TS.fullmatch(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not an HL7 timestamp (YYYYMMDDHHMMSS[.S][+ZZZZ])")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0), int(second or 0))
    if zone and (int(zone[1:3]) > 14 or int(zone[3:] or 0) > 59):
        raise ValueError(f"{value!r}: time zone {zone} out of range")
    date = "-".join(p for p in (year, month, day) if p)
    if hour is None:
        return date
    offset = f"{zone[:3]}:{zone[3:] or '00'}" if zone else ""
    return f"{date}T{hour}:{minute or '00'}:{second or '00'}{fraction or ''}{offset}"


def times(el: Element | None) -> tuple[str | None, str | None, str | None]:
    """An effectiveTime (TS or IVL_TS) -> (point, start, end); a nullFlavor anywhere reads as absent."""
    if el is None or el.get("nullFlavor"):
        return None, None, None
    low, high, center = (el.find(f"h:{name}", NS) for name in ("low", "high", "center"))
    point = ts(el.get("value")) or (ts(center.get("value")) if center is not None else None)
    start = ts(low.get("value")) if low is not None else None
    end = ts(high.get("value")) if high is not None else None
    return point, start, end


def xsi_type(el: Element) -> str:
    return (el.get(XSI_TYPE) or "").split(":")[-1].upper()


def templates(el: Element) -> set[str]:
    return {str(t.get("root")) for t in el.findall("h:templateId", NS)}


def inline_text(el: Element | None) -> str:
    """An element's text with whitespace collapsed ("" for None)."""
    return " ".join("".join(el.itertext()).split()) if el is not None else ""


def resolve(el: Element | None, refs: dict[str, str]) -> str:
    """The narrative text a <reference value="#id"/> inside `el` points to ("" if none); the '#' is optional."""
    ref = el.find("h:reference", NS) if el is not None else None
    target = (ref.get("value") or "").lstrip("#") if ref is not None else ""
    return refs.get(target, "") if target else ""


def coding(system: str | None, code: str | None, display: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if system and not system.startswith(FHIR_OID_ARC):
        out["system"] = OID_SYSTEMS.get(system) or (f"urn:oid:{system}" if re.fullmatch(r"[0-2](\.\d+)+", system)
                                                    else f"urn:uuid:{system.lower()}")
    if code:
        out["code"] = code.strip()
    if display and display.strip():
        out["display"] = " ".join(display.split())
    return out


def concept(el: Element | None, refs: dict[str, str], fallback_text: str = "") -> dict[str, Any] | None:
    """CD/CE -> CodeableConcept: the code (unless null-flavoured) and its translations as codings; the text is the
    code's own display name when it is coded (what the code means: a narrative reference can point at the wrong
    cell, as in NIST's sample whose penicillin allergen references the "Hives" cell), else originalText (through
    its narrative reference first), else a translation's display, else `fallback_text`."""
    if el is None:
        return None
    codings = []
    if el.get("code") and not el.get("nullFlavor"):
        codings.append(coding(el.get("codeSystem"), el.get("code"), el.get("displayName")))
    for translation in el.findall("h:translation", NS):
        if translation.get("code") and not translation.get("nullFlavor"):
            codings.append(coding(translation.get("codeSystem"), translation.get("code"),
                                  translation.get("displayName")))
    original = el.find("h:originalText", NS)
    own = " ".join((original.text or "").split()) if original is not None else ""
    displays = [c["display"] for c in codings if c.get("display")]
    coded = el.get("displayName") if el.get("code") and not el.get("nullFlavor") else None
    text = (coded or "").strip() or resolve(original, refs) or own or (displays[0] if displays else "") \
        or fallback_text
    if not codings and not text:
        return None
    out: dict[str, Any] = {"coding": codings} if codings else {}
    if text:
        out["text"] = text
    return out


def number(raw: str | None) -> int | float:
    """"25" -> 25, "13.2" -> 13.2; ValueError for anything that is not a finite decimal."""
    if raw is None or not re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", raw):
        raise ValueError(f"{raw!r} is not a number")
    text = raw.strip()
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)


def quantity(el: Element) -> dict[str, Any]:
    """PQ -> Quantity {value, unit} (UCUM system and code when there is a unit other than "1")."""
    out: dict[str, Any] = {"value": number(el.get("value"))}
    unit = (el.get("unit") or "").strip()
    if unit and unit != "1":
        out.update(unit=unit, system="http://unitsofmeasure.org", code=unit)
    return out


def codeable(system: str, code: str, display: str) -> dict[str, Any]:
    return {"coding": [{"system": system, "code": code, "display": display}], "text": display}


def status_concept(kind: str, code: str) -> dict[str, Any]:
    """clinicalStatus / verificationStatus CodeableConcept of FHIR's own code systems."""
    return {"coding": [{"system": f"http://terminology.hl7.org/CodeSystem/{kind}", "code": code}]}


@dataclass(frozen=True)
class Section:
    kind: str  # "allergies", "medications", ... (values.SECTION_CODES)
    label: str  # "48765-2 Allergies" in notes
    refs: dict[str, str]  # narrative ID -> text (this section's over the document's)


Handler = Callable[[Element, str, Section, Context], list[Resource]]


def child(el: Element | None, path: str) -> Element | None:
    return el.find("/".join(f"h:{step}" for step in path.split("/")), NS) if el is not None else None


def status_code(el: Element | None) -> str:
    found = child(el, "statusCode")
    return str(found.get("code") or "") if found is not None else ""


def related(el: Element | None, tag: str = "observation") -> Iterator[tuple[str, Element]]:
    """(entryRelationship typeCode, the <tag> it holds) for each relationship of `el`."""
    for relation in el.findall("h:entryRelationship", NS) if el is not None else []:
        found = relation.find(f"h:{tag}", NS)
        if found is not None:
            yield str(relation.get("typeCode") or ""), found


def code_of(el: Element | None, path: str = "code") -> str:
    found = child(el, path)
    return str(found.get("code") or "") if found is not None and not found.get("nullFlavor") else ""


def has_template(el: Element, template: str, code: str = "") -> bool:
    return _E + template in templates(el) or bool(code and code_of(el) == code)


def new_resource(kind: str, resource_type: str, ctx: Context, subject_key: str = "subject") -> Resource:
    return {"resourceType": resource_type, "id": ctx.new_id(kind), subject_key: dict(ctx.patient)}


def absent(value: Element | None) -> Resource:
    flavor = value.get("nullFlavor") if value is not None else None
    reason: Resource = {"text": "no value recorded"}
    if flavor in _ABSENT:
        reason["coding"] = [{"system": "http://terminology.hl7.org/CodeSystem/data-absent-reason",
                             "code": _ABSENT[flavor], "display": NULL_FLAVORS.get(str(flavor), "")}]
    return {"dataAbsentReason": reason}


def loinc(code: str, display: str) -> Resource:
    return codeable(LOINC, code, display)
