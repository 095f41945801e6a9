"""`[packing]`: what the packer is asked to do, with one name and one default per setting (the TOML keys)."""

from __future__ import annotations

from dataclasses import dataclass

from ebmrag.packing.prefilter import Prefilter
from ebmrag.packing.quota import validate_k_min
from ebmrag.packing.utility import TierWeights, UtilityParams

STRATEGIES = ("ebm-exact", "ebm-exact-paper", "ebm-greedy", "fifo", "semantic", "uniform")
OBJECTIVES = ("critical", "paper")


@dataclass(frozen=True)
class PackingParams:
    """The `ContextPacker`'s settings. `objective = "paper"` turns `ebm-exact` into the paper's MCKP
    (quotas, then utility); "critical" keeps must-keep facts and the current encounter's T1/T2 first."""

    strategy: str = "ebm-exact"  # ebm-exact | ebm-exact-paper | ebm-greedy | fifo | semantic | uniform
    window: int = 256  # the default budget of `ebmrag pack` (the answer engine has its own, [answer] window)
    k_min: int = 1  # fragments per tier the EBM packers try to keep
    alpha: float = 2.5  # tier weights, alpha >= beta >= gamma >= 1
    beta: float = 2.5
    gamma: float = 1.0
    decay_lambda: float = 5.0  # per year; standing facts never decay
    epsilon: float = 0.0
    similarity_floor: float = 0.05
    objective: str = "critical"
    encounter_window_hours: float = 72.0  # without encounter ids: this close to the newest fragment is current
    fact_fidelity: float = 0.5  # F of the one-line fact state of a critical finding (evidence.facts)
    prefilter_windows: float = 4.0  # records estimated above this many windows are pre-filtered; 0 = never
    prefilter_min_fragments: int = 1000  # ... and only when they hold more fragments than this

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown packing strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.prefilter_windows != 0 and self.prefilter_windows < 1:
            raise ValueError(f"prefilter_windows must be 0 (off) or >= 1, got {self.prefilter_windows}")
        if self.prefilter_min_fragments < 1:
            raise ValueError(f"prefilter_min_fragments must be >= 1, got {self.prefilter_min_fragments}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be 'critical' or 'paper', got {self.objective!r}")
        validate_k_min(self.k_min)
        self.utility  # noqa: B018 - the tier weights and decay are checked where they are defined

    @property
    def solver(self) -> str:
        """The packing strategy that runs: `ebm-exact` with the paper's objective is `ebm-exact-paper`."""
        return "ebm-exact-paper" if self.strategy == "ebm-exact" and self.objective == "paper" else self.strategy

    @property
    def utility(self) -> UtilityParams:
        return UtilityParams(TierWeights(self.alpha, self.beta, self.gamma), self.decay_lambda, self.epsilon,
                             self.similarity_floor, self.encounter_window_hours, self.fact_fidelity)

    @property
    def prefilter(self) -> Prefilter | None:
        return Prefilter(self.prefilter_windows, self.prefilter_min_fragments) if self.prefilter_windows else None
