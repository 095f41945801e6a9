"""A C-CDA R2.1 document -> a FHIR R4-shaped Bundle (plain dicts), so the lenient FHIR chart reader reads it.

Hospitals still exchange C-CDA XML (Continuity of Care Documents, discharge summaries, progress notes); rather than
a second chart reader, the document is turned into the resources that reader already understands. The XML comes
from outside: it is parsed with defusedxml (entity expansion and external entities refused). Only a document that
is not XML, not a ClinicalDocument, or names no patient is refused (RecordError); a defect inside one section or
entry costs that entry, and `bundle["ccda_notes"]` says what was not read and why.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import re
from collections.abc import Callable
from typing import Any
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException  # type: ignore[import-untyped]
from defusedxml import ElementTree as SafeElementTree

import ebmrag.records.ccda.entries as entries
import ebmrag.records.ccda.observations as observations
from ebmrag.errors import RecordError
from ebmrag.records.ccda.narrative import narrative_ids, plain_text, to_xhtml
from ebmrag.records.ccda.values import (
    NS,
    V3,
    Context,
    Resource,
    Section,
    ccda_codes,
    child,
    concept,
    inline_text,
    templates,
    ts,
)
from ebmrag.records.codes import document_sections

_HANDLERS: dict[str, Callable[[Element, str, Section, Context], list[Resource]]] = {
    "allergies": entries.allergies, "medications": entries.medications, "problems": entries.problems,
    "diagnoses": entries.problems, "immunizations": entries.immunizations, "results": observations.results,
    "vital-signs": observations.results, "social-history": observations.social_history,
    "procedures": observations.procedures, "encounters": observations.encounters,
}
_ENTRY_ERRORS = (ValueError, KeyError, AttributeError, TypeError, IndexError)
_ROOT = re.compile(r"<(?:([A-Za-z_][\w.-]*):)?ClinicalDocument[\s>/]")
_PROLOG = re.compile(r"\s*(?:<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>]*>)", re.S)
_SSN_ROOT = "2.16.840.1.113883.4.1"  # US social security number: an identifier, never a resource id


def _text_of(data: bytes | str) -> str:
    if isinstance(data, str):
        return data.lstrip("\ufeff")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8", errors="replace").lstrip("\ufeff")


def is_ccda(data: bytes | str) -> bool:
    """Cheap sniff: the first element (after a BOM, the XML declaration, stylesheet instructions and comments)
    is ClinicalDocument in the HL7 v3 namespace. Nothing is parsed."""
    head = _text_of(data[:65536])
    position = 0
    while match := _PROLOG.match(head, position):
        position = match.end()
    root = _ROOT.match(head, len(head) - len(head[position:].lstrip()))
    if not root:
        return False
    tag_end = head.find(">", root.start())
    start_tag = head[root.start(): tag_end if tag_end > 0 else len(head)]
    namespace = f"xmlns:{root.group(1)}" if root.group(1) else "xmlns"
    return re.search(rf"\s{re.escape(namespace)}\s*=\s*[\"']{re.escape(V3)}[\"']", start_tag) is not None


def _parse(data: bytes | str, origin: str) -> Element:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        root: Element = SafeElementTree.fromstring(raw, forbid_dtd=False, forbid_entities=True,
                                                   forbid_external=True)
    except DefusedXmlException as exc:
        raise RecordError(origin, f"refused XML: {exc} (entity declarations and external references are not "
                                  "read)") from None
    except (ParseError, ValueError, UnicodeError) as exc:
        raise RecordError(origin, f"not well-formed XML: {exc}") from None
    if root.tag != f"{{{V3}}}ClinicalDocument":
        raise RecordError(origin, f"the root element is {root.tag!r}, not an HL7 v3 ClinicalDocument")
    return root


def _patient_role(root: Element, origin: str) -> Element:
    role = root.find("h:recordTarget/h:patientRole", NS)
    if role is None:
        raise RecordError(origin, "the ClinicalDocument has no recordTarget/patientRole: no patient to read")
    return role


def _patient_id(role: Element) -> str:
    for el in role.findall("h:id", NS):
        if el.get("extension") and el.get("root") != _SSN_ROOT:
            raw = f"{el.get('root')}-{el.get('extension')}" if el.get("root") else str(el.get("extension"))
            safe = re.sub(r"[^A-Za-z0-9.-]+", "-", raw).strip("-")
            return safe[-64:] if safe else "ccda-patient"
    return "ccda-patient"


def _names(person: Element | None) -> list[Resource]:
    out = []
    for name in person.findall("h:name", NS) if person is not None else []:
        if name.get("nullFlavor"):
            continue
        parts = {key: [inline_text(el) for el in name.findall(f"h:{key}", NS) if inline_text(el)]
                 for key in ("prefix", "given", "family", "suffix")}
        human: Resource = {k: v for k, v in parts.items() if v and k != "family"}
        if parts["family"]:
            human["family"] = " ".join(parts["family"])
        text = " ".join([*parts["prefix"], *parts["given"], *parts["family"], *parts["suffix"]]) or inline_text(name)
        if not text:
            continue
        human["text"] = text
        if name.get("use") == "L":
            human["use"] = "official"
        out.append(human)
    return out


def _addresses(el: Element) -> list[Resource]:
    out = []
    for addr in el.findall("h:addr", NS):
        fields: Resource = {"line": [t for line in addr.findall("h:streetAddressLine", NS) if (t := inline_text(line))]}
        for key in ("city", "state", "postalCode", "country"):
            fields[key] = inline_text(addr.find(f"h:{key}", NS))
        fields = {k: v for k, v in fields.items() if v}
        if fields and (use := ccda_codes().address_use.get(str(addr.get("use")))):
            fields["use"] = use
        if fields:
            out.append(fields)
    return out


def _telecoms(el: Element) -> list[Resource]:
    out = []
    for telecom in el.findall("h:telecom", NS):
        value = (telecom.get("value") or "").strip()
        if not value:
            continue
        scheme, _, rest = value.partition(":")
        system = {"tel": "phone", "mailto": "email", "fax": "fax", "http": "url", "https": "url"}.get(scheme.lower())
        contact: Resource = {"system": system or "other", "value": rest.strip() if system in ("phone", "email", "fax")
                             else value}
        if use := ccda_codes().telecom_use.get(str(telecom.get("use"))):
            contact["use"] = use
        out.append(contact)
    return out


def _lenient_ts(value: str | None) -> str | None:
    """A header date that is no date is left out (the patient is still read), never an error."""
    try:
        return ts(value)
    except ValueError:
        return None


def _patient(role: Element, pid: str) -> Resource:
    patient = role.find("h:patient", NS)
    resource: Resource = {"resourceType": "Patient", "id": pid}
    identifiers = [{"system": f"urn:oid:{el.get('root')}", "value": str(el.get("extension"))}
                   for el in role.findall("h:id", NS) if el.get("extension") and el.get("root")]
    optional: Resource = {"identifier": identifiers, "name": _names(patient), "address": _addresses(role),
                          "telecom": _telecoms(role)}
    resource.update({k: v for k, v in optional.items() if v})
    gender = child(patient, "administrativeGenderCode")
    resource["gender"] = ccda_codes().gender.get(str(gender.get("code") if gender is not None else ""), "unknown")
    birth = child(patient, "birthTime")
    born = _lenient_ts(birth.get("value")) if birth is not None else None
    if born:
        resource["birthDate"] = born[:10]
    deceased = patient.find("sdtc:deceasedTime", NS) if patient is not None else None
    died = _lenient_ts(deceased.get("value")) if deceased is not None else None
    if died:
        resource["deceasedDateTime"] = died
    languages = [_language(comm) for comm in (patient.findall("h:languageCommunication", NS)
                                               if patient is not None else [])]
    languages = [lang for lang in languages if lang]
    if languages:
        resource["communication"] = languages
    return resource


def _language(communication: Element) -> Resource | None:
    code = communication.find("h:languageCode", NS)
    if code is None or not code.get("code"):
        return None
    language: Resource = {"language": {"coding": [{"system": "urn:ietf:bcp:47", "code": str(code.get("code"))}],
                                       "text": str(code.get("code"))}}
    preference = communication.find("h:preferenceInd", NS)
    if preference is not None and preference.get("value") == "true":
        language["preferred"] = True
    return language


def _section_label(section: Element) -> str:
    code = section.find("h:code", NS)
    number = code.get("code") if code is not None else None
    title = inline_text(section.find("h:title", NS)) or (code.get("displayName") if code is not None else "") or ""
    return " ".join(p for p in (number or "(no code)", title) if p)


def _kind(section: Element) -> str | None:
    code = section.find("h:code", NS)
    known = document_sections()
    by_code = known.kind_by_loinc.get(str(code.get("code"))) if code is not None else None
    return by_code or next((known.kind_by_template[t] for t in sorted(templates(section))
                            if t in known.kind_by_template), None)


def _sections(parent: Element) -> list[Element]:
    return [s for s in parent.findall("h:component/h:section", NS)]


def _read_section(section: Element, ctx: Context, made: list[Resource]) -> Resource:
    """One section -> its Composition.section (title, code, XHTML narrative, entry references); its entries'
    resources are appended to `made`."""
    label = _section_label(section)
    text = section.find("h:text", NS)
    out: Resource = {"title": inline_text(section.find("h:title", NS)) or label}
    code = concept(section.find("h:code", NS), {})
    if code:
        out["code"] = code
    flavor = section.get("nullFlavor")
    kind = _kind(section)
    div = to_xhtml(text) if text is not None and not flavor else ""
    if div:
        out["text"] = {"status": "generated", "div": div}
    if flavor:
        ctx.notes.append(f"section {label}: nullFlavor {flavor} ({ccda_codes().null_flavors.get(flavor, 'null')})")
    elif kind:
        sec = Section(kind, label, {**ctx.refs, **narrative_ids(text)})
        resources = _read_entries(section, sec, ctx)
        made += resources
        references = [{"reference": f"{r['resourceType']}/{r['id']}"} for r in resources]
        if references:
            out["entry"] = references
    elif section.findall("h:entry", NS):
        ctx.notes.append(f"section {label}: {len(section.findall('h:entry', NS))} structured entries not read "
                         "(section kind not converted; its narrative is kept)")
    subsections = [_read_section(s, ctx, made) for s in _sections(section)]
    if subsections:
        out["section"] = subsections
    if not (div or out.get("entry") or subsections):
        out["emptyReason"] = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/list-empty-reason",
                                          "code": "unavailable"}]}
    return out


def _read_entries(section: Element, sec: Section, ctx: Context) -> list[Resource]:
    made: list[Resource] = []
    for n, entry in enumerate(section.findall("h:entry", NS), start=1):
        where = f"entry {n} of section {sec.label}"
        try:
            made += _HANDLERS[sec.kind](entry, where, sec, ctx)
        except _ENTRY_ERRORS as exc:
            ctx.notes.append(f"{where}: {exc}")
    return made


def _composition(root: Element, ctx: Context, sections: list[Resource]) -> Resource:
    kind = concept(root.find("h:code", NS), {}) or {"text": "Clinical document"}
    composition: Resource = {"resourceType": "Composition", "id": "ccda-composition", "status": "final",
                             "type": kind, "subject": dict(ctx.patient)}
    date = _document_date(root, ctx)
    if date:
        composition["date"] = date
    author = root.find("h:author/h:assignedAuthor", NS)
    names = _names(author.find("h:assignedPerson", NS)) if author is not None else []
    device = inline_text(author.find("h:assignedAuthoringDevice/h:softwareName", NS)) if author is not None else ""
    composition["author"] = [{"display": names[0]["text"] if names else device or "author not stated"}]
    composition["title"] = inline_text(root.find("h:title", NS)) or kind.get("text") or "Clinical document"
    if sections:
        composition["section"] = sections
    return composition


def _document_date(root: Element, ctx: Context) -> str | None:
    effective = root.find("h:effectiveTime", NS)
    try:
        return ts(effective.get("value")) if effective is not None else None
    except ValueError as exc:
        ctx.notes.append(f"document effectiveTime unreadable: {exc}")
        return None


def _non_xml(body: Element) -> tuple[str, str]:
    """(media type, base64 data) of a nonXMLBody's <text>."""
    text = body.find("h:text", NS)
    if text is None:
        raise ValueError("nonXMLBody without <text>")
    media = text.get("mediaType") or "text/plain"
    if text.get("representation") == "B64":
        data = re.sub(r"\s+", "", text.text or "")
        base64.b64decode(data, validate=True)  # binascii.Error (a ValueError) when it is not base64
        return media, data
    outside = text.find("h:reference", NS)
    if outside is not None:
        raise ValueError(f"nonXMLBody refers to an outside file ({outside.get('value')!r}) that is not part of "
                         "this document")
    return media, base64.b64encode("".join(text.itertext()).strip().encode("utf-8")).decode("ascii")


