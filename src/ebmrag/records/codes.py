"""The code tables both chart readers share: the code systems (rules/records/code_systems.toml) and a clinical
document's sections (rules/records/sections.toml).

The C-CDA reader names a code system by its OID where the FHIR reader names it by URI, and both read a document's
sections by their LOINC codes; each table is written once, so the two readers cannot come to disagree about what
a code means. The builders refuse a table of the wrong shape with the entry at fault named (the rule book names the
file).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ebmrag.rules import rule_file

SECTION_KINDS = frozenset({"allergies", "medications", "problems", "diagnoses", "results", "vital-signs",
                           "procedures", "encounters", "immunizations", "social-history"})  # the C-CDA handlers


def text_table(found: Any, table: str) -> dict[str, str]:
    """The rule file's `[table]` as code -> non-empty text; ValueError naming the table and entry otherwise."""
    if not isinstance(found, Mapping) or not found:
        raise ValueError(f"[{table}] must be a table of code = \"text\"")
    bad = [key for key, value in found.items() if not isinstance(value, str) or not value.strip()]
    if bad:
        raise ValueError(f"[{table}] {bad[0]!r} must be non-empty text")
    return dict(found)


@dataclass(frozen=True)
class CodeSystems:
    """The FHIR URI of each HL7 OID a C-CDA document names a code system by, the short name shown after a code of
    a system that has one ("8480-6 (LOINC)"), and the OID arc of FHIR's own code systems."""

    uri_by_oid: Mapping[str, str]
    name_by_uri: Mapping[str, str]
    fhir_oid_arc: str


@rule_file("records/code_systems.toml")
def code_systems(raw: Mapping[str, Any]) -> CodeSystems:
    uri_by_oid: dict[str, str] = {}
    names: dict[str, str] = {}
    for n, system in enumerate(raw["system"], start=1):
        uri, oids = system.get("uri"), system.get("oids")
        if not isinstance(uri, str) or not uri or not isinstance(oids, list):
            raise ValueError(f"[[system]] {n} needs a `uri` and a list of `oids`")
        for oid in oids:
            if oid in uri_by_oid:
                raise ValueError(f"OID {oid} is listed under both {uri_by_oid[oid]} and {uri}")
            uri_by_oid[str(oid)] = uri
        if "name" in system:
            names[uri] = str(system["name"])
    arc = raw["fhir_oid_arc"]
    if not isinstance(arc, str) or not arc.endswith("."):
        raise ValueError("`fhir_oid_arc` must be an OID prefix ending in '.'")
    return CodeSystems(uri_by_oid, names, arc)


@dataclass(frozen=True)
class EmptyStatus:
    """What a section that is empty on purpose states: the section of the note, and the words that open it."""

    section: str  # "Problem list > status"
    label: str  # "Past problems"


@dataclass(frozen=True)
class Sections:
    """Document sections by LOINC code: the C-CDA reader's kind of each (by templateId when the code is
    unknown), the status an empty-on-purpose one states, and the words of each list-empty-reason code."""

    kind_by_loinc: Mapping[str, str]
    kind_by_template: Mapping[str, str]
    empty_status: Mapping[str, EmptyStatus]  # LOINC code -> its status line
    empty_reason: Mapping[str, str]  # "nilknown" -> "Nil known"


@rule_file("records/sections.toml")
def document_sections(raw: Mapping[str, Any]) -> Sections:
    kinds: dict[str, str] = {}
    empty: dict[str, EmptyStatus] = {}
    for code, section in raw["loinc"].items():
        if section.get("kind") not in SECTION_KINDS or not isinstance(section.get("display"), str):
            raise ValueError(f"[loinc.{code!r}] needs a `display` and a `kind` among {sorted(SECTION_KINDS)}")
        kinds[code] = section["kind"]
        if "empty" in section:
            said = section["empty"]
            if not isinstance(said, Mapping) or not all(isinstance(said.get(k), str) for k in ("section", "label")):
                raise ValueError(f"[loinc.{code!r}] `empty` needs a `section` and a `label`")
            empty[code] = EmptyStatus(said["section"], said["label"])
    templates = text_table(raw.get("templates"), "templates")
    unknown = sorted(set(templates.values()) - SECTION_KINDS)
    if unknown:
        raise ValueError(f"[templates] names a kind no handler reads: {unknown[0]!r}")
    return Sections(kinds, templates, empty, text_table(raw.get("empty_reason"), "empty_reason"))
