"""Reading coded values the way real charts write them, and never trusting an element's shape.

`text_of` gives a CodeableConcept's words in the chart's own language: its `text`, else its original text, else
the first coding that has a display (a German chart stays German), else the code named with its system, never a
bare number. Words that are not clinical language are passed over for the next of these, told by their shape
rather than from a list of examples (`is_garbage`): a software identifier (a CamelCase or dotted class name, an
identifier with underscores, a GUID, an OID, a URI), a code system's name where a concept's belongs, a program's
null. Given the record it names (`kind`: "Condition", "AllergyIntolerance.reaction"), `text_of` also passes over a
display that only repeats the record's own type or element ("Problem" naming a Condition, "Vaccine" naming an
Immunization) or a null flavour ("unknown"), with the coding it stands in (its code means the same);
`names_nothing` then says the record is made of placeholders only. The words are rules/records/display.toml's.

`obj`/`objects`/`concepts` read an element that should be an object or a list and return an empty one when the
chart wrote something else, so one malformed element costs that element only. `states_absence` recognises
statements of absence ("no known allergy") by code system and code, with the phrase as fallback
(rules/records/absent.toml). A code system's short name is rules/records/code_systems.toml's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
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


def text_of(concept: Any, kind: str = "") -> str:
    """CodeableConcept -> its text, else its original text, else a coding's display, else "<code> (<system>)";
    words that are not clinical language passed over (`is_garbage`; with `kind`, the record's own placeholders
    too: `is_placeholder`); SNOMED semantic tags ("(disorder)") dropped: they cost tokens and tell a reader
    nothing. "" when nothing names anything."""
    concept = obj(concept)
    found = codings(concept)
    if any(_DATA_ABSENT in system for system, _, _ in found) and not concept.get("text"):
        return ""  # "unknown (data-absent-reason)" says nothing is known: it is not a name
    for said in (concept.get("text"), original_text(concept)):
        if isinstance(said, str) and said.strip() and not is_placeholder(said, kind):
            return _SEMANTIC_TAG.sub("", said.strip())
    for system, code, display in found:
        if display.strip() and not _says_nothing(system, code, display, kind) and not is_garbage(display) \
                and not _repeats_code(display, code):
            return _SEMANTIC_TAG.sub("", display.strip())
    system, code, _ = next((c for c in found if c[1] and not _says_nothing(*c, kind)), ("", "", ""))
    if not code:
        return ""
    named = code_systems().name_by_uri.get(system) or system.rstrip("/").rsplit("/", 1)[-1].removeprefix("urn:oid:")
    return f"{code} ({named})" if named else code


def original_text(concept: Any) -> str:
    """The words a C-CDA document wrote for a coded value (`originalText`), as converters carry them: FHIR's
    originalText extension on the concept, or an `originalText` element kept from the document."""
    concept = obj(concept)
    kept = concept.get("originalText")
    if isinstance(kept, str):
        return kept
    if isinstance(kept, Mapping) and isinstance(kept.get("text") or kept.get("value"), str):
        return str(kept.get("text") or kept.get("value"))
    return next((str(e["valueString"]) for e in objects(concept.get("extension"))
                 if str(e.get("url") or "").endswith("originalText") and isinstance(e.get("valueString"), str)), "")


def names_nothing(concept: Any, kind: str) -> str:
    """The placeholder a record's naming concept is made of ("Problem", "unknown"), or "" when the concept names
    something or holds nothing at all: a Condition coded only "Problem" is no problem, it is an absence."""
    concept = obj(concept)
    said = [s.strip() for s in (concept.get("text"), original_text(concept)) if isinstance(s, str) and s.strip()]
    said += [d.strip() or c for _, c, d in codings(concept) if d.strip() or c]
    if not said or text_of(concept, kind):
        return ""
    return _SEMANTIC_TAG.sub("", said[0])[:60]


def says_unknown(concept: Any) -> bool:
    """The concept is coded or written as not known (a null flavour, a data-absent-reason): "a drug whose name is
    not known", which says that there is one, where a placeholder ("Medication") says nothing."""
    concept = obj(concept)
    table = _display()
    if any(marker in system for system, _, _ in codings(concept) for marker in _NULL_SYSTEM):
        return True
    said = [s for s in (concept.get("text"), original_text(concept)) if isinstance(s, str)]
    said += [d for _, _, d in codings(concept)]
    return any(s.strip() in table.null_codes or s.strip().lower().strip(" .") in table.null_words for s in said)