def _document_reference(root: Element, body: Element, ctx: Context) -> Resource | None:
    try:
        media, data = _non_xml(body)
    except (ValueError, binascii.Error) as exc:
        ctx.notes.append(f"nonXMLBody: {exc}")
        return None
    resource: Resource = {"resourceType": "DocumentReference", "id": "ccda-document", "status": "current",
                          "subject": dict(ctx.patient)}
    kind = concept(root.find("h:code", NS), {})
    if kind:
        resource["type"] = kind
    date = _document_date(root, ctx)
    if date and re.fullmatch(r".*T\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)", date):
        resource["date"] = date  # an instant: full time and zone
    elif date:
        resource["context"] = {"period": {"start": date}}
    title = inline_text(root.find("h:title", NS))
    attachment: Resource = {"contentType": media, "data": data}
    if title:
        attachment["title"] = title
    resource["content"] = [{"attachment": attachment}]
    return resource


def bundle_from_ccda(data: bytes | str, origin: str) -> dict[str, Any]:
    """The document as a FHIR R4 `collection` Bundle: Patient, then the resources of each structured section and a
    Composition holding every section's narrative, or a DocumentReference for an unstructured (nonXMLBody)
    document. `ccda_notes` (not a FHIR element) lists what was not read."""
    root = _parse(data, origin)
    role = _patient_role(root, origin)
    pid = _patient_id(role)
    ctx = Context({"reference": f"Patient/{pid}"}, refs=narrative_ids(root))
    resources: list[Resource] = [_patient(role, pid)]
    body = root.find("h:component/h:structuredBody", NS)
    unstructured = root.find("h:component/h:nonXMLBody", NS)
    if body is not None:
        made: list[Resource] = []
        sections = []
        for section in _sections(body):
            try:
                sections.append(_read_section(section, ctx, made))
            except _ENTRY_ERRORS as exc:
                ctx.notes.append(f"section {_section_label(section)}: {exc}")
        resources += [*made, _composition(root, ctx, sections)]
    elif unstructured is not None:
        reference = _document_reference(root, unstructured, ctx)
        resources += [reference] if reference else []
    else:
        ctx.notes.append("the document has neither a structuredBody nor a nonXMLBody")
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"fullUrl": f"{r['resourceType']}/{r['id']}", "resource": r} for r in resources],
            "ccda_notes": ctx.notes}


