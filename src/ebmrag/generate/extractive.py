"""The offline answer: an evidence brief built only from packed text, grouped by tier, every sentence cited.

No model runs, so nothing may be said that is not in the input: each line of the brief is a sentence
copied from a packed patient fragment or evidence chunk, followed by its citation [n]. Headings name
the groups and carry no claim; the gate's warning, when there is one, comes first. The numbers are
the context's own (`generate.context`), so the brief cites exactly what a model would have seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.evidence.fragment import Tier
from ebmrag.evidence.sentences import split_sentences
from ebmrag.generate.context import EVIDENCE, PATIENT, ContextItem
from ebmrag.generate.injection import is_instruction
from ebmrag.generate.prompts import with_warning

TIER_HEADINGS = {Tier.T1: "Decisive findings (pathology, genetics, high-risk allergies)",
                 Tier.T2: "Objective results (laboratory, imaging)", Tier.T3: "Examination",
                 Tier.T4: "History and complaints"}
EVIDENCE_HEADINGS = {Tier.T3: "Guidelines and systematic reviews", Tier.T4: "Trials, textbooks and other sources"}


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
    claims: tuple[str, ...] = ()  # the cited sentences, as the grounding check reads them (no headings)


def cite(item: ContextItem) -> Citation:
    return Citation(item.n, item.kind, item.id)


def _cited_sentences(item: ContextItem) -> list[str]:
    """The item's sentences, cited; instruction-like ones are not findings and stay out (see injection)."""
    return [f"{s.text.strip()} [{item.n}]" for s in split_sentences(item.body)
            if s.text.strip() and not is_instruction(s.text)]


def _grouped(items: Sequence[ContextItem], headings: dict[Tier, str], claims: list[str]) -> list[str]:
    """Heading and bullet lines per tier; the bullets' sentences are also appended to `claims`."""
    lines: list[str] = []
    for tier in Tier:
        members = sorted((i for i in items if i.tier is tier), key=lambda i: i.rank)
        if not members:
            continue
        lines.append(f"{headings.get(tier, tier.value)}:")
        for item in members:
            sentences = _cited_sentences(item)
            claims += sentences
            lines += [f"- {s}" for s in sentences]
        lines.append("")
    return lines


def extractive_brief(question: str, items: Sequence[ContextItem], warning: str = "") -> Brief:
    """Patient evidence by tier (T1 first, record order within a tier), then knowledge-base evidence by tier."""
    claims: list[str] = []
    lines = [f"Evidence brief for: {question}", ""]
    lines += _grouped([i for i in items if i.kind == PATIENT], TIER_HEADINGS, claims)
    evidence = [i for i in items if i.kind == EVIDENCE]
    if evidence:
        lines += ["From the knowledge base:", *_grouped(evidence, EVIDENCE_HEADINGS, claims)]
    text = with_warning(warning, "\n".join(lines).rstrip() + "\n")
    return Brief(text, tuple(cite(i) for i in sorted(items, key=lambda i: i.n)), tuple(claims))
