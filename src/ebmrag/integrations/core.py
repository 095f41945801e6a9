"""What every framework drop-in shares: retrieved passages and one patient's record packed by EBM-Pack.

A framework hands over the passages its retriever found (LlamaIndex nodes, LangChain or Haystack documents); the
drop-in turns them into `Passage`s, and `EvidencePacker.run` packs them together with the patient's fragments into
a token budget, the way `ebmrag ask` packs knowledge-base chunks: a passage gets tier T3 when its metadata names a
guideline or systematic review as its authority and T4 otherwise, so the patient's own results (T1/T2) and must-keep
facts (a penicillin anaphylaxis, a biopsy result) are placed first and are never pushed out by long retrieved text.
Every passage and fragment comes back placed or dropped with its reason.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmrag.compose import Resources, build_packer, build_tiering, load_patient
from ebmrag.config import Settings, load_settings, with_overrides
from ebmrag.evidence.tiering import Tiering
from ebmrag.generate.context import evidence_decision, evidence_key
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import EvidenceItem, PackResult, validate_window
from ebmrag.records.fragment import PatientRecord

PATIENT, EVIDENCE = "patient", "evidence"
RecordSource = PatientRecord | str | Path


@dataclass(frozen=True)
class Passage:
    """One retrieved text as a framework hands it over; `id` must be unique within one call."""

    id: str
    text: str
    authority: str = ""  # guideline | systematic_review -> T3; anything else T4 (generate.context.evidence_tier)


@dataclass(frozen=True)
class Placed:
    """A fragment or passage that made it into the budget, as placed (a patient result may be compressed)."""

    kind: str  # PATIENT | EVIDENCE
    id: str  # the fragment id, or the passage id
    text: str
    tier: str
    state: str  # full | compressed | truncated
    reason: str  # why it was packed (must_keep, critical, optimal, fill, ...)
    tokens: int


@dataclass(frozen=True)
class Left:
    kind: str
    id: str
    tier: str
    reason: str  # why it was dropped (budget, duplicate, prefiltered, ...)
    detail: str


@dataclass(frozen=True)
class Selection:
    """The packed context: patient fragments in record order, then passages in the order given."""

    placed: tuple[Placed, ...]
    dropped: tuple[Left, ...]
    budget: int
    result: PackResult  # the packer's own result (context lines, solver notes) for a full trace

    @property
    def tokens_used(self) -> int:
        return sum(p.tokens for p in self.placed)


def resolve_record(record: RecordSource) -> PatientRecord:
    """A `PatientRecord`, a record file (every format `ebmrag pack` reads) or a bundled demo name ("demo-colon")."""
    return record if isinstance(record, PatientRecord) else load_patient(record)


class EvidencePacker:
    """Pack retrieved passages and one patient's record into `budget` tokens (the drop-ins' shared step).

    The record is tiered (`evidence.tiering.Tiering`) before it is packed, as `ebmrag ask` tiers it before its gate.
    `packer` and `tiering` share the parts a caller already holds (built over the same `compose.Resources`; both or
    neither); without them both are built from `settings` (the TOML file's [packing] and [models]) through the
    composition root, loading the bundled embedding model on first use.
    """

    def __init__(self, budget: int, record: RecordSource | None = None, settings: Settings | None = None,
                 packer: ContextPacker | None = None, strategy: str | None = None,
                 tiering: Tiering | None = None) -> None:
        validate_window(budget)
        if (packer is None) != (tiering is None):
            raise ValueError("a packer passed in comes with the tiering step built over the same resources "
                             "(compose.build_tiering): pass both, or neither")
        self.budget = budget
        self.record = resolve_record(record) if record is not None else None
        self.settings = settings or load_settings(None)
        self._packer, self._tiering = packer, tiering
        self.strategy = strategy
        self._lock = threading.Lock()  # the packer's caches are not thread-safe; frameworks call from threads
        self._building = threading.Lock()

    @property
    def packer(self) -> ContextPacker:
        return self._parts()[1]

    @property
    def tiering(self) -> Tiering:
        return self._parts()[0]

    def _parts(self) -> tuple[Tiering, ContextPacker]:
        """The tiering step and the packer, built together over one `Resources` on first use."""
        with self._building:
            if self._packer is None or self._tiering is None:
                resources = Resources(with_overrides(self.settings, packing={"strategy": self.strategy}))
                self._tiering, self._packer = build_tiering(resources), build_packer(resources)
        return self._tiering, self._packer

    def warm_up(self) -> None:
        self.packer.warm_up()

    def run(self, question: str, passages: Sequence[Passage], record: RecordSource | None = None) -> Selection:
        """`record` overrides the one given at construction for this call (one patient per call, never mixed)."""
        if not question.strip():
            raise ValueError("the question is empty")
        ids = [p.id for p in passages]
        if len(set(ids)) != len(ids):
            raise ValueError(f"passage ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})}")
        patient = resolve_record(record) if record is not None else self.record
        evidence = [EvidenceItem(evidence_key(p.id), p.text, evidence_decision(p.authority or "none"))
                    for p in passages if p.text.strip()]
        with self._lock:
            tiered = self.tiering.run(patient) if patient is not None else None
            result = self.packer.run(tiered, question, self.budget, evidence=evidence)
        return _selection(result, patient, passages, self.budget)

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "strategy": self.strategy, "packer": self.packer.to_dict()}


def _selection(result: PackResult, record: PatientRecord | None, passages: Sequence[Passage],
               budget: int) -> Selection:
    order = {f.id: i for i, f in enumerate(record.fragments if record else ())}
    order.update({evidence_key(p.id): len(order) + i for i, p in enumerate(passages)})
    passage_of = {evidence_key(p.id): p.id for p in passages}

    def kind_and_id(fragment_id: str) -> tuple[str, str]:
        return (EVIDENCE, passage_of[fragment_id]) if fragment_id in passage_of else (PATIENT, fragment_id)

    placed = [Placed(*kind_and_id(p.fragment_id), p.body or p.text, p.tier.value, p.state.value, p.reason.value,
                     p.tokens) for p in sorted(result.packed, key=lambda p: order.get(p.fragment_id, 0))]
    dropped = [Left(*kind_and_id(d.fragment_id), d.tier.value, d.reason.value, d.detail) for d in result.dropped]
    skipped = [Left(EVIDENCE, p.id, "", "empty", "the passage has no text") for p in passages if not p.text.strip()]
    return Selection(tuple(placed), (*dropped, *skipped), budget, result)
