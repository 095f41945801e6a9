"""The offline answer: an evidence brief built only from packed text, grouped by tier, every sentence cited.

No model runs, so nothing may be said that is not in the input: each line of the brief is a sentence
copied from a packed patient fragment or evidence chunk, followed by its citation [n]. Headings name
the groups and carry no claim; the gate's warning, when there is one, comes first. The numbers are
the context's own (`generate.context`), so the brief cites exactly what a model would have seen.
It is short by design: the must-keep facts (the allergy status, age and kidney results a drug question
needs) first, then the sentences the packer rated most relevant, capped per list; the full packed
context stays in the trace.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.generate.context import EVIDENCE, PATIENT, ContextItem
from ebmrag.generate.injection import is_instruction
from ebmrag.llm.prompts import with_warning
from ebmrag.records.fragment import Tier, TierDecision
from ebmrag.text.sentences import split_sentences

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


# "Creatinine: no value recorded." says a test was ordered, not what it showed: context, never a finding.
_EMPTY = re.compile(r"\bno (?:value|conclusion|result|text)s? (?:was )?recorded\b|\bnothing recorded\b", re.IGNORECASE)
KEY_FACTS = "Key facts (must-keep: allergies, decisive results, what the question needs)"


_WORDS = re.compile(r"[a-z0-9]{4,}|[\u4e00-\u9fff]")
PER_ITEM = 3  # a long note contributes its best sentences (beyond the first, only decisive or on-topic ones)


@dataclass(frozen=True)
class _Candidate:
    item: ContextItem
    sentence: str  # cited
    key: bool  # a must-keep fact: the item's only sentence, or a decisive (T1/T2) sentence of it
    decisive: bool
    overlap: float  # share of the question's words the sentence contains

    @property
    def score(self) -> tuple[bool, bool, float, float, int]:
        return self.key, self.decisive, self.overlap, self.item.utility, -self.item.rank


@lru_cache(maxsize=16_384)
def _knowledge_sentence(rules: TierClassifier, text: str) -> tuple[bool, TierDecision | None]:
    """Whether a knowledge-base sentence is a finding to cite (not instruction-like) and its tier decision.
    Knowledge-base sentences recur from ask to ask and are no patient's data, so they are kept in memory; tiering
    them on every ask was most of the offline brief's time."""
    return not is_instruction(text), rules.rule_decision(text, None)


def _sentences(item: ContextItem, asked: set[str], rules: TierClassifier) -> list[_Candidate]:
    """The item's sentences, cited and scored; instruction-like ones are not findings and stay out (see
    injection), nor are sentences that only say nothing was recorded."""
    texts = [t for s in split_sentences(item.body) if (t := s.text.strip()) and not _EMPTY.search(t)]
    if item.kind == EVIDENCE:
        judged = [(t, decision) for t in texts for keep, decision in [_knowledge_sentence(rules, t)] if keep]
    else:
        judged = [(t, rules.rule_decision(t, item.section)) for t in texts if not is_instruction(t)]
    texts = [t for t, _ in judged]
    found = []
    for text, decision in judged:  # a pathology report's every sentence is decisive
        decisive = decision is not None and decision.tier in (Tier.T1, Tier.T2)
        words = set(_WORDS.findall(text.lower()))
        overlap = len(words & asked) / len(asked) if asked else 0.0
        found.append(_Candidate(item, f"{text} [{item.n}]", item.must_keep and (len(texts) == 1 or decisive),
                                decisive, overlap))
    ranked = sorted(found, key=lambda c: c.score, reverse=True)[:PER_ITEM]
    return ranked[:1] + [c for c in ranked[1:] if c.decisive or c.overlap > 0]


def _select(items: Sequence[ContextItem], question: str, limit: int, rules: TierClassifier) -> list[_Candidate]:
    """Key facts first (must-keep items' decisive sentences), then decisive sentences, then the question's
    words, then the packer's utility, up to `limit` sentences and PER_ITEM per context line."""
    asked = set(_WORDS.findall(question.lower()))
    pool = [c for item in items for c in _sentences(item, asked, rules)]
    return sorted(pool, key=lambda c: c.score, reverse=True)[:limit]


def _grouped(chosen: Sequence[_Candidate], headings: dict[Tier, str], claims: list[str],
             key_facts: bool) -> list[str]:
    """Heading and bullet lines (key facts first when asked, then per tier, record order within a group)."""
    groups: list[tuple[str, list[_Candidate]]] = []
    rest = list(chosen)
    if key_facts:
        groups.append((KEY_FACTS, [c for c in rest if c.key]))
        rest = [c for c in rest if not c.key]
    groups += [(headings.get(tier, tier.value), [c for c in rest if c.item.tier is tier]) for tier in Tier]
    lines: list[str] = []
    for heading, members in groups:
        if not members:
            continue
        lines.append(f"{heading}:")
        for candidate in sorted(members, key=lambda c: (c.item.rank, c.item.n)):
            claims.append(candidate.sentence)
            lines.append(f"- {candidate.sentence}")
        lines.append("")
    return lines


def extractive_brief(question: str, items: Sequence[ContextItem], rules: TierClassifier, warning: str = "",
                     patient_sentences: int = 12, evidence_sentences: int = 8) -> Brief:
    """The patient sentences most worth reading for this question (key facts, then by tier), then the
    knowledge base's, each list capped so the brief stays short; every sentence cites its context line.
    `rules`: the tier rules the user configured (a decisive sentence is one they tier T1/T2)."""
    if patient_sentences < 1 or evidence_sentences < 0:
        raise ValueError("the brief needs >= 1 patient sentence and >= 0 evidence sentences")
    claims: list[str] = []
    lines = [f"Evidence brief for: {question}", ""]
    patient = _select([i for i in items if i.kind == PATIENT], question, patient_sentences, rules)
    lines += _grouped(patient, TIER_HEADINGS, claims, key_facts=True)
    evidence = _select([i for i in items if i.kind == EVIDENCE], question, evidence_sentences, rules)
    if evidence:
        lines += ["From the knowledge base:", *_grouped(evidence, EVIDENCE_HEADINGS, claims, key_facts=False)]
    shown = {c.item.n for c in (*patient, *evidence)}
    left = len([i for i in items if i.n not in shown])
    if left:
        lines.append(f"({left} more context line{'s' if left > 1 else ''} in the packed context, not repeated here.)")
    text = with_warning(warning, "\n".join(lines).rstrip() + "\n")
    cited = sorted((i for i in items if i.n in shown), key=lambda i: i.n)
    return Brief(text, tuple(cite(i) for i in cited), tuple(claims))
