"""`[answer]`: the answer engine's settings, its gate's thresholds and weights among them."""

from __future__ import annotations

from dataclasses import dataclass

from ebmrag.packing.types import MAX_WINDOW


def check_gate_params(alpha: float, beta: float, gamma: float, theta1: float, theta2: float) -> None:
    """The retrieval gate's rule for its weights and thresholds: checked for the file (`AnswerParams`) and
    for `answer.gate.GateParams`'s arguments, with this one function."""
    if not alpha > 0 or not 0 <= gamma <= beta <= alpha:
        raise ValueError(f"gate weights need alpha > 0 and 0 <= gamma <= beta <= alpha, got ({alpha}, {beta}, {gamma})")
    if not 0 <= theta2 <= theta1 <= 1:
        raise ValueError(f"gate thresholds need 0 <= theta2 <= theta1 <= 1, got ({theta1}, {theta2})")


@dataclass(frozen=True)
class AnswerParams:
    """`ebmrag ask`: `window` is the whole prompt budget of the answering model (see generate.budget)."""

    window: int = 4096
    retrieval: str = "auto"  # auto (the gate decides) | always | never
    ordering: str = "relevance_first"  # or edges_first
    max_queries: int = 24  # A/B sentences that vote for documents, A first
    relevance_filter: bool = False  # ask the model about each retrieved document (needs an LLM)
    grounding_threshold: float = 0.6
    prompts: str = ""  # a TOML file with the four stages; empty = the bundled set for the question's language
    evidence_share: float = 0.5  # the most of the context that knowledge-base evidence may take
    model_seconds: float = 180.0  # one time budget for all model calls of one answer; then the offline brief
    gate_model: str = ""  # a classifier from `ebmrag gate train`; empty = the label-free rule labeller
    gate_alpha: float = 1.0  # completeness weights of A, B, C sentences (ICA-RAG)
    gate_beta: float = 0.5
    gate_gamma: float = 0.1
    gate_theta1: float = 0.35  # above: answer from the record (the paper prints 0.3; see docs/results/gate.md)
    gate_theta2: float = 0.25  # below: retrieve and warn (the paper prints 0.1, which can never fire)
    brief_sentences: int = 12  # the offline brief's patient sentences (must-keep first, then by relevance)
    brief_evidence_sentences: int = 8
    redact: str = "auto"  # identifiers out of what an outside model sees: auto (unless local), always, never
    local_hosts: str = "127.0.0.1,localhost,::1"  # endpoints on these hosts count as local

    def __post_init__(self) -> None:
        if not 1 <= self.window <= MAX_WINDOW:
            raise ValueError(f"window must be a whole number of tokens from 1 to {MAX_WINDOW:,}, got {self.window}")
        if self.model_seconds <= 0:
            raise ValueError(f"model_seconds must be > 0, got {self.model_seconds}")
        if self.max_queries < 1:
            raise ValueError(f"max_queries must be >= 1, got {self.max_queries}")
        if self.brief_sentences < 1 or self.brief_evidence_sentences < 0:
            raise ValueError("brief_sentences must be >= 1 and brief_evidence_sentences >= 0, got "
                             f"{self.brief_sentences} and {self.brief_evidence_sentences}")
        if not 0 < self.evidence_share <= 1:
            raise ValueError(f"evidence_share must be in (0, 1], got {self.evidence_share}")
        check_gate_params(self.gate_alpha, self.gate_beta, self.gate_gamma, self.gate_theta1, self.gate_theta2)
        if self.redact not in ("auto", "always", "never"):
            raise ValueError(f"redact must be auto, always or never, got {self.redact!r}")
        if self.retrieval not in ("auto", "always", "never"):
            raise ValueError(f"retrieval must be auto, always or never, got {self.retrieval!r}")
        if self.ordering not in ("relevance_first", "edges_first"):
            raise ValueError(f"ordering must be relevance_first or edges_first, got {self.ordering!r}")
