"""Reading coded values the way real charts write them, and never trusting an element's shape.

`text_of` gives a CodeableConcept's words in the chart's own language: its `text`, else the first
coding that has a display (a German chart stays German), else the code named with its system, never a
bare number. `obj`/`objects`/`concepts` read an element that should be an object or a list and return
an empty one when the chart wrote something else, so one malformed element costs that element only.
`states_absence` recognises statements of absence ("no known allergy") by code system and code, with the
phrase as fallback (rules/records/absent.toml). A code system's short name is rules/records/code_systems.toml's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ebmrag.records.codes import code_systems
from ebmrag.rules import rule_file

_SEMANTIC_TAG = re.compile(r"\s+\((?:disorder|finding|situation|procedure|qualifier value|physical object|"
                           r"record artifact|regime/therapy|observable entity|morphologic abnormality|"
                           r"clinical drug|substance|event|body structure|product|medicinal product)\)")
_IPS_ABSENT = "absent-unknown"
_DATA_ABSENT = "data-absent-reason"


def without_semantic_tags(text: str) -> str:
    return _SEMANTIC_TAG.sub("", text)


def obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def objects(value: Any) -> list[Mapping[str, Any]]:
    """A list of objects (a single object is read as a list of one; anything else as empty)."""
    if isinstance(value, Mapping):
        return [value]
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def strings(value: Any) -> list[str]:
    """A list of strings (FHIR XML gives a lone one unwrapped)."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def concepts(value: Any) -> list[Mapping[str, Any]]:
    return objects(value)


def codings(concept: Any) -> list[tuple[str, str, str]]:
    """(system, code, display) of each coding."""
    return [(str(c.get("system") or ""), str(c.get("code") or ""), str(c.get("display") or ""))
            for c in objects(obj(concept).get("coding"))]


def has_code(concept: Any, system_part: str, codes: set[str] | frozenset[str]) -> bool:
    return any(system_part in system and code in codes for system, code, _ in codings(concept))


def text_of(concept: Any) -> str:
    """CodeableConcept -> its text, else a coding's display, else "<code> (<system>)"; SNOMED semantic tags
    ("(disorder)") dropped: they cost tokens and tell a reader nothing."""
    concept = obj(concept)
    if any(_DATA_ABSENT in system for system, _, _ in codings(concept)) and not concept.get("text"):
        return ""  # "unknown (data-absent-reason)" says nothing is known: it is not a name
    text = concept.get("text")
    if isinstance(text, str) and text.strip():
        return _SEMANTIC_TAG.sub("", text.strip())
    found = codings(concept)
    display = next((d for _, _, d in found if d.strip()), "")
    if display:
        return _SEMANTIC_TAG.sub("", display.strip())
    system, code, _ = next((c for c in found if c[1]), ("", "", ""))
    if not code:
        return ""
    named = code_systems().name_by_uri.get(system) or system.rstrip("/").rsplit("/", 1)[-1].removeprefix("urn:oid:")
    return f"{code} ({named})" if named else code


@rule_file("records/absent.toml")
def _absent(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {kind: {"snomed": frozenset(v.get("snomed", [])), "ips": frozenset(v.get("ips", [])),
                   "text": re.compile(v["text"], re.IGNORECASE), "statement": v["statement"]}
            for kind, v in raw.items()}


def states_absence(concept: Any, kind: str) -> bool:
    """True when the concept states an absence of this kind ("allergy", "medication", "problem", "procedure",
    "immunization"): by code first, by the phrase when the chart gave no code."""
    vocab = _absent()[kind]
    for system, code, _ in codings(concept):
        if ("snomed" in system and code in vocab["snomed"]) or (_IPS_ABSENT in system and code in vocab["ips"]):
            return True
    words = text_of(concept).lower()
    return bool(words and vocab["text"].search(words))


def absent_statement(kind: str) -> str:
    return str(_absent()[kind]["statement"])
