"""Clinical utility U_ij = F(j) · W(i) · Sim(query, q_ij) · exp(-λ·Δt_i) (SPEC §2) and candidate building.

Choices the paper leaves open, made here:
- Δt is measured in years, from the fragment's timestamp to `as_of` (default: the record's newest
  timestamp, so a replay of an old record scores the same). With the paper's λ* = 5 an episodic
  finding halves in value every ~50 days.
- Standing facts (tier rule `standing = true`: allergies, pathology, genetics, chronic diagnoses) and
  fragments without a timestamp do not decay: Δt = 0. A ten-year-old anaphylaxis keeps its weight.
- Sim is the cosine of normalized MiniLM embeddings clipped at 0: a fragment that points away from
  the query is worth nothing, not less than nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ebmrag.evidence.entities import EntityCompressor
from ebmrag.evidence.fragment import Fragment, PatientRecord, Tier
from ebmrag.evidence.tokens import TokenCounter
from ebmrag.packing.types import Candidate, PackOption, State, render_line

SECONDS_PER_YEAR = 365.25 * 24 * 3600


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...


@dataclass(frozen=True)
class TierWeights:
    """θ = (α, β, γ, 1) with α ≥ β ≥ γ ≥ 1; default θ* from the paper's grid search."""

    alpha: float = 2.5
    beta: float = 2.5
    gamma: float = 1.0

    def __post_init__(self) -> None:
        if not self.alpha >= self.beta >= self.gamma >= 1.0:
            raise ValueError(
                f"tier weights must satisfy alpha >= beta >= gamma >= 1, got ({self.alpha}, {self.beta}, {self.gamma})"
            )

    def of(self, tier: Tier) -> float:
        return {Tier.T1: self.alpha, Tier.T2: self.beta, Tier.T3: self.gamma, Tier.T4: 1.0}[tier]


@dataclass(frozen=True)
class UtilityParams:
    weights: TierWeights = field(default_factory=TierWeights)
    decay_lambda: float = 5.0  # per year
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        if self.decay_lambda < 0:
            raise ValueError(f"decay_lambda must be >= 0, got {self.decay_lambda}")
        if not 0 <= self.epsilon <= 1:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UtilityParams:
        weights = TierWeights(**data.get("weights", {}))
        return cls(weights, float(data.get("decay_lambda", 5.0)), float(data.get("epsilon", 0.0)))


def age_in_years(fragment: Fragment, as_of: datetime | None) -> float:
    if fragment.timestamp is None or as_of is None or (fragment.decision and fragment.decision.standing):
        return 0.0
    return max(0.0, (as_of - fragment.timestamp).total_seconds() / SECONDS_PER_YEAR)


def fragment_header(fragment: Fragment) -> str:
    date = f"|{fragment.timestamp.date().isoformat()}" if fragment.timestamp else ""
    return f"[{fragment.id}|{fragment.tier.value}{date}]"


class CandidateBuilder:
    """Turns classified fragments into scored candidates: states A (and B for T1/T2), costs, utilities."""

    def __init__(
        self,
        embedder: Embedder,
        token_counter: TokenCounter,
        params: UtilityParams | None = None,
        compressor: EntityCompressor | None = None,
    ) -> None:
        self.embedder = embedder
        self.token_counter = token_counter
        self.params = params or UtilityParams()
        self.compressor = compressor or EntityCompressor()

    def build(self, record: PatientRecord, query: str, as_of: datetime | None = None) -> list[Candidate]:
        if not query.strip():
            raise ValueError("query is empty: utility needs a question to measure similarity against")
        fragments = record.fragments
        as_of = as_of or record.latest_timestamp
        compressions = [self.compressor.compress(f.text) if f.tier.compressible else None for f in fragments]
        bodies_b = [
            c.text if c and c.text and c.text != f.text else None for f, c in zip(fragments, compressions, strict=True)
        ]
        texts = [query, *(f.text for f in fragments), *(b for b in bodies_b if b)]
        vectors = self.embedder.embed(texts)
        sims = np.clip(vectors[1:] @ vectors[0], 0.0, 1.0)
        sim_b = iter(sims[len(fragments) :])
        headers = [fragment_header(f) for f in fragments]
        lines = [render_line(h, f.text) for h, f in zip(headers, fragments, strict=True)]
        lines_b = [render_line(h, b) for h, b in zip(headers, bodies_b, strict=True) if b]
        costs = self.token_counter.count_many(lines + lines_b)
        cost_b = iter(costs[len(fragments) :])
        candidates = []
        for order, fragment in enumerate(fragments):
            base = self.params.weights.of(fragment.tier) * math.exp(
                -self.params.decay_lambda * age_in_years(fragment, as_of)
            )
            options = [PackOption(State.FULL, lines[order], costs[order], base * float(sims[order]))]
            compression, body_b = compressions[order], bodies_b[order]
            if compression and body_b:
                fidelity = min(1.0, compression.fidelity_ratio + self.params.epsilon)
                option_b = PackOption(
                    State.COMPRESSED,
                    render_line(headers[order], body_b),
                    next(cost_b),
                    fidelity * base * float(next(sim_b)),
                    fidelity,
                )
                if option_b.tokens < options[0].tokens:
                    options.append(option_b)
            candidates.append(
                Candidate(
                    fragment,
                    headers[order],
                    tuple(options),
                    float(sims[order]),
                    bool(fragment.decision and fragment.decision.must_keep),
                    order,
                )
            )
        return candidates
