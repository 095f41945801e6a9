"""The answer context: patient fragments and evidence chunks packed together, numbered for citation.

Every line a model or the extractive brief sees starts with its citation number, "[n|tier|...]".
Patient fragments take 1..p in record order, evidence chunks p+1.. in assembler order; the numbers
are fixed before packing, so a dropped item leaves a gap rather than renumbering what the packer
measured (a renumbered line would no longer cost what was counted).

Evidence chunks get a tier from the authority of their document: a guideline or systematic review
is T3, anything else T4, so graded evidence ranks above unsourced text, while the patient's own
objective results (T1/T2) always outweigh outside knowledge. With guidelines at T2 (tried first)
they filled the T2 quota and the exact packer dropped the demo patient's creatinine of 2.8 mg/dL
for a pneumonia guideline: the record's facts are what no textbook can replace. Evidence chunks
never decay with the patient's timeline and never take the entity-compressed state, which would
reduce a recommendation to a list of drug names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ebmrag.generate.assembler import SelectedChunk, edges_first
from ebmrag.packing.types import EvidenceItem, PackResult
from ebmrag.packing.utility import fragment_header
from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision
from ebmrag.rules import rule_file

PATIENT, EVIDENCE = "patient", "evidence"


@rule_file("evidence/hierarchy.toml")
def _authority_tiers(raw: Mapping[str, Any]) -> dict[str, Tier]:
    return {kind: Tier[str(level["tier"])] for kind, level in raw.items()}


def evidence_tier(authority: str) -> Tier:
    """The tier of a document of this kind of source (rules/evidence/hierarchy.toml; an unlisted kind is "other")."""
    tiers = _authority_tiers()
    return tiers.get(authority, tiers["other"])


def evidence_decision(authority: str) -> TierDecision:
    """Outside evidence is tiered by its authority and never decays with the patient's timeline."""
    return TierDecision(evidence_tier(authority), f"authority:{authority}", standing=True)


@dataclass(frozen=True)
class ContextItem:
    """One numbered line of the answer context; `id` is a fragment id or a chunk id."""

    n: int
    kind: str  # PATIENT | EVIDENCE
    id: str
    tier: Tier
    header: str
    body: str  # the text as placed: full, or the entity-compressed state of a patient fragment
    rank: int  # record order for patient fragments, assembler rank for evidence
    source: str = ""  # document id of an evidence chunk
    utility: float = 0.0  # the packer's utility of the placed state (tier weight · similarity · decay)
    must_keep: bool = False  # packed as must-keep (a decisive fact, or one the question needs)
    section: str | None = None  # the patient fragment's section (the tier rules read it)

    @property
    def line(self) -> str:
        return f"{self.header} {self.body}"


@dataclass(frozen=True)
class Numbering:
    """Citation numbers and line headers fixed before packing, keyed by packer fragment id."""

    patient: tuple[Fragment, ...]
    evidence: tuple[EvidenceItem, ...]
    chunks: tuple[SelectedChunk, ...]

    @property
    def ids(self) -> list[str]:
        """Packer ids in number order: the record's fragments, then the evidence items."""
        return [*(f.id for f in self.patient), *(e.id for e in self.evidence)]

    @cached_property
    def headers(self) -> list[str]:
        lines = [fragment_header(fragment, n) for n, fragment in enumerate(self.patient, 1)]
        first = len(self.patient) + 1
        return lines + [f"[{n}|{chunk.hit.authority}]" for n, chunk in enumerate(self.chunks, first)]


def evidence_key(chunk_id: str) -> str:
    """Packer ids of evidence chunks are prefixed, so a chunk id can never collide with a fragment id."""
    return f"kb:{chunk_id}"


def number_context(record: PatientRecord, chunks: Sequence[SelectedChunk]) -> Numbering:
    """`record` must be classified (tiers set); chunks come in the assembler's order."""
    evidence = tuple(
        EvidenceItem(evidence_key(c.hit.chunk_id), c.text, evidence_decision(c.hit.authority), c.hit.section or None,
                     c.hit.doc_id)
        for c in chunks
    )
    return Numbering(record.fragments, evidence, tuple(chunks))


def context_items(numbering: Numbering, result: PackResult) -> list[ContextItem]:
    """The packed lines as citable items, patient first (record order) then evidence (rank order)."""
    headers = numbering.headers
    position = {fid: i for i, fid in enumerate(numbering.ids)}
    items = []
    for packed in result.packed:
        i = position[packed.fragment_id]
        header, body = headers[i], packed.body
        pinned = packed.must_keep
        if i < len(numbering.patient):
            items.append(ContextItem(i + 1, PATIENT, packed.fragment_id, packed.tier, header, body, i, "",
                                     packed.utility, pinned, numbering.patient[i].section))
        else:
            chunk = numbering.chunks[i - len(numbering.patient)]
            items.append(ContextItem(i + 1, EVIDENCE, chunk.hit.chunk_id, packed.tier, header, body,
                                     i - len(numbering.patient), chunk.hit.doc_id, packed.utility, pinned))
    return sorted(items, key=lambda item: item.n)


PATIENT_HEADING = "Patient record:"
EVIDENCE_HEADING = "Evidence from the knowledge base:"


def render_context(items: Sequence[ContextItem], ordering: str = "relevance_first") -> str:
    """Patient lines in record order, then evidence lines in relevance or edges-first order."""
    patient = [i.line for i in items if i.kind == PATIENT]
    evidence = sorted((i for i in items if i.kind == EVIDENCE), key=lambda i: i.rank)
    if ordering == "edges_first":
        evidence = edges_first(evidence)
    blocks = []
    if patient:
        blocks.append("\n".join([PATIENT_HEADING, *patient]))
    if evidence:
        blocks.append("\n".join([EVIDENCE_HEADING, *(i.line for i in evidence)]))
    return "\n\n".join(blocks)