def ccda_patient(data: bytes | str, origin: str) -> Resource:
    """The document's patient as a FHIR Patient (header only): to check that a C-CDA found inside another
    chart's attachment is about that chart's patient."""
    role = _patient_role(_parse(data, origin), origin)
    return _patient(role, _patient_id(role))


def ccda_narrative(data: bytes | str, origin: str) -> list[tuple[str, str]]:
    """(section title, plain text) of every section's narrative, nested sections included, plus the text of a
    nonXMLBody (plain text decoded; a PDF read by ebmrag.records.attachments when that module is present)."""
    root = _parse(data, origin)
    out: list[tuple[str, str]] = []
    body = root.find("h:component/h:structuredBody", NS)
    pending = _sections(body) if body is not None else []
    while pending:
        section = pending.pop(0)
        text = plain_text(section.find("h:text", NS))
        if text:
            out.append((inline_text(section.find("h:title", NS)) or _section_label(section), text))
        pending[0:0] = _sections(section)
    unstructured = root.find("h:component/h:nonXMLBody", NS)
    if unstructured is not None:
        title = inline_text(root.find("h:title", NS)) or "Document"
        text = _body_text(unstructured)
        if text:
            out.append((title, text))
    return out


def _body_text(body: Element) -> str:
    try:
        media, data = _non_xml(body)
    except (ValueError, binascii.Error):
        return ""
    if media.split(";")[0].strip().lower() == "text/plain":
        return base64.b64decode(data).decode("utf-8", errors="replace").strip()
    try:
        reader = importlib.import_module("ebmrag.records.attachments").attachment_text
    except (ImportError, AttributeError):
        return ""
    try:
        text, _ = reader({"contentType": media, "data": data})
    except Exception:  # another module's reader: a failure there costs this text only
        return ""
    return str(text or "").strip()
