"""One interface over every packing strategy, and the `ContextPacker` pipeline step that scores then packs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.evidence.entities import EntityCompressor
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.evidence.questions import QuestionClassifier, default_question_classifier, mark_needed
from ebmrag.models.text_classifier import LinearTextClassifier
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.models.tokens import make_token_counter
from ebmrag.kvcache import KeyValueCache
from ebmrag.packing.baselines import FifoPacker, SemanticPacker, UniformPacker
from ebmrag.packing.dedup import pack_collapsed
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.prefilter import Prefilter
from ebmrag.packing.types import Candidate, DroppedFragment, Packer, PackResult, validate_window
from ebmrag.packing.utility import CandidateBuilder, TierWeights, UtilityParams, fragment_header, score_candidates
from ebmrag.protocols import TokenCounter

DEFAULT_PREFILTER = Prefilter()
STRATEGIES = ("ebm-exact", "ebm-exact-paper", "ebm-greedy", "fifo", "semantic", "uniform")


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


class ContextPacker:
    """Classify -> score -> pack one patient's record for one query (the EBM-Pack pipeline step).

    `embedder` lets the caller share one model instance (the answer engine passes the knowledge
    base's when it is the same model); without it the packer builds its own from `model_path`.
    """

    def __init__(
        self,
        strategy: str = "ebm-exact",
        k_min: int = 1,
        params: UtilityParams | None = None,
        tokenizer: str = "bundled",
        model_path: str | None = None,
        cache_dir: str | None = None,
        rules_path: str | None = None,
        embedder: SentenceEmbedder | None = None,
        tier_model: str | None = "bundled",
        prefilter: Prefilter | None = DEFAULT_PREFILTER,  # None: measure every fragment however large the record
        question_rules: str | None = None,  # rules/questions.toml when None
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.k_min = k_min
        self.prefilter = prefilter
        self.question_rules = question_rules
        self.questions = QuestionClassifier(question_rules) if question_rules else default_question_classifier()
        self.params = params or UtilityParams()
        self.tokenizer = tokenizer
        self.embedder = embedder or SentenceEmbedder(model_path, cache_dir=cache_dir)
        self.tier_model = tier_model or None
        model_file = BUNDLED_TIER_MODEL if tier_model == "bundled" else tier_model
        derived = self.embedder.cache_dir / "derived.sqlite" if self.embedder.cache_dir else None
        self.classifier = TierClassifier(rules_path, LinearTextClassifier(model_file, self.embedder)
                                         if model_file else None,
                                         store=KeyValueCache(derived, "tier_rules") if derived else None)
        self.token_counter = make_token_counter(tokenizer)
        self.packer = make_packer(strategy, self.token_counter, k_min)
        compressor = EntityCompressor(store=KeyValueCache(derived, "compressions") if derived else None)
        self.builder = CandidateBuilder(self.embedder, self.token_counter, self.params, compressor)

    def warm_up(self) -> None:
        self.embedder.warm_up()

    def classify(self, record: PatientRecord) -> PatientRecord:
        """Tiers for the fragments that have none yet; a fragment that already carries a decision keeps it,
        so a caller that classified once (the answer engine's gate) does not pay twice."""
        todo = [f for f in record.fragments if f.decision is None]
        if not todo:
            return record
        decided = dict(zip((f.id for f in todo), self.classifier.classify_many([(f.text, f.section) for f in todo]),
                           strict=True))
        return record.replace_fragments(f.with_decision(decided[f.id]) if f.id in decided else f
                                        for f in record.fragments)

    def prepare(self, record: PatientRecord, texts: Sequence[str] = ()) -> None:
        """Embed the record's fragments, their compressed states and `texts` (e.g. the retrieval queries)
        in one batch into the embedder's cache, so a later `run` spends its time on the question only."""
        fragments = self.classify(record).fragments
        bodies = [f.text for f in fragments]
        compressed = self.builder.compressor.compress_many([f.text for f in fragments if f.tier.compressible])
        bodies += [c.text for c in compressed if c.text]
        self.embedder.embed([*texts, *bodies])

    def candidates(self, record: PatientRecord, query: str, as_of: datetime | None = None,
                   evidence: Sequence[Fragment] = (), evidence_similarity: Mapping[str, float] | None = None,
                   headers: Sequence[str] | None = None) -> list[Candidate]:
        """Scored candidates: the record's fragments (compressible by tier), then `evidence` fragments
        (tiered by the caller, never compressed, Sim from `evidence_similarity` when given). `headers`
        replace the default "[id|tier|date]" line heads, one per fragment in that order."""
        record = self.classify(record)
        patient_ids = {f.id for f in record.fragments}
        measured = self.builder.measure_fragments(
            [*record.fragments, *evidence], query, as_of or record.latest_timestamp, headers,
            compressible=lambda f: f.id in patient_ids and f.tier.compressible,
            known_similarity=evidence_similarity)
        return score_candidates(measured, self.params)

    def run(self, record: PatientRecord, query: str, window: int, as_of: datetime | None = None,
            evidence: Sequence[Fragment] = (), evidence_similarity: Mapping[str, float] | None = None,
            headers: Sequence[str] | None = None) -> PackResult:
        """Pack the record (and any evidence fragments) into `window` tokens; see `candidates`. The sections
        the question cannot be answered without (evidence.questions: the allergy status and kidney results
        for a drug choice) become must-keep; a record far larger than the window is pre-filtered
        (`packing.prefilter`, never a critical fragment), and near-copies are collapsed (`packing.dedup`)."""
        validate_window(window)
        question = self.questions.classify(query)
        record = mark_needed(self.classify(record), question)
        as_of = as_of or record.latest_timestamp
        numbers = tuple((f.id, n) for n, f in enumerate(record.fragments, 1))
        if headers is None:  # numbered in the whole record, so a pre-filtered record keeps its numbers
            headers = [fragment_header(f, n) for n, f in enumerate([*record.fragments, *evidence], 1)]
        prefiltered: list[DroppedFragment] = []
        if self.prefilter is not None:
            kept, prefiltered = self.prefilter.select(record.fragments, query, window, as_of, self.params)
            if prefiltered:
                kept_headers = _kept_headers(record.fragments, kept, headers)
                record, headers = record.replace_fragments(kept), kept_headers
        candidates = self.candidates(record, query, as_of, evidence, evidence_similarity, headers)
        patient_ids = {f.id for f in record.fragments}
        result = pack_collapsed(self.packer, candidates, window, eligible=lambda c: c.fragment.id in patient_ids)
        if prefiltered:
            result = replace(result, dropped=(*result.dropped, *prefiltered))
        return replace(result, record_skipped=record.skipped, question_type=question.id, numbers=numbers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "k_min": self.k_min,
            "params": self.params.to_dict(),
            "tokenizer": self.tokenizer,
            "model_path": self.embedder.to_dict()["model_path"],
            "cache_dir": self.embedder.to_dict()["cache_dir"],
            "rules_path": self.classifier.to_dict()["rules_path"],
            "tier_model": self.tier_model,
            "prefilter": asdict(self.prefilter) if self.prefilter else None,
            "question_rules": self.question_rules,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], embedder: SentenceEmbedder | None = None) -> ContextPacker:
        values = dict(data)
        values["params"] = UtilityParams.from_dict(values.get("params", {}))
        if "prefilter" in values:
            values["prefilter"] = Prefilter(**values["prefilter"]) if values["prefilter"] else None
        return cls(**values, embedder=embedder)


def _kept_headers(fragments: Sequence[Fragment], kept: Sequence[Fragment],
                  headers: Sequence[str] | None) -> list[str] | None:
    """The caller's headers (record fragments first, then evidence) for the fragments still in the record."""
    if headers is None:
        return None
    by_id = dict(zip((f.id for f in fragments), headers, strict=False))
    return [by_id[f.id] for f in kept] + list(headers[len(fragments):])


__all__ = ["STRATEGIES", "ContextPacker", "Packer", "TierWeights", "UtilityParams", "make_packer"]
