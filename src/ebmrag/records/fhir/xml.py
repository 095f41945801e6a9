"""FHIR's XML format -> the same JSON shape the chart reader reads.

Some EHRs export FHIR as XML (`application/fhir+xml`). Its grammar is regular: an element named after the
field, its value in a `value` attribute, a resource as an element named after its type inside a
`resource`/`contained` wrapper, narrative as XHTML. Without the schema a single child cannot be told
from a list of one, so a lone child stays an object; the readers accept either (fhir.coding.objects).
Parsed with defusedxml: entity expansion and external entities are refused.
"""

from __future__ import annotations

from typing import Any
from xml.etree.ElementTree import Element, ParseError, tostring

from defusedxml import DefusedXmlException  # type: ignore[import-untyped]
from defusedxml import ElementTree as SafeTree

from ebmrag.errors import RecordError

FHIR_NS = "http://hl7.org/fhir"
XHTML_NS = "http://www.w3.org/1999/xhtml"
_WRAPPERS = {"resource", "contained", "outcome"}  # an element that holds one resource


def _local(tag: str) -> tuple[str, str]:
    namespace, _, name = tag[1:].partition("}") if tag.startswith("{") else ("", "", tag)
    return namespace, name


def is_fhir_xml(data: bytes | str) -> bool:
    head = (data[:2000].decode("utf-8", "replace") if isinstance(data, bytes) else data[:2000])
    return f'xmlns="{FHIR_NS}"' in head or f"xmlns='{FHIR_NS}'" in head


def resource_from_fhir_xml(data: bytes | str, origin: str) -> dict[str, Any]:
    """A FHIR XML document (a Bundle or one resource) as its JSON form."""
    try:
        root: Element = SafeTree.fromstring(data.encode("utf-8") if isinstance(data, str) else data,
                                            forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except (ParseError, DefusedXmlException, ValueError, UnicodeError) as exc:
        raise RecordError(origin, f"not well-formed or unsafe XML ({type(exc).__name__}: {exc})") from None
    namespace, name = _local(root.tag)
    if namespace != FHIR_NS:
        raise RecordError(origin, f"an XML document whose root <{name}> is not in the FHIR namespace {FHIR_NS}")
    return _resource(root)


def _resource(element: Element) -> dict[str, Any]:
    resource: dict[str, Any] = {"resourceType": _local(element.tag)[1]}
    resource.update(_fields(element))
    return resource


def _fields(element: Element) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in element.attrib.items():
        if key in ("url", "id") and _local(element.tag)[1] != "div":
            fields[key] = value
    for child in element:
        namespace, name = _local(child.tag)
        if namespace == XHTML_NS:
            fields[name] = tostring(child, encoding="unicode")
            continue
        value = _value(child, name)
        if name in fields:
            fields[name] = [*fields[name], value] if isinstance(fields[name], list) else [fields[name], value]
        else:
            fields[name] = value
    return fields


def _value(child: Element, name: str) -> Any:
    if name in _WRAPPERS and len(child) == 1:
        return _resource(child[0])
    if "value" in child.attrib and len(child) == 0:
        return child.attrib["value"]
    return _fields(child) | ({"value": child.attrib["value"]} if "value" in child.attrib else {})
