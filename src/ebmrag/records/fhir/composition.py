"""A document's Composition: its section narratives as notes of their section.

Patient-summary documents (IPS, C-CDA conversions, case reports) carry each section twice: as structured
entries and as the XHTML narrative a person reads. Often the narrative only repeats the entries (a table
of the same allergies); sometimes it is the only place a fact is written (a resolved problem, a comment,
a section without entries). So a narrative becomes a note of its section unless its words are already in
the section's entries, or it is a placeholder ("To be populated", the same stock sentence in every
section, an empty div). Every narrative read or passed over is counted for the trace.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.records.codes import document_sections
from ebmrag.records.fhir.coding import codings, obj, objects, text_of
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.notes import NOTHING, html_to_text, note_sections, slug

_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
# Stock text a producer writes where a narrative should be (any language's would be added here).
_PLACEHOLDER = re.compile(r"^(?:to be (?:populated|generated|completed)|narrative (?:needs to be|to be|will be) "
                          r"generated|not (?:yet )?(?:populated|generated)|no narrative)\b", re.IGNORECASE)
_NOVEL_SHARE = 0.35  # below this share of words not found in its entries, a narrative repeats them
_NOVEL_LEAST = 3  # ... or when fewer words than this are new
_HEADER_CELL = re.compile(r"<th\b[^>]*>.*?</th>|<thead\b[^>]*>.*?</thead>", re.IGNORECASE | re.DOTALL)
# Dates written out ("Sept 17, 2014") are the entries' dates in another format, not new facts.
_MONTH = re.compile(r"^(jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*$")


@dataclass(frozen=True)
class SectionNote:
    section: str  # "Clinical note > Allergies and intolerances"
    text: str
    id_suffix: str


def _sections(sections: Any, depth: int = 0) -> Iterator[Mapping[str, Any]]:
    for section in objects(sections):
        yield section
        if depth < 4:
            yield from _sections(section.get("section"), depth + 1)


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a resource (its displays, dates, statuses): what a table narrative would render."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping) and depth < 8:
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif isinstance(value, list) and depth < 8:
        for item in value:
            yield from _strings(item, depth + 1)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def _repeats_entries(div: str, section: Mapping[str, Any], index: ChartIndex) -> bool:
    """True when the narrative's words, table headers and written-out months aside, are its entries' words."""
    entries = [found for link in objects(section.get("entry")) if (found := index.resolve(link)) is not None]
    if not entries:
        return False
    known = _words(" ".join(s for r in entries for s in _strings(r)) + " " + str(section.get("title") or ""))
    words = {w for w in _words(html_to_text(_HEADER_CELL.sub(" ", div))) if not _MONTH.match(w)}
    novel = words - known
    return not words or len(novel) < _NOVEL_LEAST or len(novel) / len(words) < _NOVEL_SHARE


def section_notes(composition: Resource, index: ChartIndex, unused: Counter[str]) -> list[SectionNote]:
    """The narratives worth reading as notes; what was passed over is counted in `unused` with the reason."""
    found: list[tuple[str, str, Mapping[str, Any]]] = []
    for section in _sections(composition.get("section")):
        div = obj(section.get("text")).get("div")
        text = " ".join(html_to_text(div).split()) if isinstance(div, str) else ""
        title = section.get("title") if isinstance(section.get("title"), str) else text_of(section.get("code"))
        if text:
            found.append((title or "section", text, section))
    if not found:
        unused["Composition: no section narrative (its entries are read from their resources)"] += 1
    stock = {t for t, n in Counter(text for _, text, _ in found).items() if n >= 2 and len(t) < 200}
    notes = _empty_sections(composition)
    said = {id(section) for section in _sections(composition.get("section")) if section.get("emptyReason")}
    for title, text, section in found:
        if id(section) in said:
            continue  # its narrative is the statement of why it is empty, read above
        if NOTHING.match(text) and title != "section":
            notes.append(SectionNote(f"Clinical note > {title}", f"{title}: {text.rstrip('.')}.", f"#{slug(title)}"))
        elif text in stock or _PLACEHOLDER.match(text) or not _words(text) - _words(title):  # nothing but its title
            unused["Composition: section narrative that is a placeholder"] += 1
        elif _repeats_entries(str(obj(section.get("text")).get("div")), section, index):
            unused["Composition: section narrative that repeats its entries"] += 1
        elif text in index.notes_seen:
            unused["Composition: section narrative already read (read once)"] += 1
        else:
            index.notes_seen.add(text)
            notes += _as_notes(title, obj(section.get("text")).get("div"))
    return notes


def _empty_sections(composition: Resource) -> list[SectionNote]:
    """An allergy, medication or problem section that is empty on purpose (`emptyReason`: "Nil Known", "Not
    Asked", "Unavailable") becomes that status, in the chart's words: its reason and its narrative. Which
    sections state a fact when empty (an empty allergy section "Nil Known" is a statement of no known allergies,
    "Not Asked" is not) is rules/records/sections.toml's `empty`."""
    notes = []
    known = document_sections()
    for section in _sections(composition.get("section")):
        if not section.get("emptyReason"):
            continue
        kind = next((known.empty_status[code] for _, code, _ in codings(section.get("code"))
                     if code in known.empty_status), None)
        if kind is None:
            continue
        div = obj(section.get("text")).get("div")
        narrative = _statement(div) if isinstance(div, str) else ""
        code = next((c for _, c, _ in codings(section.get("emptyReason"))), "")
        named = obj(section.get("emptyReason")).get("text") or any(d for _, _, d in codings(section.get("emptyReason")))
        reason = text_of(section.get("emptyReason")) if named else known.empty_reason.get(code, code)
        said = "; ".join(dict.fromkeys(s for s in (reason, narrative if len(narrative.split()) <= 40 else "") if s))
        notes.append(SectionNote(kind.section, f"{kind.label}: {said.rstrip('.')}.", f"#empty-{slug(kind.section)}"))
    return notes


def _statement(div: str) -> str:
    """What an empty section's narrative says, without its headings and table headers (an empty table of
    "Allergen; Status; Category" says nothing)."""
    text = html_to_text(_HEADER_CELL.sub(" ", div))
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    said = " ".join(" ".join(lines).split()).strip(" ;")
    return said if _words(said) else ""


def _as_notes(title: str, div: Any) -> Sequence[SectionNote]:
    text = html_to_text(str(div))
    parts = note_sections(text)
    return [SectionNote(f"Clinical note > {title}" + (f" > {p.heading}" if p.heading else ""), p.text,
                        f"#{slug(title)}" + (f"-{slug(p.heading)}" if p.heading else "")) for p in parts]
