"""Fusing ranked lists from several retrievers.

Plain RRF, Σ_r 1/(60 + rank_r(d)), ignores how confident each route is; on consumer questions BM25 is much weaker
than dense retrieval, and RRF at equal weights lets its noise pull good dense hits down. So both
rank fusion and score fusion take per-route weights; see docs/results/retrieval.md for the ablation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ebmrag.index.lexical import Rows, Scores


class Ranked(NamedTuple):
    rows: Rows
    scores: Scores


def rrf(routes: Sequence[Ranked], weights: Sequence[float], k: int = 60) -> dict[int, float]:
    """Weighted Reciprocal Rank Fusion: sum over routes of w_r / (k + rank_r(d)), ranks from 1."""
    fused: dict[int, float] = {}
    for route, weight in zip(routes, weights, strict=True):
        for rank, row in enumerate(route.rows.tolist(), start=1):
            fused[row] = fused.get(row, 0.0) + weight / (k + rank)
    return fused


def min_max(values: Sequence[float] | npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """Scores scaled to [0, 1] (all ones when they are all equal, none when there are none)."""
    scores = np.asarray(values, dtype=np.float64)
    if len(scores) == 0:
        return scores
    low, span = float(scores.min()), float(scores.max() - scores.min())
    return (scores - low) / span if span > 0 else np.ones_like(scores)


def score_fusion(routes: Sequence[Ranked], weights: Sequence[float]) -> dict[int, float]:
    """Convex combination of min-max normalised route scores; a row missing from a route scores 0 there."""
    fused: dict[int, float] = {}
    for route, weight in zip(routes, weights, strict=True):
        if len(route.rows) == 0:
            continue
        for row, value in zip(route.rows.tolist(), min_max(route.scores).tolist(), strict=True):
            fused[row] = fused.get(row, 0.0) + weight * value
    return fused


def fuse(routes: Sequence[Ranked], weights: Sequence[float], fusion: str = "score",
         rrf_k: int = 60) -> dict[int, float]:
    """`fusion` is "rrf" (weighted reciprocal rank) or "score" (weighted min-max)."""
    return rrf(routes, weights, rrf_k) if fusion == "rrf" else score_fusion(routes, weights)


def with_focus(weights: Sequence[float], focus_weight: float) -> list[float]:
    """Route weights when every route also runs on the question's focus: full text keeps 1 - f of each weight,
    the focus routes take f (routes in the order full..., focus...)."""
    return [w * (1 - focus_weight) for w in weights] + [w * focus_weight for w in weights]


def top(fused: dict[int, float], k: int) -> Ranked:
    ordered = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
    return Ranked(np.asarray([r for r, _ in ordered], np.int64), np.asarray([s for _, s in ordered], np.float32))
