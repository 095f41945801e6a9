"""Identifiers out of everything sent to an outside model, and back into the answer shown to the user.

Two sources: the identifiers the record itself knows (a FHIR Patient's name, identifiers such as the
MRN, birth date, address and telecom) and patterns (phone numbers, e-mail addresses, ID-like numbers,
exact dates). Each distinct value gets a stable placeholder for one answer ("[NAME-1]", "[PHONE-1]");
an exact date becomes its distance in days from the record's newest date ("[DAY-23]"), so intervals
survive, which is what clinical reasoning needs from dates. The answer is restored before anyone
reads it; the trace says which kinds were replaced and how many times, never the values.

Whether to redact: `[answer] redact = "auto"` redacts whenever the model endpoint is not on this
machine (`local_hosts`), "always" and "never" decide outright.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from urllib.parse import urlparse

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_PHONE = re.compile(r"(?<![\w/.-])(?:\+?\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])"
                    r"\d{3,4}[\s.-]\d{3,4}(?![\w/.-])")
# ID-like: letters then >= 5 digits (MRN12345), >= 8 bare digits, or a US SSN; a lab value ("150000/mm3") is not.
_ID_NUMBER = re.compile(r"\b[A-Z]{1,4}-?\d{5,}\b|\b\d{8,}\b|\b\d{3}-\d{2}-\d{4}\b")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?:T[\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)?\b")
_PLACEHOLDER = re.compile(r"\[(?:[A-Z_]+-\d+|DAY[+-]\d+)\]")


def should_redact(mode: str, base_url: str, local_hosts: Sequence[str] = LOCAL_HOSTS) -> bool:
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"redact must be auto, always or never, got {mode!r}")
    if mode != "auto":
        return mode == "always"
    return (urlparse(base_url).hostname or "") not in set(local_hosts)


@dataclass
class Redactor:
    """One answer's mapping: identifier -> placeholder, and back."""

    known: Sequence[tuple[str, str]] = ()  # (kind, value) from the record: ("name", "Lindsay928 Gerlach374")
    reference: date | None = None  # exact dates become days from this one
    _forward: dict[str, str] = field(default_factory=dict)
    _back: dict[str, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)

    def _placeholder(self, kind: str, value: str) -> str:
        if value not in self._forward:
            number = sum(1 for p in self._forward.values() if p.startswith(f"[{kind.upper()}-")) + 1
            self._forward[value] = f"[{kind.upper()}-{number}]"
            self._back[self._forward[value]] = value
        return self._forward[value]

    def _replace(self, text: str, pattern: re.Pattern[str], kind: str) -> str:
        def swap(match: re.Match[str]) -> str:
            if _PLACEHOLDER.fullmatch(match.group(0)):
                return match.group(0)
            self.counts[kind] += 1
            return self._placeholder(kind, match.group(0))
        return pattern.sub(swap, text)

    def _day(self, match: re.Match[str]) -> str:
        try:
            day = date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
        except ValueError:
            return match.group(0)
        if self.reference is None:
            self.counts["date"] += 1
            return self._placeholder("date", match.group(0))
        offset = (day - self.reference).days
        token = f"[DAY{offset:+d}]"
        self._back.setdefault(token, match.group(0)[:10])
        self.counts["date"] += 1
        return token

    def apply(self, text: str) -> str:
        """Known identifiers first (longest first, so a full name goes before its given name), then patterns."""
        for kind, value in sorted(self.known, key=lambda kv: -len(kv[1])):
            if len(value) >= 3 and value in text:
                self.counts[kind] += text.count(value)
                text = text.replace(value, self._placeholder(kind, value))
        text = self._replace(text, _EMAIL, "email")
        text = self._replace(text, _PHONE, "phone")
        text = _ISO_DATE.sub(self._day, text)
        return self._replace(text, _ID_NUMBER, "id")

    def restore(self, text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: self._back.get(m.group(0), m.group(0)), text)

    def summary(self) -> dict[str, int]:
        """Kinds and how many replacements: what the trace may show."""
        return dict(sorted(self.counts.items()))


def redactor_for(identifiers: Sequence[tuple[str, str]], newest: datetime | None) -> Redactor:
    return Redactor(tuple(identifiers), newest.date() if newest else None)
