"""Result messages: what specialist models and laboratories send (on the queue, or to POST /v1/results),
validated, as fragments.

A message names its tenant, patient and a `result_id` unique per producer; the fragment it becomes has
the id `result:<producer>:<result_id>`, so a redelivered or re-sent message replaces the same fragment
instead of adding a copy. HL7 v2 ORU^R01 lab messages are read too (the `hl7` library): one message per
OBR group, its OBX results with units, reference ranges and abnormal flags.

Everything that can go wrong in turning a message into a fragment is a `MessageError` with the reason (never
the payload: it holds patient text), so the consumer can dead-letter it instead of retrying it forever: invalid
JSON or JSON nested too deeply, a field of the wrong type, an id with a control character (PostgreSQL refuses
NUL), a FHIR resource whose elements have the wrong JSON shape (named by path), or any failure to render it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ebmrag.errors import EbmragError, RecordError, require_extra
from ebmrag.records.fhir.index import ChartIndex
from ebmrag.records.fhir.rendered import Skip
from ebmrag.records.fhir.resources import procedure
from ebmrag.records.fhir.results import imaging_study, observation, report
from ebmrag.records.fhir.shapes import shape_problems
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.records.limits import load_json
from ebmrag.records.loaders import control_character
from ebmrag.store.patients import PatientStore

SCHEMA_VERSION = 1
KIND_SECTIONS = {"pathology": "Pathology report", "imaging": "Imaging report", "ecg": "ECG report",
                 "lab": "Laboratory", "genetics": "Genetics report", "note": "Clinical note", "other": "Result"}
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_TYPE_NAME = re.compile(r"[A-Z][A-Za-z]{0,63}")  # a FHIR resource type's name, safe to repeat in a reason


class MessageError(EbmragError):
    """A message that cannot become a fragment; the consumer dead-letters it with this reason."""


class ResultValue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    value: str | float | int
    unit: str = ""
    reference_range: str = ""
    abnormal: str = ""  # H, L, A, HH, LL, N ... as the producer flags it

    def render(self) -> str:
        extras = [f"reference {self.reference_range}" if self.reference_range else "",
                  f"flag {self.abnormal}" if self.abnormal and self.abnormal.upper() != "N" else ""]
        extra = "; ".join(x for x in extras if x)
        return f"{self.name} {self.value}{' ' + self.unit if self.unit else ''}" + (f" ({extra})" if extra else "")


class ResultMessage(BaseModel):
    """Version 1 of the gateway message."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    tenant: str = Field(pattern=_NAME)
    patient_id: str = Field(pattern=_NAME)
    result_id: str = Field(min_length=1, max_length=200)
    kind: Literal["pathology", "imaging", "ecg", "lab", "genetics", "note", "other"]
    producer: str = Field(min_length=1, max_length=200)  # model or system name and version
    produced_at: datetime
    status: Literal["final", "pending"] = "final"
    encounter: str | None = None
    title: str = ""
    text: str = ""
    values: list[ResultValue] = Field(default_factory=list)
    resource: dict[str, Any] | None = None  # a FHIR R4 Observation, DiagnosticReport, ... as the result

    @field_validator("result_id", "producer", "encounter")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        """These become the fragment id, its source and the store's origin: no control characters."""
        problem = control_character(value) if value is not None else None
        if problem:
            raise ValueError(f"contains {problem}; ids must be printable text")
        return value

    @model_validator(mode="after")
    def _has_content(self) -> ResultMessage:
        if self.resource is not None:
            self.text = " ".join(filter(None, [self.text.strip(), fhir_text(self.resource)]))
        if self.status == "final" and not (self.text.strip() or self.values):
            raise ValueError("a final result needs text, values or a FHIR resource")
        if self.produced_at.tzinfo is None:
            raise ValueError("produced_at needs a time zone (e.g. 2026-03-14T08:00:00Z)")
        return self

    @property
    def fragment_id(self) -> str:
        return f"result:{self.producer}:{self.result_id}"

    def fragment(self) -> Fragment:
        body = "; ".join(v.render() for v in self.values)
        text = " ".join(p for p in (f"{self.title}:" if self.title else "", self.text.strip(),
                                    body + "." if body else "") if p)
        return Fragment(self.fragment_id, self.patient_id, text, KIND_SECTIONS[self.kind], self.produced_at,
                        source=self.producer, encounter=self.encounter)

    def record(self) -> PatientRecord:
        return PatientRecord(self.patient_id, (self.fragment(),), f"gateway:{self.producer}")


def fhir_text(resource: dict[str, Any]) -> str:
    """A FHIR R4 resource's text as the chart reader renders it (records.fhir.resources). ValueError (which
    pydantic reports as a validation error) names the element of the wrong shape, or says the renderer failed:
    nothing else may escape, or a consumer would take a bad message for a store outage."""
    kind = resource.get("resourceType")
    renderer = {"Observation": observation, "DiagnosticReport": report, "Procedure": procedure,
                "ImagingStudy": imaging_study}.get(kind) if isinstance(kind, str) else None
    if renderer is None:
        named = kind if isinstance(kind, str) and _TYPE_NAME.fullmatch(kind) else "resource without a type name"
        raise ValueError(f"resource: a {named} is not a result this gateway reads "  # never echo other text (PHI)
                         "(Observation, DiagnosticReport, Procedure, ImagingStudy)")
    problems = shape_problems(resource)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"resource: {problems[0]}{more}")
    try:
        rendered = renderer(resource, ChartIndex())
        text = " ".join(part.text for part in rendered) if not isinstance(rendered, Skip) else ""
    except Exception as exc:  # a shape the table above does not know: still this message's fault
        raise ValueError(f"resource: the {kind} could not be read ({type(exc).__name__})") from None
    if isinstance(rendered, Skip):
        raise ValueError(f"resource: nothing to store ({rendered.reason})")
    return text


