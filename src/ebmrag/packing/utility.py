"""Clinical utility U_ij = F(j) · W(i) · Sim(query, q_ij) · exp(-λ·Δt_i) (the EBM-Pack paper's) and candidate building.

Choices the paper leaves open, made here:
- Δt is measured in years, from the fragment's timestamp to `as_of` (default: the record's newest
  timestamp, so a replay of an old record scores the same). With the paper's λ* = 5 an episodic
  finding halves in value every ~50 days.
- Standing facts (tier rule `standing = true`: allergies, pathology, genetics, chronic diagnoses) and
  fragments without a timestamp do not decay: Δt = 0. A ten-year-old anaphylaxis keeps its weight.
- A fragment dated after the present (`Fragment.date_in_future`, records.dates) is as far from `as_of` as it lies
  ahead of it: Δt = |as_of - t|, so a mistyped 2062 decays like a fact 36 years old and never scores more recency
  than today's (a negative Δt would be a bonus); it never sets `as_of` (the record's newest trustworthy
  timestamp) and is never part of the current encounter: a mistyped year is not today's visit.
- Sim is the cosine of normalized MiniLM embeddings clipped to [similarity_floor, 1] (floor 0.05).
  Without a floor, a fragment orthogonal to the query has utility exactly 0, and the exact solver,
  which gains nothing by packing it, dropped T2 results with free room left in the window (measured
  on MedQA: 4 of 51 critical fragments at 2048 tokens). The floor keeps relevance dominant while
  every fragment stays worth its tier; floor 0 is the paper's pure form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from ebmrag.evidence.entities import EntityCompressor
from ebmrag.evidence.facts import read_fact
from ebmrag.packing.levels import Rank, rank_of
from ebmrag.packing.types import Candidate, PackOption, State, one_line, render_line
from ebmrag.protocols import CHECK_EVERY, Embedder, TokenCounter, checkpoint
from ebmrag.records.dates import future_flag
from ebmrag.records.fragment import Fragment, PatientRecord, Tier

SECONDS_PER_YEAR = 365.25 * 24 * 3600


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
        if tier is Tier.T1:
            return self.alpha
        if tier is Tier.T2:
            return self.beta
        return self.gamma if tier is Tier.T3 else 1.0


@dataclass(frozen=True)
class UtilityParams:
    weights: TierWeights = field(default_factory=TierWeights)
    decay_lambda: float = 5.0  # per year
    epsilon: float = 0.0
    similarity_floor: float = 0.05
    encounter_window_hours: float = 72.0  # without encounter ids: fragments this close to the newest are current
    fact_fidelity: float = 0.5  # F(fact): the one-line fact state keeps the finding's entities, not its wording

    def __post_init__(self) -> None:
        if self.encounter_window_hours < 0:
            raise ValueError(f"encounter_window_hours must be >= 0, got {self.encounter_window_hours}")
        if self.decay_lambda < 0:
            raise ValueError(f"decay_lambda must be >= 0, got {self.decay_lambda}")
        if not 0 <= self.epsilon <= 1:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if not 0 <= self.similarity_floor < 1:
            raise ValueError(f"similarity_floor must be in [0, 1), got {self.similarity_floor}")
        if not 0 < self.fact_fidelity <= 1:
            raise ValueError(f"fact_fidelity must be in (0, 1], got {self.fact_fidelity}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UtilityParams:
        weights = TierWeights(**data.get("weights", {}))
        return cls(weights, float(data.get("decay_lambda", 5.0)), float(data.get("epsilon", 0.0)),
                   float(data.get("similarity_floor", 0.05)), float(data.get("encounter_window_hours", 72.0)),
                   float(data.get("fact_fidelity", 0.5)))


def age_in_years(fragment: Fragment, as_of: datetime | None) -> float:
    """Δt in years, never negative: 0 for a standing fact and an undated one; for one dated in the future, how far
    ahead of `as_of` it lies (its distance from the present, never a bonus)."""
    if fragment.timestamp is None or as_of is None or (fragment.decision and fragment.decision.standing):
        return 0.0
    seconds = (as_of - fragment.timestamp).total_seconds()
    return (abs(seconds) if fragment.date_in_future else max(0.0, seconds)) / SECONDS_PER_YEAR


def current_encounter_id(fragments: Sequence[Fragment]) -> str | None:
    """The encounter of the newest fragment that names one (record order breaks ties; one dated in the future
    only when no other names an encounter); None when none does."""
    named = [(not f.date_in_future, f.timestamp is not None, f.timestamp, i, f.encounter)
             for i, f in enumerate(fragments) if f.encounter]
    if not named:
        return None
    return max(named, key=lambda t: (t[0], t[1], t[2] or datetime.min, t[3]))[4]


def same_encounter(fragment: Fragment, current: str | None) -> bool | None:
    """Whether the fragment belongs to the current encounter by id (None when either is unnamed: then time
    decides); False for one dated in the future, which is never today's visit whatever encounter it names."""
    if fragment.date_in_future:
        return False
    return (fragment.encounter == current) if current and fragment.encounter else None


