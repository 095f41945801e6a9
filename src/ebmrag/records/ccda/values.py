"""HL7 v3 data types of a C-CDA document -> FHIR R4 JSON values, and the code tables the reader works from.

The tables are rule files a clinician can read (rules/records/ccda.toml, read here as `ccda_codes()`; the sections
and code systems it shares with the FHIR reader in records.codes): which allergy type, status, severity or null
flavour code means what. A TS keeps its precision ("1998" stays a year): a reader that padded it to 1998-01-01
would invent a date. Every converter raises ValueError on a malformed value; the entry that holds it is then
skipped and reported, never the document.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from xml.etree.ElementTree import Element

from ebmrag.records.codes import code_systems, text_table
from ebmrag.rules import rule_file

Resource = dict[str, Any]
V3 = "urn:hl7-org:v3"
SDTC = "urn:hl7-org:sdtc"
NS = {"h": V3, "sdtc": SDTC}
XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"

# The FHIR system URIs the reader writes codes under (identifiers, as the namespaces above; every code system's OIDs
# and URI are in rules/records/code_systems.toml).
SNOMED, LOINC = "http://snomed.info/sct", "http://loinc.org"
_E = "2.16.840.1.113883.10.20.22.4."  # C-CDA entry templateIds: an entry is recognised by its extension ("7")
_TS = re.compile(r"(\d{4})(?:(\d{2})(?:(\d{2})(?:(\d{2})(?:(\d{2})(?:(\d{2})(\.\d{1,6})?)?)?)?)?)?"
                 r"([+-]\d{2}(?:\d{2})?)?")


class Coded(NamedTuple):
    """A code the reader writes, with its display name."""

    code: str
    display: str

    @classmethod
    def of(cls, raw: Any, where: str) -> Coded:
        if not isinstance(raw, Mapping) or not all(isinstance(raw.get(k), str) and raw[k] for k in ("code", "display")):
            raise ValueError(f"{where} needs a `code` and a `display`")
        return cls(raw["code"], raw["display"])


@dataclass(frozen=True)
class CcdaCodes:
    """rules/records/ccda.toml, checked: each table keyed by the code a C-CDA document writes."""

    allergy_category: Mapping[str, str]  # allergy type (SNOMED CT) -> AllergyIntolerance.category
    intolerance: frozenset[str]  # the allergy types that are intolerances
    generic_substances: frozenset[str]
    generic_problems: frozenset[str]
    clinical_status: Mapping[str, str]  # status observation value -> FHIR clinical status
    criticality: Mapping[str, str]  # severity / criticality value -> AllergyIntolerance.criticality
    severity: Mapping[str, str]  # severity value -> reaction severity
    status_observation: str  # the code of a status observation (LOINC 33999-4)
    criticality_observation: str
    severity_observation: str
    smoking: Coded
    act_status: Mapping[str, Mapping[str, str]]  # "medication" | "observation" | ... -> ActStatus -> FHIR status
    medication_ended: frozenset[str]
    encounter_classes: frozenset[str]
    unlisted_encounter_class: str
    null_flavors: Mapping[str, str]  # NullFlavor -> words
    absent_reasons: Mapping[str, str]  # NullFlavor -> data-absent-reason code
    gender: Mapping[str, str]
    address_use: Mapping[str, str]
    telecom_use: Mapping[str, str]


_FHIR_VALUES = {"category": {"medication", "food", "environment", "biologic"}, "type": {"allergy", "intolerance"},
                "status": {"active", "inactive", "resolved"}, "criticality": {"high", "low"},
                "severity": {"mild", "moderate", "severe"}}
_STATUS_TABLES = ("medication", "observation", "report", "procedure", "encounter")


def _coded_table(raw: Mapping[str, Any], table: str, fields: tuple[str, ...],
                 required: int) -> dict[str, dict[str, str]]:
    """`[table]` as code -> {field: FHIR code}: each entry has a `display`, at least `required` of `fields`, and
    only values FHIR defines for them."""
    found = raw[table]
    for code, entry in found.items():
        given = [f for f in fields if f in entry]
        if not isinstance(entry.get("display"), str) or len(given) < required:
            raise ValueError(f"[{table}] {code!r} needs a `display` and {' / '.join(fields)}")
        wrong = [f for f in given if entry[f] not in _FHIR_VALUES[f]]
        if wrong:
            raise ValueError(f"[{table}] {code!r}: {wrong[0]} {entry[wrong[0]]!r} is not one of "
                             f"{sorted(_FHIR_VALUES[wrong[0]])}")
    return {code: {f: entry[f] for f in fields if f in entry} for code, entry in found.items()}


@rule_file("records/ccda.toml")
def ccda_codes(raw: Mapping[str, Any]) -> CcdaCodes:
    def texts(table: str) -> dict[str, str]:
        found: Any = raw
        for part in table.split("."):
            found = found.get(part) if isinstance(found, Mapping) else None
        return text_table(found, table)

    types = _coded_table(raw, "allergy_type", ("category", "type"), 2)
    severities = _coded_table(raw, "severity", ("criticality", "severity"), 1)
    clinical = _coded_table(raw, "clinical_status", ("status",), 1)
    statuses = {table: texts(f"act_status.{table}") for table in _STATUS_TABLES}
    ended = frozenset(raw["act_status"]["medication_ended"])
    if not ended <= set(statuses["medication"]):
        raise ValueError("[act_status] medication_ended names a status [act_status.medication] does not map")
    observation, flavors = raw["observation"], raw["null_flavor"]
    if not all(isinstance(f.get("display"), str) for f in flavors.values()):
        raise ValueError("[null_flavor] every entry needs a `display`")
    return CcdaCodes(
        allergy_category={code: t["category"] for code, t in types.items()},
        intolerance=frozenset(code for code, t in types.items() if t["type"] == "intolerance"),
        generic_substances=frozenset(texts("generic_substance")),
        generic_problems=frozenset(texts("generic_problem")),
        clinical_status={code: s["status"] for code, s in clinical.items()},
        criticality={code: s["criticality"] for code, s in severities.items() if "criticality" in s},
        severity={code: s["severity"] for code, s in severities.items() if "severity" in s},
        status_observation=str(observation["status"]),
        criticality_observation=str(observation["criticality"]),
        severity_observation=str(observation["severity"]),
        smoking=Coded.of(observation["smoking"], "[observation] smoking"),
        act_status=statuses,
        medication_ended=ended,
        encounter_classes=frozenset(texts("encounter.class")),
        unlisted_encounter_class=str(raw["encounter"]["unlisted_class"]),
        null_flavors={code: f["display"] for code, f in flavors.items()},
        absent_reasons={code: f["absent_reason"] for code, f in flavors.items() if "absent_reason" in f},
        gender=texts("gender"), address_use=texts("address_use"), telecom_use=texts("telecom_use"))


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
    systems = code_systems()
    if system and not system.startswith(systems.fhir_oid_arc):
        out["system"] = systems.uri_by_oid.get(system) or (f"urn:oid:{system}" if re.fullmatch(r"[0-2](\.\d+)+", system)
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
    kind: str  # "allergies", "medications", ... (rules/records/sections.toml)
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
    flavor = str(value.get("nullFlavor") or "") if value is not None else ""
    reason: Resource = {"text": "no value recorded"}
    codes = ccda_codes()
    if flavor in codes.absent_reasons:
        reason["coding"] = [{"system": "http://terminology.hl7.org/CodeSystem/data-absent-reason",
                             "code": codes.absent_reasons[flavor], "display": codes.null_flavors.get(flavor, "")}]
    return {"dataAbsentReason": reason}


def loinc(code: str, display: str) -> Resource:
    return codeable(LOINC, code, display)
