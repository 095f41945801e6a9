"""Whether a result resource's elements have the JSON shape FHIR R4 gives them, said with the element's path.

The renderers never trust a shape (fhir.coding): a `valueQuantity` that is a string is passed over, not a crash.
That is right for a chart, where one bad element must not cost the rest. A result message is one resource a
producer sends on purpose, though, and passing over its value would store "no value" for a result that has
one. So the gateway refuses such a message, naming the element ("Observation.component[0].valueQuantity must
be a Quantity (an object), got a string"), and the chart reader lists the same finding in the record's trace.

Checked: the elements the result renderers read (fhir.results, fhir.resources.procedure), by the datatype
tables below. An element that repeats may also be given as one item (FHIR XML conversions write a lone one
unwrapped); null is read as absent; elements not listed are not checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

Shape = tuple[str, bool]  # (datatype, repeats)

_STRINGS = frozenset({"string", "code", "uri", "url", "dateTime", "instant", "time", "base64Binary", "id"})
_VALUE: dict[str, Shape] = {
    "valueQuantity": ("Quantity", False), "valueCodeableConcept": ("CodeableConcept", False),
    "valueString": ("string", False), "valueBoolean": ("boolean", False), "valueInteger": ("integer", False),
    "valueRange": ("Range", False), "valueRatio": ("Ratio", False), "valueTime": ("time", False),
    "valueDateTime": ("dateTime", False), "valuePeriod": ("Period", False),
}
_ABOUT: dict[str, Shape] = {"subject": ("Reference", False), "encounter": ("Reference", False),
                            "status": ("code", False), "id": ("id", False)}
_COMPLEX: dict[str, dict[str, Shape]] = {
    "CodeableConcept": {"coding": ("Coding", True), "text": ("string", False)},
    "Coding": {"system": ("uri", False), "code": ("code", False), "display": ("string", False)},
    "Quantity": {"value": ("decimal", False), "comparator": ("code", False), "unit": ("string", False),
                 "system": ("uri", False), "code": ("code", False)},
    "Reference": {"reference": ("string", False), "display": ("string", False)},
    "Period": {"start": ("dateTime", False), "end": ("dateTime", False)},
    "Range": {"low": ("Quantity", False), "high": ("Quantity", False)},
    "Ratio": {"numerator": ("Quantity", False), "denominator": ("Quantity", False)},
    "Attachment": {"contentType": ("code", False), "data": ("base64Binary", False), "url": ("url", False),
                   "title": ("string", False)},
    "Observation.referenceRange": {"low": ("Quantity", False), "high": ("Quantity", False),
                                   "text": ("string", False)},
    "Observation.component": {"code": ("CodeableConcept", False), **_VALUE,
                              "interpretation": ("CodeableConcept", True),
                              "dataAbsentReason": ("CodeableConcept", False),
                              "referenceRange": ("Observation.referenceRange", True)},
    "ImagingStudy.series": {"description": ("string", False), "modality": ("Coding", False)},
    "Observation": {**_ABOUT, "category": ("CodeableConcept", True), "code": ("CodeableConcept", False), **_VALUE,
                    "effectiveDateTime": ("dateTime", False), "effectivePeriod": ("Period", False),
                    "issued": ("instant", False), "interpretation": ("CodeableConcept", True),
                    "referenceRange": ("Observation.referenceRange", True),
                    "component": ("Observation.component", True), "hasMember": ("Reference", True),
                    "specimen": ("Reference", False), "dataAbsentReason": ("CodeableConcept", False)},
    "DiagnosticReport": {**_ABOUT, "category": ("CodeableConcept", True), "code": ("CodeableConcept", False),
                         "conclusion": ("string", False), "conclusionCode": ("CodeableConcept", True),
                         "result": ("Reference", True), "presentedForm": ("Attachment", True),
                         "effectiveDateTime": ("dateTime", False), "issued": ("instant", False)},
    "Procedure": {**_ABOUT, "code": ("CodeableConcept", False), "outcome": ("CodeableConcept", False),
                  "reasonCode": ("CodeableConcept", True), "performedDateTime": ("dateTime", False),
                  "performedPeriod": ("Period", False)},
    "ImagingStudy": {**_ABOUT, "modality": ("Coding", True), "description": ("string", False),
                     "series": ("ImagingStudy.series", True), "started": ("dateTime", False)},
}
CHECKED = frozenset({"Observation", "DiagnosticReport", "Procedure", "ImagingStudy"})


def shape_problems(resource: Mapping[str, Any]) -> list[str]:
    """"Observation.valueQuantity must be a Quantity (an object), got a string", ... in document order; empty
    when every checked element has its shape (or the resource type is not one checked here)."""
    kind = resource.get("resourceType")
    if not isinstance(kind, str) or kind not in CHECKED:
        return []
    return list(_problems(resource, kind, kind))


def _problems(node: Mapping[str, Any], datatype: str, path: str) -> Iterator[str]:
    for element, (child, repeats) in _COMPLEX[datatype].items():
        value = node.get(element)
        if value is None:
            continue
        where = f"{path}.{element}"
        if repeats and isinstance(value, list):
            for position, item in enumerate(value):
                if item is not None:
                    yield from _check(item, child, f"{where}[{position}]")
        else:
            yield from _check(value, child, where, repeats)


def _check(value: Any, datatype: str, where: str, repeats: bool = False) -> Iterator[str]:
    if datatype in _COMPLEX:
        if isinstance(value, Mapping):
            yield from _problems(value, datatype, where)
            return
    elif _is_primitive(value, datatype):
        return
    yield f"{where} must be {_expected(datatype, repeats)}, got {_described(value)}"


def _is_primitive(value: Any, datatype: str) -> bool:
    if datatype in _STRINGS:
        return isinstance(value, str)
    if datatype == "boolean":
        return isinstance(value, bool)
    if datatype == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)  # decimal


def _expected(datatype: str, repeats: bool) -> str:
    if datatype in _COMPLEX:
        noun = "an object" if "." in datatype else f"a {datatype} (an object)"
        return f"a list of {'objects' if '.' in datatype else datatype}" if repeats else noun
    single = {"boolean": "true or false", "integer": "an integer", "decimal": "a number"}.get(datatype, "a string")
    return f"a list of {single.removeprefix('a ').removeprefix('an ')}s" if repeats else single


def _described(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, Mapping) else "a value"