# ------------------------------------------------------------------------------------------------ garbage
_URI = re.compile(r"^(?:(?:https?|ftp|file|urn|oid|uuid|mailto|data):\S+|www\.\S+|\S+://\S*)$", re.IGNORECASE)
_GUID = re.compile(r"^\{?[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\}?$", re.IGNORECASE)
_OID = re.compile(r"^[0-2](?:\.\d+){3,}$")
_DOTTED = re.compile(r"^[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+$")  # no trailing dot: "Akt.Lymphoz.rel." is German
_UNDERSCORED = re.compile(r"^_?[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z][A-Za-z0-9]*)+$")  # "NM_000546" is an accession
_TEMPLATE = re.compile(r"\$\{|\{\{|%s\b|<%")
_LETTERS = re.compile(r"^[A-Za-z]+$")
_CAMEL_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
_WORDS = re.compile(r"[^\W\d_]+|\d+")
_NULL_SYSTEM = ("NullFlavor", "2.16.840.1.113883.5.1008", _DATA_ABSENT)


@dataclass(frozen=True)
class _Display:
    """rules/records/display.toml as the reader uses it (with the code systems' names, URIs and OIDs of
    code_systems.toml and the generic codes of ccda.toml)."""

    systems: frozenset[str]  # code-system names, normalised (`_normal`)
    software_words: frozenset[str]
    software_nulls: frozenset[str]
    null_codes: frozenset[str]
    null_words: frozenset[str]
    any_words: frozenset[str]
    words_by_key: Mapping[str, frozenset[str]]  # resource type or element, lower-cased -> its placeholder words
    codes_by_key: Mapping[str, frozenset[str]]  # ... -> codes that name nothing of that kind


def _normal(words: str) -> str:
    return re.sub(r"[^a-z0-9+]", "", words.lower())


def _tokens(words: str) -> list[str]:
    return _WORDS.findall(words.lower())


@rule_file("records/display.toml", "records/ccda.toml", "records/code_systems.toml")
def _display(raw: Mapping[str, Any], ccda: Mapping[str, Any], systems: Mapping[str, Any]) -> _Display:
    names = {_normal(n) for n in raw["code_system_names"]}
    for system in systems["system"]:
        uri = str(system["uri"])
        names |= {_normal(str(system.get("name", ""))), _normal(uri.rstrip("/").rsplit("/", 1)[-1])}
    words: dict[str, frozenset[str]] = {}
    codes: dict[str, frozenset[str]] = {}
    for key, table in raw["placeholder"].items():
        if key == "any":
            continue
        words[key.lower()] = frozenset(t for phrase in table["words"] for t in _tokens(phrase))
        if "ccda" in table:
            codes[key.lower()] = frozenset(ccda[table["ccda"]])
    nulls = raw["null_flavour"]
    return _Display(frozenset(n for n in names if len(n) >= 2), frozenset(raw["software_words"]),
                    frozenset(s.lower() for s in raw["software_nulls"]), frozenset(nulls["codes"]),
                    frozenset(w.lower() for w in nulls["words"]),
                    frozenset(t for phrase in raw["placeholder"]["any"] for t in _tokens(phrase)), words, codes)


def _software_token(token: str) -> bool:
    """A CamelCase name as programs write them ("AllergyIntoleranceReactionImpl", "valueQuantity", "ProblemDTO"),
    not a brand ("EpiPen", "OxyContin") nor a clinical abbreviation ("cTnI", "eGFR", "IgE", "HbA")."""
    if not _LETTERS.match(token):
        return False
    parts = _CAMEL_PARTS.findall(token)
    if len(parts) < 2:
        return False
    humps = len(re.findall(r"[a-z][A-Z]", token))
    # brands and eponyms run two or three words together ("FoundationOne", "LantusSoloStar", "GuillainBarre"):
    # only a program's suffix, a lower-case start or many humps tell a program's name
    return (parts[-1] in _display().software_words and len(parts[0]) >= 3) or humps >= 3 \
        or (humps >= 2 and len(token) >= 20) or (token[0].islower() and humps >= 1 and len(token) >= 8)


def _software_dotted(token: str) -> bool:
    """A package, class or element path ("org.hl7.fhir.Foo", "AllergyIntolerance.reaction",
    "reaction.manifestationText"), not an abbreviation ("Vit.D", "E.coli", "Tab.Paracetamol")."""
    if not _DOTTED.match(token):
        return False
    parts = token.split(".")
    return (len(parts) >= 3 and parts[0].islower() and len(parts[0]) >= 2) or any(map(_software_token, parts))


