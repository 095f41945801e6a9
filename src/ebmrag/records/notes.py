"""Clinical notes -> one fragment per note section.

Notes arrive as attachments (records.attachments decodes them) and as document narratives. A note is
long and mixes the allergy status, the assessment and the social history, so it is split at its
headings ("# Allergies", "<h2>") and each section becomes a fragment named after its heading: the tier
rules then see "clinical note > allergies" and the packer can keep the allergy line without the rest of
the note. A long section without headings is cut at sentence ends into parts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser

from ebmrag.text.sentences import split_sentences

MAX_PART_WORDS = 160
# A statement that there is nothing, or nothing known: it means something only beside its heading ("Surgical
# history: none" is a fact, "None" alone is not), so a note section or a document section made of it keeps its title.
NOTHING = re.compile(r"^(?:none|nil|n/?a|not applicable|not available|no (?:information|data)(?: available)?|"
                     r"unknown|not known|non[- ]?contributory|negative|normal|unremarkable|nothing (?:of note|"
                     r"significant|to report))\W*(?:recorded|reported|known|noted)?\W*$", re.IGNORECASE)

_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_DATE_LINE = re.compile(r"^\s*\d{4}-\d{2}-\d{2}(?:[T ][\d:.+-]+)?\s*$")
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "section", "article", "table", "ul", "ol", "pre"}


@dataclass(frozen=True)
class NoteSection:
    heading: str  # "" for text before the first heading
    text: str  # whitespace-normalised body, lines joined


class _HtmlText(HTMLParser):
    """HTML -> markdown-ish text: headings become "# ..." lines, blocks become line breaks, scripts vanish."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n" + "#" * int(tag[1]) + " ")
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) or tag in _BLOCK_TAGS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(";")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data.replace("\n", " "))


def html_to_text(html: str) -> str:
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


def note_sections(text: str) -> list[NoteSection]:
    """Split a note at its markdown headings; a leading date line is dropped (the resource carries the date)."""
    sections: list[NoteSection] = []
    heading, lines = "", list[str]()
    for line in text.splitlines():
        match = _HEADING.match(line)
        if match:
            sections.extend(_section(heading, lines))
            heading, lines = match.group(2).strip(), []
        elif not (not sections and not heading and _DATE_LINE.match(line)):
            lines.append(line)
    sections.extend(_section(heading, lines))
    return sections


def _section(heading: str, lines: Sequence[str]) -> Iterator[NoteSection]:
    """A section, cut at sentence ends into parts of at most MAX_PART_WORDS words: a ten-page PDF without
    headings is many fragments the packer can choose among, not one that never fits a window. A body that only
    says there is nothing keeps its heading in its text: "None." says nothing in a packed context, "Surgical
    history: None." does."""
    body = " ".join(" ".join(lines).split())
    if heading and NOTHING.match(body):
        body = f"{heading}: {body}"
    part: list[str] = []
    count, number = 0, 1
    for sentence in split_sentences(body):
        words = len(sentence.text.split())
        if part and count + words > MAX_PART_WORDS:
            yield NoteSection(heading if number == 1 else f"{heading or 'note'} (part {number})", " ".join(part))
            part, count, number = [], 0, number + 1
        part.append(sentence.text)
        count += words
    if part:
        yield NoteSection(heading if number == 1 else f"{heading or 'note'} (part {number})", " ".join(part))


def slug(heading: str) -> str:
    """A stable, readable id part for a section heading."""
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "text"
