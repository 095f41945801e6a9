"""One interface over every packing strategy, and the `ContextPacker` pipeline step that scores then packs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.evidence.entities import EntityCompressor
from ebmrag.evidence.questions import QuestionClassifier, QuestionType, mark_needed
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.observe.instruments import traced
from ebmrag.packing.baselines import FifoPacker, SemanticPacker, UniformPacker
from ebmrag.packing.dedup import pack_collapsed
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.params import STRATEGIES, PackingParams
from ebmrag.packing.types import Candidate, DroppedFragment, EvidenceItem, Packer, PackResult, validate_window
from ebmrag.packing.utility import CandidateBuilder, TierWeights, UtilityParams, fragment_header, score_candidates
from ebmrag.protocols import TokenCounter, checkpoint
from ebmrag.records.dates import DEFAULT_FUTURE_SKEW, Today
from ebmrag.records.fragment import Fragment, PatientRecord

ANCHOR = datetime(2000, 1, 1, tzinfo=UTC)  # "now" of a pack without dated fragments: only differences count
NO_PATIENT = "no-patient"  # the empty record of an evidence-only pack (a framework's passages, an agent's memory)


def make_packer(strategy: str, token_counter: TokenCounter | None = None, k_min: int = 1) -> Packer:
    if strategy == "ebm-exact":
        return ExactPacker(k_min=k_min)
    if strategy == "ebm-exact-paper":  # the paper's objective: quotas, then utility
        return ExactPacker(k_min=k_min, objective="paper")
    if strategy == "ebm-greedy":
        return GreedyPacker(k_min=k_min)
    if strategy == "fifo":
        return FifoPacker()
    if strategy == "semantic":
        return SemanticPacker()
    if strategy == "uniform":
        if token_counter is None:
            raise ValueError("the uniform strategy needs a token counter to re-measure truncated text")
        return UniformPacker(token_counter)
    raise ValueError(f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def _counts(result: PackResult) -> dict[str, str | int]:
    """What the pack's span says (observe.tracing): the strategy, the window, how much was placed and dropped."""
    return {"ebmrag.pack.strategy": result.strategy, "ebmrag.pack.window": result.window,
            "ebmrag.pack.packed": len(result.packed), "ebmrag.pack.dropped": len(result.dropped)}


