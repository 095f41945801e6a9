"""Typed records shared by every stage: a patient fragment, its evidence tier, and a patient record."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.records.dates import Today


class Tier(StrEnum):
    """Evidence tier by diagnostic objectivity: T1 is the most objective and the most dangerous to lose.

    T1 pathology, genetics, high-risk allergy; T2 imaging, labs, functional tests; T3 examination; T4 patient report.
    """

    T1 = "T1"
    T2 = "T2"
    T3 = "T3"
    T4 = "T4"

    @property
    def rank(self) -> int:
        return int(self.value[1])

    @property
    def compressible(self) -> bool:
        """Only objective evidence (T1/T2) has the entity-preserving compressed state B."""
        return self in (Tier.T1, Tier.T2)


def parse_timestamp(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordError(where, f"timestamp must be an ISO-8601 string or null, got {type(value).__name__}")
    try:
        stamp = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise RecordError(where, f"not an ISO-8601 date/time: {value!r}") from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> str | None:
    """A JSON `\\udXXX` escape without its pair is not Unicode: it breaks hashing, storage and tokenizers later,
    far from the file. Returns a description naming the offset, or None."""
    match = _SURROGATE.search(text)
    return f"an unpaired UTF-16 surrogate (\\u{ord(match.group()):04x}) at character {match.start()}" if match else None


@dataclass(frozen=True)
class TierDecision:
    """Why a fragment got its tier: the rule that fired, so a clinician can audit and amend the rule file."""

    tier: Tier
    rule_id: str
    standing: bool = False
    must_keep: bool = False
    critical: bool = False  # a critical (panic) result: level 2 when current, level 3 (history) when older
    finding: str = ""  # what a detector found: "drug=amoxicillin; reaction=urticaria", "potassium 6.8 mmol/L ..."
    always: str = ""  # packing level 1 whatever its age, and why: "allergy", "face_sheet", "question_need"
    severe: bool = False  # a severe or high-risk allergy or reaction: first when allergies alone overflow the window
    flag: str = ""  # what its results say: "critical", "abnormal", "normal" or "" (evidence.result_flags); a
    # normal result is not a finding, an abnormal one ranks above the rest of its level (packing.levels)


@dataclass(frozen=True)
class Fragment:
    """One unit of patient evidence: a history item, an exam finding, a lab panel, a report.

    `standing` facts (allergies, pathology, genetics, chronic diagnoses) do not decay with age;
    it comes from the tier decision and is kept on the fragment so packing needs nothing else.
    `date_in_future`: its timestamp lies after the present it was read or packed at (records.dates.Today): the
    date is kept and shown flagged, but never makes the fragment the newest, today's or more recent than today's.
    """

    id: str
    patient_id: str
    text: str
    section: str | None = None
    timestamp: datetime | None = None
    source: str | None = None
    decision: TierDecision | None = field(default=None, compare=False)
    encounter: str | None = None  # the visit it belongs to, when the source says (FHIR, ebmrag JSON)
    date_in_future: bool = False

    @property
    def tier(self) -> Tier:
        if self.decision is None:
            raise RecordError(f"fragment {self.id!r}", "has no tier yet; run the TierClassifier first")
        return self.decision.tier

    def with_decision(self, decision: TierDecision) -> Fragment:
        return replace(self, decision=decision)

    def flagged_at(self, today: Today) -> Fragment:
        """This fragment with `date_in_future` set when its timestamp lies after `today` (a flag once set stays)."""
        if self.date_in_future or not today.is_future(self.timestamp):
            return self
        return replace(self, date_in_future=True)


@dataclass(frozen=True)
class Coverage:
    """How the elements of a chart's resources reached its fragments (records.fhir.coverage): how many populated
    elements were audited and how many a renderer said; per documented kind, the elements that carry no clinical
    content (rules/records/coverage.toml); per path, the clinical elements said only by the generic line appended to
    their resource (which renderers to improve), and those not said at all (should be none). Empty (no elements)
    for a record that was not read from FHIR or C-CDA."""

    elements: int = 0
    rendered: int = 0
    documented: tuple[tuple[str, int], ...] = ()  # (rule name, elements), most first
    generic: tuple[tuple[str, int], ...] = ()  # (path, elements), most first
    unrendered: tuple[tuple[str, int], ...] = ()  # (path, elements), most first

    def to_json(self) -> dict[str, Any]:
        return {"elements": self.elements, "rendered": self.rendered, "documented": dict(self.documented),
                "generic": dict(self.generic), "unrendered": dict(self.unrendered)}


@dataclass(frozen=True)
class PatientRecord:
    """All fragments of one patient. Construction enforces that no other patient's fragment slips in."""

    patient_id: str
    fragments: tuple[Fragment, ...]
    origin: str = "<memory>"
    skipped: tuple[str, ...] = ()  # what the loader read but did not turn into fragments, and why
    identifiers: tuple[tuple[str, str], ...] = ()  # (kind, value) the source names (FHIR Patient): for redaction only
    # How its elements reached its fragments; kept in memory only: the stores keep what the fragments say, and a
    # record read back from one was not audited.
    coverage: Coverage = Coverage()

    def __post_init__(self) -> None:
        if not self.patient_id.strip():
            raise RecordError(self.origin, "patient_id is empty")
        seen: set[str] = set()
        for fragment in self.fragments:
            if fragment.patient_id != self.patient_id:
                raise RecordError(
                    f"{self.origin}: fragment {fragment.id!r}",
                    f"belongs to patient {fragment.patient_id!r}, not {self.patient_id!r}",
                )
            if fragment.id in seen:
                raise RecordError(f"{self.origin}: fragment {fragment.id!r}", "duplicate fragment id")
            seen.add(fragment.id)

    @property
    def latest_timestamp(self) -> datetime | None:
        """The newest trustworthy timestamp: a fragment dated in the future (`date_in_future`) never sets it."""
        stamps = [f.timestamp for f in self.fragments if f.timestamp is not None and not f.date_in_future]
        return max(stamps) if stamps else None

    def flagged_at(self, today: Today) -> PatientRecord:
        """The record with every fragment dated after `today` flagged `date_in_future` (itself when none is)."""
        flagged = tuple(f.flagged_at(today) for f in self.fragments)
        changed = any(a is not b for a, b in zip(flagged, self.fragments, strict=True))
        return replace(self, fragments=flagged) if changed else self

    def replace_fragments(self, fragments: Iterable[Fragment]) -> PatientRecord:
        return replace(self, fragments=tuple(fragments))
