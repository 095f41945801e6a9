"""The unit of knowledge: a normalized document with typed sections and a content hash.

The hash covers everything that changes what gets indexed (text, title, sections, metadata), so
re-ingesting an unchanged document is a no-op and any edit replaces all of its chunks.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field

AUTHORITIES = ("guideline", "systematic_review", "trial", "cohort", "textbook", "other")

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\ufeff]")
_SPACES = re.compile(r"[ \t\u00a0\u3000]+")
_TRAILING = re.compile(r" +\n")
_BLANK_LINES = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """NFKC, no control characters, one space for runs of spaces, at most one blank line in a row."""
    text = unicodedata.normalize("NFKC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _TRAILING.sub("\n", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


@dataclass(frozen=True)
class Section:
    """A named span `text[start:end]` of a document; `section_id` is its citable id (e.g. a MedQuAD answer id)."""

    title: str
    start: int
    end: int
    section_id: str = ""


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    source: str
    source_type: str
    title: str = ""
    sections: tuple[Section, ...] = ()
    date: str = ""
    authority: str = "other"
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.doc_id.strip():
            raise ValueError("a document needs a non-empty doc_id")
        if not self.text.strip():
            raise ValueError(f"document {self.doc_id!r} has no text")
        if self.authority not in AUTHORITIES:
            raise ValueError(f"document {self.doc_id!r}: authority {self.authority!r} is not one of {AUTHORITIES}")
        for section in self.sections:
            if not 0 <= section.start < section.end <= len(self.text):
                raise ValueError(f"document {self.doc_id!r}: section {section.title!r} lies outside the text")

    @property
    def content_hash(self) -> str:
        payload = {
            "text": self.text,
            "title": self.title,
            "sections": [[s.title, s.start, s.end, s.section_id] for s in self.sections],
            "source": self.source,
            "date": self.date,
            "authority": self.authority,
            "metadata": dict(sorted(self.metadata.items())),
        }
        return hashlib.sha256(json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()).hexdigest()

    def section_at(self, offset: int) -> Section | None:
        for section in self.sections:
            if section.start <= offset < section.end:
                return section
        return None


class DocumentBuilder:
    """Builds a document text from titled parts while recording each part's span as a section."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._sections: list[Section] = []
        self._length = 0

    def add(self, title: str, body: str, section_id: str = "") -> None:
        body = normalize_text(body)
        if not body:
            return
        if self._parts:
            self._parts.append("\n\n")
            self._length += 2
        self._sections.append(Section(title, self._length, self._length + len(body), section_id))
        self._parts.append(body)
        self._length += len(body)

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def sections(self) -> tuple[Section, ...]:
        return tuple(self._sections)