class ContextPacker:
    """Score -> pack one patient's tiered record and any evidence items for one query (the EBM-Pack step).

    It packs what it is given: tiering is the step before it (`evidence.tiering.Tiering`), and a record fragment
    or evidence item without a tier decision is refused with a `RecordError` naming it, never tiered here (a
    packer that tiered on the side would hide a second tiering of the flow, with rules the caller never chose).
    It receives the models it uses (the composition root builds them once and hands the same instances to
    every component that shares them) and its `[packing]` settings. `future_skew` ([chart] future_skew_hours):
    at each pack, a fragment dated more than this past the present is flagged `date_in_future` (records.dates),
    whether or not its reader flagged it, so no source of fragments can put a mistyped year at the top.
    """

    def __init__(self, params: PackingParams | None = None, *, embedder: SentenceEmbedder,
                 token_counter: TokenCounter, questions: QuestionClassifier, compressor: EntityCompressor,
                 future_skew: timedelta = DEFAULT_FUTURE_SKEW) -> None:
        self.settings = params or PackingParams()
        self.future_skew = future_skew
        self.embedder, self.token_counter = embedder, token_counter
        self.questions, self.compressor = questions, compressor
        self.params = self.settings.utility
        self.prefilter = self.settings.prefilter
        self.packer = make_packer(self.settings.solver, token_counter, self.settings.k_min)
        self.builder = CandidateBuilder(embedder, token_counter, self.params, compressor=compressor)

    @property
    def strategy(self) -> str:
        return self.settings.solver

    def with_params(self, params: PackingParams) -> ContextPacker:
        """The same models under other settings (another strategy for one request, say)."""
        return ContextPacker(params, embedder=self.embedder, token_counter=self.token_counter,
                             questions=self.questions, compressor=self.compressor, future_skew=self.future_skew)

    def warm_up(self) -> None:
        self.embedder.warm_up()

    def measures_all(self, record: PatientRecord) -> bool:
        """Whether a pack of `record` may measure (embed) every fragment: not when the record is large enough for
        the pre-filter, which measures a few windows' worth of its fragments whatever its size."""
        return self.prefilter is None or len(record.fragments) <= self.prefilter.min_fragments

    def prepare(self, record: PatientRecord, texts: Sequence[str] = ()) -> None:
        """Embed the tiered record's fragments, their compressed states and `texts` (e.g. the retrieval queries)
        in one batch into the embedder's cache, so a later `run` spends its time on the question only."""
        fragments = tiered(record).fragments
        bodies = [f.text for f in fragments]
        compressed = self.compressor.compress_many([f.text for f in fragments if f.tier.compressible])
        bodies += [c.text for c in compressed if c.text]
        self.embedder.embed([*texts, *bodies])

    def dated(self, record: PatientRecord, today: Today | None = None) -> PatientRecord:
        """The record with every fragment dated after the present (`today`, default: the wall clock now, with
        `future_skew`) flagged `date_in_future`: it then sets no `as_of`, decays not and is never current."""
        return record.flagged_at(today or Today.wall_clock(self.future_skew))

    def candidates(self, record: PatientRecord, query: str, as_of: datetime | None = None,
                   evidence: Sequence[EvidenceItem] = (), evidence_similarity: Mapping[str, float] | None = None,
                   headers: Sequence[str] | None = None, *, today: Today | None = None) -> list[Candidate]:
        """Scored candidates: the tiered record's fragments (compressible by tier), then the evidence items (tiered
        by the caller, compressible only when the item says so, Sim from `evidence_similarity` when given).
        `headers` replace the default "[id|tier|date]" line heads, one per fragment in that order.
        `today`: the present dates are read against (see `dated`)."""
        record = self.dated(tiered(record), today)
        as_of = as_of or record.latest_timestamp or ANCHOR
        items = self._evidence_fragments(evidence, record.patient_id, as_of)
        return self._scored(record, query, as_of, evidence, items, evidence_similarity, headers)

    def _scored(self, record: PatientRecord, query: str, as_of: datetime, evidence: Sequence[EvidenceItem],
                items: Sequence[Fragment], evidence_similarity: Mapping[str, float] | None,
                headers: Sequence[str] | None) -> list[Candidate]:
        """`items`: the evidence as measured fragments (`_evidence_fragments`), built once per pack."""
        compressible = {f.id for f in record.fragments} | {e.id for e in evidence if e.compressible}
        measured = self.builder.measure_fragments(
            [*record.fragments, *items], query, as_of, headers,
            compressible=lambda f: f.id in compressible and f.tier.compressible,
            known_similarity=evidence_similarity)
        return score_candidates(measured, self.params)

    @traced("pack", _counts)
    def run(self, record: PatientRecord | None, query: str, window: int | None = None, as_of: datetime | None = None,
            evidence: Sequence[EvidenceItem] = (), evidence_similarity: Mapping[str, float] | None = None,
            headers: Sequence[str] | None = None, question_type: QuestionType | None = None, *,
            today: Today | None = None) -> PackResult:
        """Pack the tiered record (None: evidence only) and the tiered evidence items into `window` tokens
        (default: [packing] window); see `candidates`. The sections the question cannot be answered without
        (evidence.questions: the allergy status and kidney results for a drug choice) become must-keep; a record
        far larger than the window is pre-filtered (`packing.prefilter`, never a critical fragment), and near-copies
        are collapsed (`packing.dedup`). A caller that has typed the question passes `question_type`. Fragments
        dated after `today` (default: the wall clock now) are flagged first (`dated`)."""
        window = self.settings.window if window is None else window
        validate_window(window)
        question = question_type or self.questions.classify(query)
        record = mark_needed(self.dated(tiered(record or PatientRecord(NO_PATIENT, ())), today), question)
        as_of = as_of or record.latest_timestamp or ANCHOR
        numbers = tuple((f.id, n) for n, f in enumerate(record.fragments, 1))
        items = self._evidence_fragments(evidence, record.patient_id, as_of)  # built once, measured below
        if headers is None:  # numbered in the whole record, so a pre-filtered record keeps its numbers
            headers = [fragment_header(f, n) for n, f in enumerate([*record.fragments, *items], 1)]
        prefiltered: list[DroppedFragment] = []
        checkpoint()  # between the steps of a large record's pack: the host may pause or stop the work here
        if self.prefilter is not None:
            kept, prefiltered = self.prefilter.select(record.fragments, query, window, as_of, self.params)
            if prefiltered:
                kept_headers = _kept_headers(record.fragments, kept, headers)
                record, headers = record.replace_fragments(kept), kept_headers
        checkpoint()
        candidates = self._scored(record, query, as_of, evidence, items, evidence_similarity, headers)
        checkpoint()
        collapsible = {f.id for f in record.fragments} | {e.id for e in evidence if e.compressible}
        result = pack_collapsed(self.packer, candidates, window, eligible=lambda c: c.fragment.id in collapsible)
        if prefiltered:
            result = replace(result, dropped=(*result.dropped, *prefiltered))
        return replace(result, record_skipped=record.skipped, record_coverage=record.coverage,
                       question_type=question.id, numbers=numbers)

    def _evidence_fragments(self, evidence: Sequence[EvidenceItem], patient_id: str,
                            as_of: datetime) -> list[Fragment]:
        """Evidence items measured like fragments: undated unless they carry an age (then dated that long
        before `as_of`, so they decay like the record), each with the decision its caller gave it."""
        ids = [e.id for e in evidence]
        if len(set(ids)) != len(ids):
            raise ValueError(f"evidence ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})}")
        untiered = [e.id for e in evidence if e.decision is None]
        if untiered:
            raise ValueError(f"evidence items without a tier decision: {_some(untiered)}; give each its decision "
                             "(evidence.tiering.Tiering.decide, or a grade such as generate.context.evidence_decision)")
        return [Fragment(e.id, patient_id, e.text, e.section, None if e.age is None else as_of - e.age, e.source,
                         e.decision) for e in evidence]

    def to_dict(self) -> dict[str, Any]:
        """The [packing] settings; the models are the composition root's (`compose.Resources`)."""
        return asdict(self.settings)


def tiered(record: PatientRecord) -> PatientRecord:
    """`record`, when every fragment has its tier decision; else a `RecordError` naming the fragments without one
    (the caller skipped the tiering step: evidence.tiering.Tiering.run)."""
    untiered = [f.id for f in record.fragments if f.decision is None]
    if untiered:
        raise RecordError(record.origin, f"{len(untiered)} of {len(record.fragments)} fragments have no tier "
                                         f"decision ({_some(untiered)}); the packer packs a tiered record: run "
                                         "evidence.tiering.Tiering on it first")
    return record


def _some(ids: Sequence[str], shown: int = 3) -> str:
    return ", ".join(repr(i) for i in ids[:shown]) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _kept_headers(fragments: Sequence[Fragment], kept: Sequence[Fragment],
                  headers: Sequence[str] | None) -> list[str] | None:
    """The caller's headers (record fragments first, then evidence) for the fragments still in the record."""
    if headers is None:
        return None
    by_id = dict(zip((f.id for f in fragments), headers, strict=False))
    return [by_id[f.id] for f in kept] + list(headers[len(fragments):])


__all__ = ["STRATEGIES", "ContextPacker", "EvidenceItem", "Packer", "PackingParams", "TierWeights", "UtilityParams",
           "make_packer"]