def is_garbage(words: str) -> bool:
    """Words that are not clinical language wherever they stand: a software identifier, a code system's name or
    URI, a program's null. Told by shape, so a producer not seen before is read the same way."""
    said = words.strip()
    if not said:
        return True
    if said.lower() in _display().software_nulls or _URI.match(said) or _GUID.match(said) or _OID.match(said):
        return True
    if not re.search(r"\s", said) and ("@" in said or _software_underscored(said) or _software_dotted(said)
                                        or _software_token(said)):
        return True
    system = _normal(said)  # "SNOMED CT", "LOINC"; a short one is also a clinical abbreviation (ICD, SCT, CPT)
    named = len(system) >= _LEAST_SYSTEM_NAME or any(c.isdigit() for c in system)  # "CPT-4", "ICD-9" are names
    return bool(_TEMPLATE.search(said)) or (named and system in _display().systems)


_LEAST_SYSTEM_NAME = 5


def _software_underscored(token: str) -> bool:
    """"allergy_intolerance", "REACTION_TYPE_CD": words a program joined; not a variant ("KRAS_G12C"), a fusion
    ("BCR_ABL") nor an accession ("NM_000546"), which join two parts of capitals and digits."""
    parts = token.strip("_").split("_")
    return bool(_UNDERSCORED.match(token)) and (any(c.islower() for c in token)
                                                 or (len(parts) >= 3 and all(p.isalpha() for p in parts if p)))


@cache
def _placeholder_words(kind: str) -> frozenset[str]:
    """The words that name only the record `kind` is: the words of its type and element names ("AllergyIntolerance
    .reaction" -> allergy, intolerance, reaction), their other names (display.toml), the words of any record."""
    table = _display()
    words = set(table.any_words)
    for segment in (s for s in kind.split(".") if s):
        parts = [p.lower() for p in _CAMEL_PARTS.findall(segment)]
        for key in (segment.lower(), *parts):
            words |= {key, *table.words_by_key.get(key, ())}
    return frozenset(words)


def _known(token: str, words: frozenset[str]) -> bool:
    return token in words or (token.endswith("s") and token[:-1] in words) or \
        (token.endswith("ies") and token[:-3] + "y" in words)


def is_placeholder(words: str, kind: str = "") -> bool:
    """`is_garbage`, or, for the concept that names a record of `kind`, words that say only what kind of record it
    is ("Problem", "Diagnosis", "Problem List Item" for a Condition) or that nothing is known (a null flavour)."""
    if is_garbage(words):
        return True
    if not kind:
        return False
    said = _SEMANTIC_TAG.sub("", words).strip()
    table = _display()
    if said in table.null_codes or said.lower().strip(" .") in table.null_words:
        return True
    tokens = _tokens(said)
    return not tokens or all(_known(t, _placeholder_words(kind)) for t in tokens)


def _says_nothing(system: str, code: str, display: str, kind: str) -> bool:
    """A coding that is itself a placeholder for a record of `kind`: a null flavour, a code that names nothing of
    that kind (ccda.toml's generic problems and substances), or a placeholder display (its code means the same)."""
    if not kind:
        return False  # a value coded "unknown" is an answer ("pregnancy status: unknown"), not a placeholder
    if any(marker in system for marker in _NULL_SYSTEM):
        return True
    keys = {s.lower() for s in kind.split(".")}
    if any(code in _display().codes_by_key.get(key, ()) for key in keys):
        return True
    return bool(display.strip()) and not is_garbage(display) and is_placeholder(display, kind)


def _repeats_code(display: str, code: str) -> bool:
    """A display that only repeats a code holding a digit ("I10" for I10): the code, named with its system, says
    more."""
    return display.strip() == code.strip() and any(ch.isdigit() for ch in code)


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


_NOTE_LIMIT = 400  # characters of one note in a line: the face sheet repeats allergy and problem lines


def notes(value: Any) -> str:
    """Annotations (`note`) as "; "-joined text, each folded to one line and cut at `_NOTE_LIMIT` (marked "…");
    a note that is only a placeholder or a program's null is passed over."""
    said = []
    for annotation in objects(value):
        text = annotation.get("text")
        if isinstance(text, str) and (folded := " ".join(text.split())) and not is_garbage(folded):
            said.append(folded if len(folded) <= _NOTE_LIMIT else folded[:_NOTE_LIMIT - 1].rstrip() + "…")
    return "; ".join(dict.fromkeys(said))