def apply_message(store: PatientStore, message: ResultMessage) -> str:
    """The one way a result reaches the store, for the queue consumer and the HTTP route alike: a pending
    announcement is recorded, a final result upserted (replacing its announcement). Returns "stored" or
    "pending"; MessageError when the tenant is unknown (nothing is stored under any tenant then)."""
    if not store.tenant_exists(message.tenant):
        raise MessageError(f"tenant {message.tenant!r} is not known to the store")
    if message.status == "pending":
        store.announce(message.tenant, message.patient_id, message.fragment_id, message.kind, message.producer)
        return "pending"
    store.upsert_fragments(message.tenant, message.patient_id, message.record())
    return "stored"


def parse_message(payload: str | bytes | dict[str, Any]) -> ResultMessage:
    """A JSON message (text or parsed) -> ResultMessage, or MessageError naming the first problem. Text is
    parsed within the limits of records.limits (nesting depth, NaN, surrogates) first."""
    try:
        data = payload if isinstance(payload, dict) else load_json(payload, "message")
        return ResultMessage.model_validate(data)
    except RecordError as exc:
        raise MessageError(f"invalid result message: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "message"
        raise MessageError(f"invalid result message: {where}: {first.get('msg')}") from None
    except Exception as exc:  # whatever else validating or rendering raised: this message's fault, not the store's
        raise MessageError(f"invalid result message: could not be read ({type(exc).__name__})") from None


def parse_messages(text: str, where: str) -> list[ResultMessage]:
    """A JSON message or a JSON list of them (a file to publish), parsed within the limits of records.limits."""
    try:
        data = load_json(text, where)
    except RecordError as exc:
        raise MessageError(f"not JSON and not HL7: {exc}") from None
    return [parse_message(item) for item in (data if isinstance(data, list) else [data])]


def messages_from_hl7(text: str, tenant: str, producer: str = "hl7") -> list[ResultMessage]:
    """HL7 v2 ORU^R01 -> one message per OBR group (patient id from PID-3, time from OBR-7 or MSH-7)."""
    hl7 = require_extra("hl7", "gateway", "reading HL7 v2 messages")
    try:
        parsed = hl7.parse(text.replace("\n", "\r").strip())
    except Exception as exc:  # the library raises several types for malformed text
        raise MessageError(f"not an HL7 v2 message: {exc}") from None
    msh, kind = parsed.segment("MSH"), ""
    kind = str(msh[9]) if len(msh) > 9 else ""
    if not kind.startswith("ORU^R01"):
        raise MessageError(f"only ORU^R01 result messages are read, got {kind or 'no message type'}")
    try:
        patient = str(parsed.segment("PID")[3][0][0])
    except (KeyError, IndexError):
        raise MessageError("the HL7 message has no PID-3 patient identifier") from None
    control = str(msh[10]) if len(msh) > 10 else "message"
    results, group, title, stamp = [], 0, "", _hl7_time(str(msh[7]) if len(msh) > 7 else "")
    values: list[ResultValue] = []

    def close() -> None:
        if values:
            results.append(parse_message({"tenant": tenant, "patient_id": _safe_id(patient), "kind": "lab",
                                          "result_id": f"{control}-{group}", "producer": producer,
                                          "produced_at": stamp, "title": title, "values": list(values)}))

    for segment in parsed:
        name = str(segment[0])
        if name == "OBR":
            close()
            group, values = group + 1, []
            title = _field(segment, 4, 1) or _field(segment, 4, 0)
            stamp = _hl7_time(_field(segment, 7, 0)) or stamp
        elif name == "OBX":
            values.append(ResultValue(name=_field(segment, 3, 1) or _field(segment, 3, 0) or "result",
                                      value=_field(segment, 5, 0), unit=_field(segment, 6, 0),
                                      reference_range=_field(segment, 7, 0), abnormal=_field(segment, 8, 0)))
    close()
    if not results:
        raise MessageError("the HL7 message holds no OBX result")
    return results


def _field(segment: Any, index: int, component: int) -> str:
    """Component `component` of the first repetition of field `index` ("" when absent)."""
    try:
        parts = str(segment[index]).split("~")[0].split("^")
    except (IndexError, KeyError):
        return ""
    return parts[component] if component < len(parts) else ""


def _hl7_time(value: str) -> datetime:
    digits = re.sub(r"\D", "", value)[:14].ljust(14, "0") if value else ""
    if not digits:
        return datetime.now().astimezone()
    return datetime.strptime(digits, "%Y%m%d%H%M%S").astimezone()


def _safe_id(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:-]", "-", value)[:128] or "unknown"
