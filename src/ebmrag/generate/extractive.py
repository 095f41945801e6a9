"""The offline answer: an evidence brief built only from packed text, grouped by tier, every sentence cited.

No model runs, so nothing may be said that is not in the input: each line of the brief is a sentence
copied from a packed patient fragment or a selected evidence chunk, followed by its citation [n].
Headings name the groups and carry no claim; the gate's warning, when there is one, comes first.
Citations number the evidence chunks first (as the assembler numbered them) and then the patient
fragments, and each maps to a chunk id or a fragment id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.evidence.fragment import Tier
from ebmrag.evidence.sentences import split_sentences
from ebmrag.generate.assembler import SelectedChunk
from ebmrag.packing.types import PackedFragment

TIER_HEADINGS = {Tier.T1: "Decisive findings (pathology, genetics, high-risk allergies)",
                 Tier.T2: "Objective results (laboratory, imaging)", Tier.T3: "Examination",
                 Tier.T4: "History and complaints"}


@dataclass(frozen=True)
class Citation:
    n: int
    kind: str  # "evidence" | "patient"
    id: str

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "kind": self.kind, "id": self.id}


@dataclass(frozen=True)
class Brief:
    text: str
    citations: tuple[Citation, ...]


def _body(packed: PackedFragment) -> str:
    """The fragment's text without the "[id|tier|date]" header the packer rendered in front of it."""
    header_end = packed.text.find("] ")
    return packed.text[header_end + 2 :] if packed.text.startswith("[") and header_end > 0 else packed.text


def _cited_sentences(text: str, n: int) -> list[str]:
    return [f"- {s.text.strip()} [{n}]" for s in split_sentences(text) if s.text.strip()]


def extractive_brief(question: str, packed: Sequence[PackedFragment], chunks: Sequence[SelectedChunk],
                     warning: str = "") -> Brief:
    """Patient evidence by tier (T1 first, record order within a tier), then knowledge-base evidence."""
    citations = [Citation(c.number, "evidence", c.hit.chunk_id) for c in chunks]
    next_n = max((c.number for c in chunks), default=0) + 1
    lines = [f"Warning: {warning}", ""] if warning else []
    lines += [f"Evidence brief for: {question}", ""]
    for tier in Tier:
        members = sorted((p for p in packed if p.tier is tier), key=lambda p: p.order)
        if not members:
            continue
        lines.append(f"{TIER_HEADINGS[tier]}:")
        for fragment in members:
            citations.append(Citation(next_n, "patient", fragment.fragment_id))
            lines += _cited_sentences(_body(fragment), next_n)
            next_n += 1
        lines.append("")
    if chunks:
        lines.append("From the knowledge base:")
        for chunk in sorted(chunks, key=lambda c: c.number):
            lines += _cited_sentences(chunk.text, chunk.number)
    return Brief("\n".join(lines).rstrip() + "\n", tuple(citations))
