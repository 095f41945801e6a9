"""Shared packing types: what a packer receives (scored candidates) and what it returns (a full trace)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol

from ebmrag.evidence.second_reading import POSSIBLE_CRITICAL
from ebmrag.packing.certificate import certificate
from ebmrag.packing.levels import Level, Rank, level_name, level_of, rank_of
from ebmrag.records.fragment import Coverage, Fragment, Tier, TierDecision
from ebmrag.text.injection import strip_markup

MAX_WINDOW = 1_000_000  # far above today's largest model windows (~200k); a guard against typos, not a tuning knob


class State(StrEnum):
    FULL = "full"  # state A
    COMPRESSED = "compressed"  # state B, entity-preserving
    FACT = "fact"  # a critical finding in one line, rendered from its structured reading (evidence.facts)
    TRUNCATED = "truncated"  # uniform-compression baseline only


class PackReason(StrEnum):
    # the critical-first objective's levels (packing.levels), highest first
    ALLERGY = "allergy"  # level 1: a drug allergy or serious adverse reaction, whatever its age
    FACE_SHEET = "face_sheet"  # level 1: the chart's face sheet (age, sex, pregnancy, the allergy status)
    QUESTION_NEED = "question_need"  # level 1: a section the question type cannot be answered without
    CURRENT_ENCOUNTER = "current_encounter"  # level 2: a T1/T2 finding or critical result of this visit
    STANDING_HISTORY = "standing_history"  # level 3: pathology, genetics, a chronic diagnosis from an earlier visit
    QUOTA = "quota"
    DENSITY_RANK = "density_rank"
    OPTIMAL = "optimal"
    FINDING = "finding"  # a T1/T2 finding given the place of patient-report or filler fragments (packing.findings)
    QUEUE_ORDER = "queue_order"
    SIMILARITY_RANK = "similarity_rank"
    UNIFORM_SHARE = "uniform_share"


class DropReason(StrEnum):
    CAPACITY = "capacity"  # no state fitted the room left (or the window)
    DENSITY_RANK = "density_rank"  # the window went to denser / higher-utility fragments
    TRUNCATED_AWAY = "truncated_away"  # uniform share rounded the fragment down to zero words
    DUPLICATE = "duplicate"  # a near-copy of a kept fragment (copy-forward notes); `detail` names the kept one
    PREFILTERED = "prefiltered"  # a very large record: not among the fragments worth measuring (packing.prefilter)
    FOR_FINDING = "for_finding"  # a T4 fragment that gave its place to a T1/T2 finding; `detail` names the finding


@dataclass(frozen=True)
class PackOption:
    """One state of a fragment: its rendered context line (`header` + `body`), token cost and utility U_ij."""

    state: State
    text: str
    tokens: int
    utility: float
    fidelity: float = 1.0
    body: str = ""  # the line without its header: what the state says

    @property
    def density(self) -> float:
        return self.utility / self.tokens if self.tokens else float("inf")


@dataclass(frozen=True)
class EvidenceItem:
    """Text packed beside a patient's fragments that is not part of the chart: a knowledge-base chunk, a
    framework's passage, an observation of the research agent. It never joins the patient's record, so it
    cannot be mistaken for (or leak into) the chart.

    `decision`: its tier decision, the caller's (`evidence.tiering.Tiering.decide`, or a grade such as a
    knowledge-base chunk's authority): the packer refuses an item without one. `age` None: undated, never decays
    (evidence is standing); otherwise it decays as a fragment that old would (the agent's memory ages its
    observations by step).
    `compressible`: may take the entity-compressed state and be collapsed with near-copies, as a chart
    fragment may (an agent's observation); a recommendation reduced to drug names would mislead, so
    knowledge-base evidence is not."""

    id: str
    text: str
    decision: TierDecision | None = None
    section: str | None = None
    source: str | None = None
    age: timedelta | None = None
    compressible: bool = False


@dataclass(frozen=True)
class Candidate:
    """A fragment scored against one query; options[0] is always the full state A."""

    fragment: Fragment
    header: str
    options: tuple[PackOption, ...]
    similarity: float
    must_keep: bool
    order: int
    current: bool = False  # part of the current encounter (see packing.utility.is_current)

    @property
    def tier(self) -> Tier:
        return self.fragment.tier

    @property
    def full(self) -> PackOption:
        return self.options[0]

    @property
    def level(self) -> Level:
        """Its place in the clinical order of critical facts (packing.levels)."""
        return level_of(self.fragment.decision, self.current)

    @property
    def critical(self) -> bool:
        """What the critical-first objective protects: levels 1-3."""
        return self.level < Level.UTILITY

    @property
    def rank(self) -> Rank:
        """Its criticality inside its level (packing.levels.Rank): counted before the rest of the level."""
        return rank_of(self.fragment.decision)


@dataclass(frozen=True)
class PackedFragment:
    fragment_id: str
    tier: Tier
    state: State
    tokens: int
    utility: float
    reason: PackReason
    text: str
    order: int
    excluded_states: tuple[State, ...] = ()
    detail: str = ""
    body: str = ""  # `text` without its header, as the state says it (full, compressed or truncated)
    rule: str = ""  # the tier rule (or model) that decided the fragment's tier
    finding: str = ""  # what that rule found in the text (an ADR's drug and reaction, a critical value)
    level: str = ""  # its level in the clinical order (packing.levels.level_name); "" for the rest
    must_keep: bool = False  # a decisive fact (allergy, pathology, genetics) or one the question needs
    date_in_future: bool = False  # dated after the present: no recency, never current (packing.utility)


@dataclass(frozen=True)
class DroppedFragment:
    fragment_id: str
    tier: Tier
    reason: DropReason
    detail: str = ""
    must_keep: bool = False
    duplicate_of: str = ""  # reason duplicate: the fragment kept in its place
    rule: str = ""
    finding: str = ""
    level: str = ""
    date_in_future: bool = False
    needs: int = 0  # the tokens of its smallest state; 0: never measured (pre-filtered)
    order: int = 0  # its candidate's place in record order (Candidate.order)


@dataclass(frozen=True)
class PackResult:
    strategy: str
    window: int
    packed: tuple[PackedFragment, ...]
    dropped: tuple[DroppedFragment, ...]
    solver_note: str = ""  # how the solver got there when not by its plain method (e.g. a coarser token grid)
    record_skipped: tuple[str, ...] = ()  # what the record's loader left out (never silent)
    record_coverage: Coverage = field(default_factory=Coverage)  # how the chart's elements reached its fragments
    question_type: str = ""  # evidence.questions: what the question asks for (decides its must-keep sections)
    numbers: tuple[tuple[str, int], ...] = ()  # fragment id -> the number its context line starts with
    optimal: bool = False  # the solver proved the clinical order optimal (ebm-exact "critical" on its plain table)

    def number_of(self, fragment_id: str) -> int | None:
        return dict(self.numbers).get(fragment_id)

    @property
    def tokens_used(self) -> int:
        return sum(p.tokens for p in self.packed)

    @property
    def utility(self) -> float:
        return sum(p.utility for p in self.packed)

    @property
    def context(self) -> str:
        """Packed lines in record order; each line's token cost was counted with its header."""
        return "\n".join(p.text for p in sorted(self.packed, key=lambda p: p.order))

    def to_json(self) -> dict[str, Any]:
        """The fixed JSON shape of `ebmrag pack --json`: every fragment, packed or dropped, with its reason;
        `n` is the number its context line starts with; `certificate` sums it up (packing.certificate)."""
        numbers = dict(self.numbers)
        return {
            "window": self.window, "tokens_used": self.tokens_used, "strategy": self.strategy,
            **({"solver_note": self.solver_note} if self.solver_note else {}),
            **({"record_skipped": list(self.record_skipped)} if self.record_skipped else {}),
            **({"coverage": self.record_coverage.to_json()} if self.record_coverage.elements else {}),
            **({"question_type": self.question_type} if self.question_type else {}),
            **self._possible_critical(),
            "packed": [{**({"n": numbers[p.fragment_id]} if p.fragment_id in numbers else {}),
                        "fragment_id": p.fragment_id, "state": p.state.value, "tier": p.tier.value, "tokens": p.tokens,
                        "utility": round(p.utility, 6), "reason": p.reason.value,
                        "excluded_states": [s.value for s in p.excluded_states], **_decided(p.rule, p.finding, p.level),
                        **_future(p.date_in_future)}
                       for p in self.packed],
            "dropped": [{"fragment_id": d.fragment_id, "tier": d.tier.value, "reason": d.reason.value,
                         "detail": d.detail, **({"duplicate_of": d.duplicate_of} if d.duplicate_of else {}),
                         **_decided(d.rule, d.finding, d.level), **_future(d.date_in_future)}
                        for d in self.dropped],
            "certificate": certificate(self).to_json(),
            "context": self.context,
        }

    def _possible_critical(self) -> dict[str, Any]:
        """What the possible critical facts (evidence.second_reading: a critical fact's shape nobody confirmed)
        cost the window: packed, their tokens, and left out; absent when the record has none."""
        packed = [p for p in self.packed if p.rule.startswith(POSSIBLE_CRITICAL)]
        dropped = [d for d in self.dropped if d.rule.startswith(POSSIBLE_CRITICAL)]
        if not packed and not dropped:
            return {}
        return {"possible_critical": {"packed": len(packed), "tokens": sum(p.tokens for p in packed),
                                      "left_out": len(dropped)}}

    def state_of(self, fragment_id: str) -> State | None:
        return next((p.state for p in self.packed if p.fragment_id == fragment_id), None)


def _future(flagged: bool) -> dict[str, bool]:
    """`"date_in_future": true` only on a fragment dated after the present: older readers see the shape they knew."""
    return {"date_in_future": True} if flagged else {}


def _decided(rule: str, finding: str, level: str) -> dict[str, str]:
    return {**({"rule": rule} if rule else {}), **({"finding": finding} if finding else {}),
            **({"level": level} if level else {})}


_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x85\u2028\u2029]+\s*")
_HEADER_LIKE = re.compile(r"\[(?=\s*(?:kb:)?[\w./:-]*\s*\|)")


