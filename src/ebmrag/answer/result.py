"""What `ask` returns: the decision, the answer with its citations and flags, and the whole trace.

`to_json` is the fixed shape of `ebmrag ask --json`:
{"decision": {completeness, action, warning}, "answer", "citations": [{n, kind, id}],
 "unsupported": [{sentence, score, reason, nearest}], "trace": {...}}; every citation id is a fragment id
or chunk id that appears in the trace's "packed" list.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ebmrag.answer.gate import GateDecision
from ebmrag.answer.relevance import RelevanceVerdict
from ebmrag.generate.assembler import AssembledContext
from ebmrag.generate.budget import PromptBudget
from ebmrag.generate.context import EVIDENCE, PATIENT, ContextItem, Numbering, evidence_key
from ebmrag.generate.extractive import Citation
from ebmrag.generate.grounding import SentenceSupport
from ebmrag.generate.injection import FlaggedSentence
from ebmrag.generate.staged import StageTrace
from ebmrag.packing.types import PackResult
from ebmrag.retrieve.vote import DocumentHit


@dataclass(frozen=True)
class RetrievalTrace:
    performed: bool
    reason: str
    queries: tuple[str, ...] = ()
    documents: tuple[DocumentHit, ...] = ()
    verdicts: tuple[RelevanceVerdict, ...] = ()

    @property
    def kept(self) -> list[DocumentHit]:
        """The voted documents the relevance filter kept (all of them without a filter)."""
        rejected = {v.doc_id for v in self.verdicts if not v.keep}
        return [d for d in self.documents if d.doc_id not in rejected]

    def to_json(self) -> list[dict[str, Any]]:
        verdict = {v.doc_id: v.to_json() for v in self.verdicts}
        return [{"doc_id": d.doc_id, "votes": d.votes, "score": round(d.score, 6),
                 "chunk_ids": [c.chunk_id for c in d.chunks], **({"relevance": verdict[d.doc_id]}
                                                                 if d.doc_id in verdict else {})}
                for d in self.documents]


@dataclass(frozen=True)
class AskResult:
    question: str
    patient_id: str
    language: str
    backend: str
    decision: GateDecision
    answer: str
    citations: tuple[Citation, ...]
    unsupported: tuple[SentenceSupport, ...]
    budget: PromptBudget
    retrieval: RetrievalTrace
    assembled: AssembledContext | None
    numbering: Numbering
    pack: PackResult
    items: tuple[ContextItem, ...]
    context: str
    stages: tuple[StageTrace, ...] = ()
    fault: str = ""
    timings_ms: dict[str, float] = field(default_factory=dict)
    flagged: tuple[FlaggedSentence, ...] = ()  # instruction-like sentences in the context, never findings
    redacted: dict[str, int] = field(default_factory=dict)  # identifier kinds kept from the model, and how many
    claims: tuple[str, ...] = ()  # the answer's sentences the grounding check read (no warning, no headings)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision.to_json(),
            "answer": self.answer,
            "citations": [c.to_json() for c in self.citations],
            "unsupported": [{"sentence": s.sentence, "score": round(s.score, 4), "reason": s.reason or
                             "no context sentence supports it", "nearest": s.nearest} for s in self.unsupported],
            "trace": self.trace_json(),
        }

    def trace_json(self) -> dict[str, Any]:
        labels = Counter(s.label.value for s in self.decision.sentences)
        return {
            "patient_id": self.patient_id, "question": self.question, "language": self.language,
            "backend": self.backend, "fault": self.fault,
            "gate": {**self.decision.to_json(), "labels": {k: labels.get(k, 0) for k in "ABC"},
                     "sentences": [{"fragment_id": s.fragment_id, "label": s.label.value, "reason": s.reason,
                                    "text": s.text} for s in self.decision.sentences]},
            "budget": self.budget.to_json(),
            "retrieval": {"performed": self.retrieval.performed, "reason": self.retrieval.reason,
                          "queries": list(self.retrieval.queries)},
            "retrieved": self.retrieval.to_json(),
            "assembly": self._assembly_json(),
            **self._pack_json(),
            "context": self.context,
            "flagged": [f.to_json() for f in self.flagged],
            "redacted": self.redacted,
            "stages": [s.to_json() for s in self.stages],
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }

    def _assembly_json(self) -> dict[str, Any]:
        if self.assembled is None:
            return {}
        return {**self.assembled.to_json()["metadata"],
                "skipped": [{"chunk_id": c, "reason": r} for c, r in self.assembled.skipped]}

    def _pack_json(self) -> dict[str, Any]:
        """The pack trace with citation numbers and real ids (evidence chunks carry a packer-side prefix)."""
        number = {fid: n for n, fid in enumerate(self.numbering.ids, 1)}
        chunk_of = {evidence_key(c.hit.chunk_id): c.hit.chunk_id for c in self.numbering.chunks}

        def named(entry: dict[str, Any]) -> dict[str, Any]:
            key = entry.pop("fragment_id")
            kind = EVIDENCE if key in chunk_of else PATIENT
            entry.pop("n", None)  # the answer's own numbering (patient lines, then evidence) is the one cited
            return {"n": number[key], "kind": kind, "id": chunk_of.get(key, key), **entry}

        pack = self.pack.to_json()
        certificate = pack["certificate"]  # the same object as `pack --json`'s, its fragment under its real id
        if certificate["first_critical_left_out"]:
            lost = certificate["first_critical_left_out"]
            certificate["first_critical_left_out"] = {**lost, "fragment_id": chunk_of.get(lost["fragment_id"],
                                                                                          lost["fragment_id"])}
        return {"strategy": pack["strategy"], "context_budget": pack["window"], "tokens_used": pack["tokens_used"],
                "packed": [named(p) for p in pack["packed"]], "dropped": [named(d) for d in pack["dropped"]],
                "record_skipped": list(self.pack.record_skipped), "certificate": certificate}
