"""Patient record loaders: ebmrag JSON, AgentClinic OSCE cases, FHIR R4 Bundles, FHIR Bulk Data NDJSON,
C-CDA R2.1 documents and plain clinical text.

Every loader returns `PatientRecord`s whose fragments all carry the record's patient id; a fragment
that names another patient is an error, never silently merged. Errors name the file and the field
(`record.json: fragments[3].timestamp: ...`). Timestamps are made timezone-aware (naive = UTC) so
ages can be compared across sources.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.records.fragment import Fragment, PatientRecord, parse_timestamp
from ebmrag.records.limits import check_xml_depth, load_json
from ebmrag.records.params import ChartParams
from ebmrag.text.sentences import split_sentences


def _optional_str(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{where}.{key}", f"must be a string or null, got {type(value).__name__}")
    return value


def _required_str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        problem = "is missing" if key not in raw else "must be a non-empty string"
        raise RecordError(f"{where}.{key}", problem)
    return value


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def control_character(value: str) -> str | None:
    """A C0 control character other than tab and line breaks (NUL, ESC, ...), described with its offset, or None.
    No such character belongs in an id, and PostgreSQL refuses NUL in any text column while SQLite stores it:
    refusing them where ids enter (records, result messages) makes both backends answer alike."""
    match = _CONTROL.search(value)
    return f"a control character (U+{ord(match.group()):04X}) at character {match.start()}" if match else None


def _id(value: str | None, where: str) -> str | None:
    """An id as given, or RecordError naming the field when it holds a control character."""
    problem = control_character(value) if value is not None else None
    if problem:
        raise RecordError(where, f"contains {problem}; ids must be printable text")
    return value


RECORD_FIELDS = frozenset({"patient_id", "fragments", "query"})  # "query": a demo record's example question
FRAGMENT_FIELDS = frozenset({"id", "patient_id", "text", "section", "timestamp", "source", "encounter"})


def _known_fields(data: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    """A misspelt field ("timestmp") would otherwise be dropped without a word, and its value lost."""
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise RecordError(where, f"unknown fields {unknown}; the fields are {sorted(known)}")


def record_from_json(data: Any, origin: str) -> PatientRecord:
    """The native format: {"patient_id", "fragments": [{"id", "text", "section"?, "timestamp"?, "source"?,
    "encounter"?}]}."""
    if not isinstance(data, Mapping):
        raise RecordError(origin, "a patient record must be a JSON object")
    _known_fields(data, RECORD_FIELDS, origin)
    patient_id = _required_str(data, "patient_id", origin)
    _id(patient_id, f"{origin}.patient_id")
    raw_fragments = data.get("fragments")
    if not isinstance(raw_fragments, list):
        raise RecordError(f"{origin}.fragments", "must be a list of fragment objects")
    if not raw_fragments:
        raise RecordError(f"{origin}.fragments", "is empty: a record needs at least one fragment")
    fragments = []
    for index, raw in enumerate(raw_fragments):
        where = f"{origin}: fragments[{index}]"
        if not isinstance(raw, Mapping):
            raise RecordError(where, "must be an object")
        _known_fields(raw, FRAGMENT_FIELDS, where)
        owner = raw.get("patient_id", patient_id)
        if owner != patient_id:
            raise RecordError(f"{where}.patient_id", f"{owner!r} differs from the record's {patient_id!r}")
        fragments.append(
            Fragment(
                id=str(_id(_required_str(raw, "id", where), f"{where}.id")),
                patient_id=patient_id,
                text=_required_str(raw, "text", where),
                section=_optional_str(raw, "section", where),
                timestamp=parse_timestamp(raw.get("timestamp"), f"{where}.timestamp"),
                source=_id(_optional_str(raw, "source", where), f"{where}.source"),
                encounter=_id(_optional_str(raw, "encounter", where), f"{where}.encounter"),
            )
        )
    return PatientRecord(patient_id, tuple(fragments), origin)


# --------------------------------------------------------------------------- AgentClinic
_AGENTCLINIC_HIDDEN = {"Correct_Diagnosis", "Objective_for_Doctor"}  # the gold answer and the examiner's brief


def _render(value: Any) -> str:
    """Flatten a nested OSCE value into 'Key: value; Key: value' text."""
    if isinstance(value, Mapping):
        return "; ".join(f"{k.replace('_', ' ')}: {_render(v)}" for k, v in value.items() if _render(v))
    if isinstance(value, list):
        return ", ".join(_render(v) for v in value if _render(v))
    return "" if value is None else str(value).strip()


def record_from_agentclinic(case: Mapping[str, Any], origin: str, patient_id: str) -> PatientRecord:
    """One fragment per second-level OSCE field (History, Vital_Signs, Blood_Work, Biopsy, ...).

    The field path becomes the section ("Test_Results > Biopsy"), which is what the tier rules read.
    The diagnosis and the examiner's objective are never turned into fragments.
    """
    exam = case.get("OSCE_Examination")
    if not isinstance(exam, Mapping):
        raise RecordError(f"{origin}.OSCE_Examination", "is missing or not an object")
    fragments = []
    for group, content in exam.items():
        if group in _AGENTCLINIC_HIDDEN:
            continue
        items = content.items() if isinstance(content, Mapping) else [("", content)]
        for field, value in items:
            text = _render(value)
            if not text:
                continue
            section = " > ".join(p for p in (group, field) if p)
            fragment_id = f"{group}.{field}".strip(".").lower()
            fragments.append(Fragment(fragment_id, patient_id, text, section=section, source="agentclinic"))
    if not fragments:
        raise RecordError(origin, "the OSCE case has no patient fields to turn into fragments")
    return PatientRecord(patient_id, tuple(fragments), origin)


def record_from_text(text: str, origin: str, patient_id: str) -> PatientRecord:
    """Free clinical text: one fragment per sentence (ids s1, s2, ...), no section, no timestamp."""
    fragments = tuple(
        Fragment(f"s{i}", patient_id, s.text, source=origin) for i, s in enumerate(split_sentences(text), 1)
    )
    if not fragments:
        raise RecordError(origin, "the text is empty: no sentence to make a fragment of")
    return PatientRecord(patient_id, fragments, origin)


# --------------------------------------------------------------------------- dispatch
def records_from_data(data: Any, origin: str, default_id: str, params: ChartParams | None = None
                      ) -> Iterator[PatientRecord]:
    params = params or ChartParams()
    if isinstance(data, Mapping) and data.get("resourceType") == "Bundle":
        from ebmrag.records.fhir.bundle import record_from_fhir_bundle

        yield record_from_fhir_bundle(data, origin, stale_after=params.stale_after, today=params.today())
    elif isinstance(data, Mapping) and isinstance(data.get("resourceType"), str):
        raise RecordError(origin, f"a single FHIR {data['resourceType']} resource, not a chart: give a Bundle, "
                                  "a Bulk Data NDJSON export (one resource per line) or a folder of them")
    elif isinstance(data, Mapping) and "OSCE_Examination" in data:
        case_id = data.get("case_index", default_id)
        yield record_from_agentclinic(data, origin, f"agentclinic-{case_id}")
    elif isinstance(data, Mapping) and "fragments" in data:
        yield record_from_json(data, origin).flagged_at(params.today())  # a date after now: flagged (records.dates)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from records_from_data(item, f"{origin}[{index}]", f"{default_id}-{index}", params)
    else:
        raise RecordError(
            origin,
            "unrecognised record: expected an ebmrag record {patient_id, fragments}, "
            "a FHIR Bundle, or an AgentClinic case with OSCE_Examination (or give a C-CDA .xml file or a "
            "FHIR Bulk Data .ndjson file or folder)",
        )


def load_records(path: str | Path, params: ChartParams | None = None) -> list[PatientRecord]:
    """All patient records in a file or export: .json (ebmrag, FHIR Bundle, AgentClinic), .jsonl, .ndjson or a
    folder of them (FHIR Bulk Data), .xml (C-CDA), .txt/.md free text."""
    path, params = Path(path), params or ChartParams()
    if path.is_dir() or path.suffix.lower() == ".ndjson":
        return _bulk(path, params)
    if not path.is_file():
        raise RecordError(str(path), "file not found")
    if path.suffix.lower() == ".xml":
        return records_from_xml(path.read_bytes(), str(path), params)
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise RecordError(str(path), "is not UTF-8 text") from None
    if path.suffix.lower() in {".txt", ".md", ".text"}:
        return [record_from_text(raw, str(path), path.stem)]
    if path.suffix.lower() == ".jsonl":
        if _is_bulk_export(raw):
            return _bulk(path, params)
        records: list[PatientRecord] = []
        for number, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                records.extend(
                    records_from_data(
                        _parse_json(line, f"{path}:{number}"), f"{path}:{number}", f"{path.stem}-{number}", params
                    )
                )
        return records
    return list(records_from_data(_parse_json(raw, str(path)), str(path), path.stem, params))


def _is_bulk_export(raw: str) -> bool:
    """A .jsonl whose lines are FHIR resources other than Bundles is a Bulk Data export."""
    first = next((line for line in raw.splitlines() if line.strip()), "")
    try:
        data = load_json(first, "first line")
    except RecordError:
        return False
    return isinstance(data, Mapping) and isinstance(data.get("resourceType"), str) and data["resourceType"] != "Bundle"


def record_from_ccda(data: bytes | str, origin: str, params: ChartParams | None = None) -> PatientRecord:
    """A C-CDA R2.1 document, read through its FHIR shape so both formats mean the same."""
    from ebmrag.records.ccda import bundle_from_ccda
    from ebmrag.records.fhir.bundle import record_from_fhir_bundle

    bundle = bundle_from_ccda(data, origin)
    notes = [str(n) for n in bundle.pop("ccda_notes", None) or []]
    params = params or ChartParams()
    record = record_from_fhir_bundle(bundle, origin, stale_after=params.stale_after, today=params.today())
    return replace(record, skipped=record.skipped + tuple(f"C-CDA: {n}" for n in notes))


def records_from_xml(data: bytes, origin: str, params: ChartParams | None = None) -> list[PatientRecord]:
    """An XML chart: a C-CDA document, or FHIR in its XML format (a Bundle)."""
    from ebmrag.records.ccda import is_ccda
    from ebmrag.records.fhir.xml import is_fhir_xml, resource_from_fhir_xml

    check_xml_depth(data, origin)  # both readers walk the tree recursively
    if is_ccda(data):
        return [record_from_ccda(data, origin, params)]
    if is_fhir_xml(data):
        return list(records_from_data(resource_from_fhir_xml(data, origin), origin, Path(origin).stem, params))
    raise RecordError(origin, "an XML file that is neither a C-CDA document (urn:hl7-org:v3 ClinicalDocument) nor "
                              "FHIR XML (http://hl7.org/fhir)")


def _bulk(path: Path, params: ChartParams) -> list[PatientRecord]:
    from ebmrag.records.fhir.bulk import records_from_ndjson

    if not path.exists():
        raise RecordError(str(path), "file not found")
    return records_from_ndjson(path, stale_after=params.stale_after, today=params.today())


def _parse_json(raw: str, origin: str) -> Any:
    return load_json(raw, origin)  # depth-bounded; NaN, huge integers and unpaired surrogates refused


def load_record(path: str | Path, patient_id: str | None = None, params: ChartParams | None = None
                ) -> PatientRecord:
    """Exactly one record: the file's only one, or the one with `patient_id`."""
    records = load_records(path, params)
    if patient_id is not None:
        matches = [r for r in records if r.patient_id == patient_id]
        if not matches:
            known = ", ".join(r.patient_id for r in records[:10])
            raise RecordError(str(path), f"no patient {patient_id!r} (first ids: {known})")
        return matches[0]
    if len(records) != 1:
        raise RecordError(
            str(path),
            f"holds {len(records)} patient records; choose one with --patient-id "
            f"(first ids: {', '.join(r.patient_id for r in records[:5])})",
        )
    return records[0]