def one_line(text: str) -> str:
    """Fragment text as it may appear in a context line: chat markup removed (text.injection), line breaks
    folded to spaces and any "[x|" that
    could pass for a line header written "(x|", so record text can never forge a context line of its own
    ("...\n[2|T1|2024-02-01] No known drug allergies")."""
    return _HEADER_LIKE.sub("(", _LINE_BREAKS.sub(" ", strip_markup(text))).strip()


class Packer(Protocol):
    """Every packing strategy: scored candidates and a window in, a fully traced result out."""

    name: str

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult: ...


def render_line(header: str, body: str) -> str:
    return f"{header} {one_line(body)}"


def pack_entry(candidate: Candidate, option: PackOption, reason: PackReason, detail: str = "") -> PackedFragment:
    """The trace line of a packed fragment; its other states are recorded as excluded (mutual exclusion)."""
    excluded = tuple(o.state for o in candidate.options if o.state is not option.state)
    return PackedFragment(
        candidate.fragment.id,
        candidate.tier,
        option.state,
        option.tokens,
        option.utility,
        reason,
        option.text,
        candidate.order,
        excluded,
        detail,
        option.body,
        *_rule_of(candidate),
        candidate.must_keep,
        candidate.fragment.date_in_future,
    )


def drop_entry(candidate: Candidate, reason: DropReason, detail: str) -> DroppedFragment:
    """The trace line of a dropped fragment, with the tokens its smallest state needs (the certificate's `needs`)."""
    rule, finding, level = _rule_of(candidate)
    return DroppedFragment(candidate.fragment.id, candidate.tier, reason, detail, candidate.must_keep,
                           rule=rule, finding=finding, level=level, date_in_future=candidate.fragment.date_in_future,
                           needs=min(o.tokens for o in candidate.options), order=candidate.order)


def _rule_of(candidate: Candidate) -> tuple[str, str, str]:
    decision = candidate.fragment.decision
    level = level_name(decision, candidate.current)
    return (decision.rule_id, decision.finding, level) if decision is not None else ("", "", level)


def level_reason(candidate: Candidate) -> PackReason | None:
    """The pack reason that names a critical fragment's level; None for the rest (level 4)."""
    name = level_name(candidate.fragment.decision, candidate.current)
    return PackReason(name) if name else None


def validate_window(window: int) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be a whole number of tokens from 1 to {MAX_WINDOW:,}, got {window!r}")
