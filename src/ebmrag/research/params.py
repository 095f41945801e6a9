"""`[research]`: the research agent's loop, authority weighting and the DDx engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ebmrag.rules import rule_file


@rule_file("evidence/hierarchy.toml")
def default_authority(raw: Mapping[str, Any]) -> dict[str, float]:
    """The authority weight of each kind of source, from the evidence hierarchy (rules/evidence/hierarchy.toml)."""
    return {kind: float(level["weight"]) for kind, level in raw.items()}


@dataclass(frozen=True)
class ResearchParams:
    """`ebmrag research` and `ebmrag ddx`: the agent loop, authority weighting (Score = λ·Rel + (1−λ)·Auth) and
    the DDx engine."""

    max_steps: int = 12
    window: int = 8192  # the agent's own context, kept by EBM-Pack (question, patient view, observations)
    output_reserve: int = 1024  # tokens left free for the model's reply
    protocol: str = "auto"  # tools (OpenAI tool calling) | text (Thought/Action/Observation) | auto: tools, else text
    relevance_weight: float = 0.4  # λ in Score = λ·Rel + (1−λ)·Auth
    authority: dict[str, float] = field(default_factory=lambda: dict(default_authority()))
    search_k: int = 5
    read_budget: int = 600  # tokens of a document that read_document returns
    trajectories: str = ""  # folder for the JSONL trajectories; empty = <cache dir>/trajectories
    ddx_kb: str = ""  # a condition knowledge base (ebmrag-ddx-kb/1 JSON); empty = the bundled DDXPlus one

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.window < 512 or not 0 <= self.output_reserve < self.window // 2:
            raise ValueError("max_steps must be >= 1, window >= 512 and output_reserve in [0, window/2)")
        if self.protocol not in ("auto", "tools", "text"):
            raise ValueError(f"protocol must be auto, tools or text, got {self.protocol!r}")
        if not 0 <= self.relevance_weight <= 1:
            raise ValueError(f"relevance_weight must be in [0, 1], got {self.relevance_weight}")
        bad = {k: v for k, v in self.authority.items() if not isinstance(v, int | float) or not 0 <= v <= 1}
        if bad or "other" not in self.authority:
            raise ValueError(f"authority weights must be numbers in [0, 1] and include 'other'; bad: {bad}")
        if self.search_k < 1 or self.read_budget < 32:
            raise ValueError("search_k must be >= 1 and read_budget >= 32")
