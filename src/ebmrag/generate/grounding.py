"""Grounding check: is every answer sentence supported by the context the model was given?

Support of a sentence = the best, over context sentences, of (cosine of embeddings + share of the
answer sentence's content words found in that context sentence) / 2; it must reach the threshold.
Similarity alone forgives exactly the errors that matter most ("creatinine 4.5" scores 0.83 against
"creatinine 2.8"), so in addition every number and every drug name of the sentence must appear
somewhere in the context. Citation marks like [3] are removed first. Unsupported sentences come back
with their reason, score and nearest context sentence, so the output can flag them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ebmrag.evidence.entities import EntityExtractor, EntityKind
from ebmrag.protocols import Embedder
from ebmrag.text.sentences import split_sentences

_CITATION = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?|[\u4e00-\u9fff]", re.IGNORECASE)
_STOP = frozenset("a an and are as at be by for from has have in is it of on or that the this to was were with "
                  "which who what when where how".split())


def content_words(text: str) -> set[str]:
    return {t.lower() for t in _TOKEN.findall(text)} - _STOP


_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_SPACE = re.compile(r"\s+")


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


@dataclass(frozen=True)
class SentenceSupport:
    sentence: str
    score: float
    supported: bool
    nearest: str
    reason: str = ""


class GroundingChecker:
    """Pipeline step: answer text + context sentences -> support per answer sentence."""

    def __init__(self, embedder: Embedder, threshold: float = 0.6, *, extractor: EntityExtractor) -> None:
        """`embedder` and `extractor`: the composition root's (compose.Resources)."""
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.embedder, self.threshold, self.extractor = embedder, threshold, extractor

    def run(self, answer: str | Sequence[str], context: Sequence[str]) -> list[SentenceSupport]:
        """Support per answer sentence: `answer` is free text (split into sentences here) or the claims
        themselves, when the caller already knows them (the extractive brief's cited sentences)."""
        claims = [s.text for s in split_sentences(answer)] if isinstance(answer, str) else list(answer)
        return self._support(claims, context)

    def _support(self, claims: Sequence[str], context: Sequence[str]) -> list[SentenceSupport]:
        """Support per claim (citation marks removed). A claim that is a whole context sentence, copied,
        is supported without a model call (the extractive brief is all such claims); others are scored."""
        claims = [c for c in (_CITATION.sub("", claim).strip() for claim in claims) if c]
        sources = [s.text for text in context for s in split_sentences(text) if s.text.strip()]
        if not claims:
            return []
        if not sources:
            return [SentenceSupport(claim, 0.0, False, "") for claim in claims]
        whole = {_normal(source) for source in sources}  # whole sentences: a copied fragment could drop a "no"
        verbatim = {claim for claim in claims if _normal(claim) in whole}
        scored = self._score([c for c in claims if c not in verbatim], sources)
        return [SentenceSupport(c, 1.0, True, c, "") if c in verbatim else scored[c] for c in claims]

    def _score(self, claims: Sequence[str], sources: Sequence[str]) -> dict[str, SentenceSupport]:
        if not claims:
            return {}
        vectors = self.embedder.embed([*claims, *sources])
        cosine = np.clip(vectors[: len(claims)] @ vectors[len(claims):].T, 0.0, 1.0)
        source_words = [content_words(s) for s in sources]
        results = {}
        for i, claim in enumerate(claims):
            words = content_words(claim)
            overlap = np.array([len(words & w) / len(words) if words else 1.0 for w in source_words])
            combined = (cosine[i] + overlap) / 2
            best = int(np.argmax(combined))
            score = float(combined[best])
            reason = "no similar context" if score < self.threshold else self._missing_fact(claim, sources)
            results[claim] = SentenceSupport(claim, score, not reason, sources[best], reason)
        return results

    def _missing_fact(self, claim: str, sources: Sequence[str]) -> str:
        """A number or drug of the claim that no context sentence contains ('' when all are there)."""
        context = " ".join(sources).lower()
        numbers = set(_NUMBER.findall(context))
        for number in _NUMBER.findall(claim):
            if number not in numbers:
                return f"number {number} is not in the context"
        for entity in self.extractor.extract(claim):
            if entity.kind is EntityKind.DRUG and entity.text.lower() not in context:
                return f"drug '{entity.text}' is not in the context"
        return ""

    def unsupported(self, answer: str, context: Sequence[str]) -> list[SentenceSupport]:
        return [s for s in self.run(answer, context) if not s.supported]
