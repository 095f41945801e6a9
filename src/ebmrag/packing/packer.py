"""One interface over every packing strategy, and the `ContextPacker` pipeline step that scores then packs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from ebmrag.evidence.embeddings import SentenceEmbedder
from ebmrag.evidence.fragment import Fragment, PatientRecord
from ebmrag.evidence.text_classifier import LinearTextClassifier
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.evidence.tokens import make_token_counter
from ebmrag.packing.baselines import FifoPacker, SemanticPacker, UniformPacker
from ebmrag.packing.dedup import pack_collapsed
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.types import Candidate, Packer, PackResult
from ebmrag.packing.utility import CandidateBuilder, TierWeights, UtilityParams, score_candidates
from ebmrag.protocols import TokenCounter

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
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.k_min = k_min
        self.params = params or UtilityParams()
        self.tokenizer = tokenizer
        self.embedder = embedder or SentenceEmbedder(model_path, cache_dir=cache_dir)
        self.tier_model = tier_model or None
        model_file = BUNDLED_TIER_MODEL if tier_model == "bundled" else tier_model
        self.classifier = TierClassifier(rules_path, LinearTextClassifier(model_file, self.embedder)
                                         if model_file else None)
        self.token_counter = make_token_counter(tokenizer)
        self.packer = make_packer(strategy, self.token_counter, k_min)
        self.builder = CandidateBuilder(self.embedder, self.token_counter, self.params)

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
        compressor = self.builder.compressor
        bodies = [f.text for f in fragments]
        bodies += [c.text for f in fragments if f.tier.compressible and (c := compressor.compress(f.text))]
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
        """Pack the record (and any evidence fragments) into `window` tokens; see `candidates`. Near-copies
        among the record's fragments are collapsed first (`packing.dedup`)."""
        candidates = self.candidates(record, query, as_of, evidence, evidence_similarity, headers)
        patient_ids = {f.id for f in record.fragments}
        result = pack_collapsed(self.packer, candidates, window, eligible=lambda c: c.fragment.id in patient_ids)
        return replace(result, record_skipped=record.skipped) if record.skipped else result

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
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], embedder: SentenceEmbedder | None = None) -> ContextPacker:
        values = dict(data)
        values["params"] = UtilityParams.from_dict(values.get("params", {}))
        return cls(**values, embedder=embedder)


__all__ = ["STRATEGIES", "ContextPacker", "Packer", "TierWeights", "UtilityParams", "make_packer"]
