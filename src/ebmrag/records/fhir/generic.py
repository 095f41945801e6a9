"""Lines for what no renderer says: a resource type no renderer reads, and the clinical elements a renderer passed
over (fhir.coverage finds them).

A resource type the reader has no renderer for (a NutritionOrder, an AdverseEvent, a Task that carries a
recommendation) is said whole, by its type, status, name and every clinical element, rather than dropped as "not
used": "Nutrition order (active): date: 2024-02-01; oral diet type: Diabetic diet.". The elements a renderer
passed over are said as one more line of the same resource, named so that it reads on its own: "Observation Genetic
variant assessment (also recorded): component Gene studied: BRCA2; note: Confirmed by a second laboratory.".

Element names become words ("dosageInstruction" -> "dosage instruction"; a choice element loses its data type,
"valueCodeableConcept" -> "value"; an extension is named by its URL's last segment); codes are said by the chart's
own words (text, then display, then the code). The lines report, they do not interpret: no renderer's rule is
repeated here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ebmrag.records.dates import as_written
from ebmrag.records.fhir.coding import obj, objects, text_of
from ebmrag.records.fhir.coverage import Element, Names, coverage_rules
from ebmrag.records.fhir.index import Resource
from ebmrag.records.fhir.rendered import status_code

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAMED_BY = ("code", "vaccineCode", "medicationCodeableConcept", "type", "item")  # a resource's name, first found
_MAX_VALUE = 2000  # characters of one element's words: a pasted document stays a line, not a chart
MORE = "#more"  # the id suffix of the line said after a renderer's own: the face sheet does not list it


def also_section(section: str | None) -> str:
    """The section of a line said after a renderer's own: under "Also recorded", then the renderer's section, so
    the tier rules still rank it by what it is about ("Also recorded > Allergy > food" is an allergy's), while
    whatever lists a section's records (the face sheet's allergies, a CDS card's citations, "Problem list >
    active") still finds one record per allergy or problem."""
    return f"Also recorded > {section}" if section else "Also recorded"


def type_words(kind: str) -> str:
    """"NutritionOrder" -> "Nutrition order": a resource type as a section and a line's opening."""
    words = _CAMEL.sub(" ", kind).lower()
    return words[:1].upper() + words[1:]


def name_of(resource: Resource, names: Names) -> str:
    """What the resource is about, in the chart's words: its code (or vaccine, drug, type), else what its drug
    reference points at (a MedicationStatement's Medication), else ""."""
    named = next((t for key in _NAMED_BY if (t := text_of(resource.get(key)))), "")
    if named:
        return named
    medication = resource.get("medicationReference") or obj(resource.get("medication")).get("reference")
    display = obj(medication).get("display")
    return (display.strip() if isinstance(display, str) and display.strip() else "") \
        or next(iter(names(obj(medication))), "")


def line(resource: Resource, items: Sequence[Element], names: Names, *, also: bool) -> str:
    """One line saying `items` of the resource: after the renderer's own lines (`also`), or as its only line."""
    kind = type_words(str(resource.get("resourceType") or "Resource"))
    name = name_of(resource, names)
    status = resource.get("status") if isinstance(resource.get("status"), str) else ""
    head = kind + (f" {name}" if name else "") + (" (also recorded)" if also else f" ({status})" if status else "")
    parts = _parts(items, names, head=name)
    return head + (": " + "; ".join(parts) if parts else "") + "."


def _parts(items: Sequence[Element], names: Names, head: str) -> list[str]:
    """Elements of one name (and one coded element above them) said together ("reaction manifestation: hives,
    wheeze"), and the elements of one parent under its name ("dosage instruction timing repeat: frequency 1,
    period 1, period unit d"); what the line's `head` says already (its name) is not said twice."""
    by_name: dict[tuple[str, str], list[str]] = {}
    labelled = {e.owner for e in items if not e.names_owner and e.about}  # coded elements said by their name
    for element in items:
        if element.names_owner and element.owner in labelled:
            continue
        words = value_words(element, names)
        if words and words != head:
            values = by_name.setdefault(_path_parts(element), [])
            if words not in values:
                values.append(words)
    by_parent: dict[str, list[tuple[str, str]]] = {}
    for (parent, name), values in by_name.items():
        by_parent.setdefault(parent, []).append((name, ", ".join(values)))
    parts = []
    for parent, children in by_parent.items():
        if len(children) == 1 or not parent or any(not name for name, _ in children):
            for name, said in children:
                label = " ".join(w for w in (parent, name) if w)
                parts.append(f"{label}: {said}" if label else said)
        else:
            parts.append(f"{parent}: " + ", ".join(" ".join(w for w in pair if w) for pair in children))
    return parts


def _path_parts(element: Element) -> tuple[str, str]:
    """(the words of the element's parents, of the element): ("dosage instruction timing repeat", "period unit");
    a value under a coded parent is said by the parent's name alone ("component Gene studied", "")."""
    names = element.path.split(".")[1:]
    words = [_name_words(n) for n in names]
    if element.about and 0 < element.depth <= len(names):
        words.insert(element.depth, element.about)
    said = [w for w in words if w]
    if len(said) > 1 and said[-1] == "value":  # "component Gene studied value" says no more than without "value"
        said.pop()
        return " ".join(said), ""
    return " ".join(said[:-1]), said[-1] if said else ""


def _name_words(name: str) -> str:
    if name.startswith(("extension:", "modifierExtension:")):
        return _CAMEL.sub(" ", re.sub(r"[-_.]+", " ", name.split(":", 1)[1])).lower()
    for datatype in coverage_rules().datatypes:
        if name.endswith(datatype) and len(name) > len(datatype) and name[0].islower():
            name = name[: -len(datatype)]
            break
    return _CAMEL.sub(" ", name).lower()


def value_words(element: Element, names: Names) -> str:
    """What the element says, in words: a concept by text_of, a reference by its display or what it points at, a
    quantity with its unit, a period as "from to", a yes/no as yes or no."""
    value, shape = element.value, element.shape
    if shape == "concept":
        words = text_of(value)
    elif shape == "coding":
        words = str(value.get("display") or value.get("code") or "")
    elif shape == "reference":
        display = value.get("display")
        words = display if isinstance(display, str) and display.strip() else next(iter(names(value)), "")
    elif shape == "quantity":
        words = _quantity(value)
    elif shape == "period":
        words = " to ".join(_primitive(value.get(k)) for k in ("start", "end") if value.get(k))
    elif shape == "range":
        words = "-".join(_quantity(value.get(k)) for k in ("low", "high") if isinstance(value.get(k), Mapping))
    elif shape == "ratio":
        words = "/".join(_quantity(value.get(k)) for k in ("numerator", "denominator")
                         if isinstance(value.get(k), Mapping))
    elif shape == "note":
        words = str(value.get("text") or "")
    elif shape in ("narrative", "attachment", "identifier"):
        words = ""  # documented kinds: never said in a line
    else:
        words = _primitive(value)
    words = " ".join(str(words).split())
    return words if len(words) <= _MAX_VALUE else words[:_MAX_VALUE].rsplit(" ", 1)[0] + " ..."


def _quantity(q: Any) -> str:
    if not isinstance(q, Mapping) or q.get("value") is None:
        return ""
    unit = q.get("unit") or q.get("code") or ""
    return f"{q.get('comparator', '')}{_primitive(q['value'])} {unit if isinstance(unit, str) else ''}".strip()


def _primitive(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return as_written(value) or value.strip()
    if isinstance(value, float):
        return f"{value:g}"  # JSON's 1000.0 and 1000 are one number: a server may send either
    return "" if value is None or isinstance(value, (Mapping, list)) else str(value)


def timed(resource: Resource) -> Any:
    """The element a resource no renderer reads is dated by (rules/records/coverage.toml [generic] time_keys):
    a date as written, or None."""
    for key in coverage_rules().time_keys:
        value = resource.get(key)
        if isinstance(value, Mapping):
            value = value.get("start")
        if isinstance(value, str) and value.strip():
            return value
    for item in objects(resource.get("occurrenceTiming")):
        events = item.get("event")
        if isinstance(events, list) and events and isinstance(events[0], str):
            return events[0]
    return None


def taken_back(resource: Resource) -> bool:
    """A resource no renderer reads whose status takes it back (rules/records/coverage.toml [generic] taken_back):
    it is not said."""
    statuses = {status_code(resource.get(k)) for k in ("status", "verificationStatus")}
    return bool(statuses & coverage_rules().taken_back)
