"""Free text -> evidence codes of the condition knowledge base ("I've had a fever since Monday" -> fievre).

Each clause of the text is compared with every stand-alone evidence question by two scores: the cosine
of their embeddings (the bundled MiniLM by default; the questions are embedded once) and the share of the
question's content-word stems found in the clause. A clause maps to its best evidence when the blend
clears `threshold`; a second evidence is accepted only when it, too, clears `threshold` + `second_margin`
(one sentence can report two findings). A clause under a negation cue ("no", "denies", "I don't", "never")
maps to an absent finding. A text that is exactly an evidence code maps to that code, so structured and
free findings mix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ebmrag.ddx.knowledge import ConditionKB
from ebmrag.evidence.entities import EntityExtractor
from ebmrag.protocols import Embedder, Vectors
from ebmrag.text.sentences import split_sentences
from ebmrag.vocab.negation import negation

_WORD = re.compile(r"[a-z][a-z'-]+")
_CLAUSE = re.compile(r";|\bbut\b|\bhowever\b", re.IGNORECASE)
_PART = re.compile(r",|\band\b|\bwith\b|\balso\b", re.IGNORECASE)
STOPWORDS = frozenset("""a about after all also am an and any are as at be been before being by can could did do does
doing during either ever for from had has have having how i if in into is it its last me more most my myself no not of
on or other over same so some such than that the their them then there these they this those through to too under
until up very was we were what when where which while who why will with within would you your yours yourself
have been experiencing currently recently feel felt""".split())


@dataclass(frozen=True)
class MappedFinding:
    code: str
    present: bool
    clause: str
    score: float


def _stems(text: str) -> set[str]:
    """Content-word prefixes; a question's parenthetical aside ("(either felt or measured ...)") is left out."""
    text = re.sub(r"\([^)]*\)", " ", text.lower())
    return {w[:6] for w in _WORD.findall(text) if w not in STOPWORDS and len(w) > 2}


def _overlap(clause: set[str], question: set[str]) -> float:
    """Mean of the shares of each side's stems found in the other: a short clause that names the question's
    key word scores as well as a long one that repeats the whole question."""
    if not clause or not question:
        return 0.0
    shared = len(clause & question)
    return 0.5 * (shared / len(clause) + shared / len(question))


class FindingMapper:
    """`run(texts)` -> findings; `warm_up()` embeds the knowledge base's questions (once)."""

    def __init__(self, kb: ConditionKB, embedder: Embedder, threshold: float = 0.6, second_margin: float = 0.1,
                 lexical_weight: float = 0.35, *, extractor: EntityExtractor) -> None:
        """`embedder` and `extractor` (its negation cues mark an absent finding): the composition root's."""
        if not 0 < threshold < 1 or not 0 <= lexical_weight <= 1 or second_margin < 0:
            raise ValueError("threshold must be in (0, 1), lexical_weight in [0, 1], second_margin >= 0")
        self.kb, self.embedder = kb, embedder
        self.threshold, self.second_margin, self.lexical_weight = threshold, second_margin, lexical_weight
        self.codes = [c for c, e in kb.evidences.items() if not e.follow_up]
        self._stems = [_stems(kb.evidences[c].question) for c in self.codes]
        self._vectors: Vectors | None = None
        self._negation = extractor

    def warm_up(self) -> None:
        if self._vectors is None:
            self._vectors = self.embedder.embed([self.kb.evidences[c].question for c in self.codes])

    def run(self, texts: Sequence[str]) -> list[MappedFinding]:
        """Findings in text order; a code found twice keeps its best-scoring clause."""
        self.warm_up()
        assert self._vectors is not None
        direct = [MappedFinding(t.strip(), True, t, 1.0) for t in texts if t.strip() in self.kb.evidences]
        clauses = [c for t in texts if t.strip() not in self.kb.evidences for c in _clauses(t)]
        found = {f.code: f for f in direct}
        if clauses:
            similarity = self.embedder.embed(clauses) @ self._vectors.T
            for clause, row in zip(clauses, similarity, strict=True):
                for finding in self._clause_findings(clause, row):
                    if finding.code not in found or finding.score > found[finding.code].score:
                        found[finding.code] = finding
        return list(found.values())

    def _clause_findings(self, clause: str, cosine: np.ndarray[Any, np.dtype[np.float32]]) -> list[MappedFinding]:
        words = _stems(clause)
        lexical = np.array([_overlap(words, s) for s in self._stems])
        blend = (1 - self.lexical_weight) * cosine + self.lexical_weight * lexical
        order = np.argsort(-blend)[:2]
        present = not self.negated(clause)
        out = []
        for rank, column in enumerate(order):
            bar = self.threshold + (self.second_margin if rank else 0.0)
            if blend[column] >= bar:
                out.append(MappedFinding(self.codes[column], present, clause, float(blend[column])))
        return out

    def negated(self, clause: str) -> bool:
        return bool(negation().patient.search(clause) or self._negation.negation_scopes(clause))

    def to_dict(self) -> dict[str, Any]:
        return {"kb": self.kb.name, "threshold": self.threshold, "second_margin": self.second_margin,
                "lexical_weight": self.lexical_weight}


def _clauses(text: str) -> list[str]:
    """Clauses, and for a clause that lists several things ("a fever and a cough"), each part too; a part
    inherits its clause's negation cue ("no fever or cough" -> both absent) through `_carry_negation`."""
    out = []
    for sentence in split_sentences(text):
        for clause in (c.strip(" ,.") for c in _CLAUSE.split(sentence.text)):
            if len(clause) <= 2:
                continue
            out.append(clause)
            parts = [p.strip(" ,.") for p in _PART.split(clause) if len(p.strip(" ,.")) > 2]
            if len(parts) > 1:
                out += _carry_negation(clause, parts)
    return out


def _carry_negation(clause: str, parts: list[str]) -> list[str]:
    cues = negation()  # a patient's "I don't" anywhere, any cue at the clause's start (rules/negation.toml)
    negated = cues.patient.search(clause) or cues.leading.match(clause)
    if not negated:
        return parts
    cue = negated.group(0).strip()
    return [p if cue.lower() in p.lower() else f"{cue} {p}" for p in parts]