def hours_before(fragment: Fragment, as_of: datetime | None) -> float | None:
    """Hours from the fragment to `as_of` whatever its tier (standing facts too); None when undated."""
    if fragment.timestamp is None or as_of is None:
        return None
    return max(0.0, (as_of - fragment.timestamp).total_seconds() / 3600)


def fragment_header(fragment: Fragment, number: int) -> str:
    """"[3|T1|2024-02-01]": a short local number, not the fragment id. EHR ids run to ~40 tokens
    ("Condition/2f1493c2-…"), which would spend most of a small window on headers; the trace maps the
    number back to the id. A date in the future is flagged ("[3|T2|date in the future: 2062-03-01]")."""
    day = fragment.timestamp.date().isoformat() if fragment.timestamp else ""
    date = f"|{future_flag(day) if fragment.date_in_future else day}" if day else ""
    return f"[{number}|{fragment.tier.value}{date}]"


@dataclass(frozen=True)
class MeasuredFragment:
    """The expensive, parameter-free part of a candidate: rendered states, token costs, similarities, age.

    Utility is cheap to recompute from it, so a parameter sweep (tier weights, ε, λ) measures once.
    """

    fragment: Fragment
    header: str
    line: str
    tokens: int
    similarity: float
    age_years: float
    compressed_line: str | None = None
    compressed_body: str = ""
    compressed_tokens: int = 0
    compressed_similarity: float = 0.0
    fidelity_ratio: float = 1.0
    hours_before_newest: float | None = None  # None: undated (treated as part of the current encounter)
    same_encounter: bool | None = None  # the record names encounters: is this the newest one's? (False: dated in
    # the future, which is never the current encounter)
    fact_line: str | None = None  # the fact state (evidence.facts): its finding in one line, under the same header
    fact_body: str = ""
    fact_tokens: int = 0


class CandidateBuilder:
    """Turns classified fragments into scored candidates: states A (and B for T1/T2), costs, utilities."""

    def __init__(
        self,
        embedder: Embedder,
        token_counter: TokenCounter,
        params: UtilityParams | None = None,
        *,
        compressor: EntityCompressor,
    ) -> None:
        """`embedder`, `token_counter` and `compressor` (state B): the composition root's (compose.Resources)."""
        self.embedder = embedder
        self.token_counter = token_counter
        self.params = params or UtilityParams()
        self.compressor = compressor

    def build(self, record: PatientRecord, query: str, as_of: datetime | None = None) -> list[Candidate]:
        return score_candidates(self.measure(record, query, as_of), self.params)

    def measure(self, record: PatientRecord, query: str, as_of: datetime | None = None) -> list[MeasuredFragment]:
        return self.measure_fragments(record.fragments, query, as_of or record.latest_timestamp)

    def measure_fragments(self, fragments: Sequence[Fragment], query: str, as_of: datetime | None = None,
                          headers: Sequence[str] | None = None,
                          compressible: Callable[[Fragment], bool] | None = None,
                          known_similarity: Mapping[str, float] | None = None) -> list[MeasuredFragment]:
        """Classified fragments -> measured states. `headers` replace the default "[id|tier|date]" line
        heads (the answer pipeline numbers lines for citation); `compressible` limits state B (evidence
        chunks have a tier but no entity-preserving compression); `known_similarity` gives Sim for
        fragments measured elsewhere (evidence chunks, from the knowledge base's stored vectors)."""
        if not query.strip():
            raise ValueError("query is empty: utility needs a question to measure similarity against")
        if headers is not None and len(headers) != len(fragments):
            raise ValueError(f"{len(headers)} headers for {len(fragments)} fragments")
        can_compress = compressible or (lambda f: f.tier.compressible)
        flags = [can_compress(f) for f in fragments]
        states = iter(self.compressor.compress_many([f.text for f, flag in zip(fragments, flags, strict=True) if flag]))
        compressions = [next(states) if flag else None for flag in flags]
        bodies_b = [
            c.text if c and c.text and c.text != f.text else None for f, c in zip(fragments, compressions, strict=True)
        ]
        known = known_similarity or {}
        checkpoint()
        texts = [query, *(f.text for f in fragments if f.id not in known), *(b for b in bodies_b if b)]
        vectors = self.embedder.embed(texts)
        computed = iter(np.clip(vectors[1:] @ vectors[0], 0.0, 1.0).tolist())
        sims = np.array([min(max(known[f.id], 0.0), 1.0) if f.id in known else next(computed) for f in fragments]
                        + list(computed))
        sim_b = iter(sims[len(fragments) :])
        headers = list(headers) if headers is not None else [fragment_header(f, n) for n, f in enumerate(fragments, 1)]
        lines = [render_line(h, f.text) for h, f in zip(headers, fragments, strict=True)]
        lines_b = [render_line(h, b) for h, b in zip(headers, bodies_b, strict=True) if b]
        facts = [fact_body(f) if flag else "" for f, flag in zip(fragments, flags, strict=True)]
        lines_f = [render_line(h, b) for h, b in zip(headers, facts, strict=True) if b]
        checkpoint()
        costs = self.token_counter.count_many(lines + lines_b + lines_f)
        cost_b = iter(costs[len(fragments) : len(fragments) + len(lines_b)])
        cost_f, line_f = iter(costs[len(fragments) + len(lines_b) :]), iter(lines_f)
        line_b = iter(lines_b)
        measured = []
        encounter = current_encounter_id(fragments)
        for order, fragment in enumerate(fragments):
            if order % CHECK_EVERY == CHECK_EVERY - 1:
                checkpoint()
            same = same_encounter(fragment, encounter)
            item = MeasuredFragment(fragment, headers[order], lines[order], costs[order], float(sims[order]),
                                    age_in_years(fragment, as_of), hours_before_newest=hours_before(fragment, as_of),
                                    same_encounter=same)
            compression = compressions[order]
            if compression and bodies_b[order]:
                item = replace(item, compressed_line=next(line_b), compressed_body=bodies_b[order] or "",
                               compressed_tokens=next(cost_b),
                               compressed_similarity=float(next(sim_b)), fidelity_ratio=compression.fidelity_ratio)
            if facts[order]:
                item = replace(item, fact_line=next(line_f), fact_body=facts[order], fact_tokens=next(cost_f))
            measured.append(item)
        return measured


