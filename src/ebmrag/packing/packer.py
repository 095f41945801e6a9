"""One interface over every packing strategy, and the `ContextPacker` pipeline step that scores then packs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from ebmrag.evidence.embeddings import SentenceEmbedder
from ebmrag.evidence.fragment import PatientRecord
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.evidence.tokens import TokenCounter, make_token_counter
from ebmrag.packing.baselines import FifoPacker, SemanticPacker, UniformPacker
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.types import Candidate, PackResult
from ebmrag.packing.utility import CandidateBuilder, TierWeights, UtilityParams

STRATEGIES = ("ebm-exact", "ebm-greedy", "fifo", "semantic", "uniform")


class Packer(Protocol):
    name: str

    def pack(self, candidates: Sequence[Candidate], window: int) -> PackResult: ...


def make_packer(strategy: str, token_counter: TokenCounter | None = None, k_min: int = 1) -> Packer:
    if strategy == "ebm-exact":
        return ExactPacker(k_min=k_min)
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
    """Classify -> score -> pack one patient's record for one query (the EBM-Pack pipeline step)."""

    def __init__(
        self,
        strategy: str = "ebm-exact",
        k_min: int = 1,
        params: UtilityParams | None = None,
        tokenizer: str = "bundled",
        model_path: str | None = None,
        cache_dir: str | None = None,
        rules_path: str | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown packing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.k_min = k_min
        self.params = params or UtilityParams()
        self.tokenizer = tokenizer
        self.classifier = TierClassifier(rules_path)
        self.embedder = SentenceEmbedder(model_path, cache_dir=cache_dir)
        self.token_counter = make_token_counter(tokenizer)
        self.packer = make_packer(strategy, self.token_counter, k_min)
        self.builder = CandidateBuilder(self.embedder, self.token_counter, self.params)

    def warm_up(self) -> None:
        self.embedder.warm_up()

    def candidates(self, record: PatientRecord, query: str, as_of: datetime | None = None) -> list[Candidate]:
        return self.builder.build(self.classifier.run(record), query, as_of)

    def run(self, record: PatientRecord, query: str, window: int, as_of: datetime | None = None) -> PackResult:
        return self.packer.pack(self.candidates(record, query, as_of), window)

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "k_min": self.k_min,
            "params": self.params.to_dict(),
            "tokenizer": self.tokenizer,
            "model_path": self.embedder.to_dict()["model_path"],
            "cache_dir": self.embedder.to_dict()["cache_dir"],
            "rules_path": self.classifier.to_dict()["rules_path"],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextPacker:
        values = dict(data)
        values["params"] = UtilityParams.from_dict(values.get("params", {}))
        return cls(**values)


__all__ = ["STRATEGIES", "ContextPacker", "Packer", "TierWeights", "UtilityParams", "make_packer"]