def score_candidates(measured: Sequence[MeasuredFragment], params: UtilityParams) -> list[Candidate]:
    """U_ij = F(j) · W(i) · Sim · exp(-λ·Δt); state B only when it is cheaper than A, the fact state only when
    it is cheaper than every other state (its Sim is the full text's: it says the same finding)."""
    candidates = []
    for order, item in enumerate(measured):
        if order % CHECK_EVERY == CHECK_EVERY - 1:
            checkpoint()
        fragment = item.fragment
        base = params.weights.of(fragment.tier) * math.exp(-params.decay_lambda * item.age_years)
        similarity = max(item.similarity, params.similarity_floor)
        options = [PackOption(State.FULL, item.line, item.tokens, base * similarity, body=one_line(fragment.text))]
        if item.compressed_line is not None and item.compressed_tokens < item.tokens:
            fidelity = min(1.0, item.fidelity_ratio + params.epsilon)
            options.append(PackOption(State.COMPRESSED, item.compressed_line, item.compressed_tokens,
                                      fidelity * base * max(item.compressed_similarity, params.similarity_floor),
                                      fidelity, one_line(item.compressed_body)))
        if item.fact_line is not None and item.fact_tokens < min(o.tokens for o in options):
            options.append(PackOption(State.FACT, item.fact_line, item.fact_tokens,
                                      params.fact_fidelity * base * similarity, params.fact_fidelity, item.fact_body))
        must_keep = bool(fragment.decision and fragment.decision.must_keep)
        candidates.append(Candidate(fragment, item.header, tuple(options), item.similarity, must_keep, order,
                                    is_current(item, params)))
    return candidates


def fact_body(fragment: Fragment) -> str:
    """The fact state's text (evidence.facts) of a fragment its level ranks critical, or "" when it has none: a
    structured finding that can be read from it, never a summary of it."""
    if rank_of(fragment.decision) is not Rank.CRITICAL or fragment.decision is None:
        return ""
    fact = read_fact(fragment.text, fragment.decision)
    return fact.line() if fact is not None else ""


def is_current(item: MeasuredFragment, params: UtilityParams) -> bool:
    """Part of the current encounter: by encounter id when the record names them, else by time (undated
    fragments count as current: a note without a date is read as today's)."""
    return in_current_encounter(item.same_encounter, item.hours_before_newest, params)


def in_current_encounter(same_encounter: bool | None, hours_before_newest: float | None,
                         params: UtilityParams) -> bool:
    if same_encounter is not None:
        return same_encounter
    return hours_before_newest is None or hours_before_newest <= params.encounter_window_hours
