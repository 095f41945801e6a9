"""Invariants of both EBM packers on random candidate sets, and exact == brute force on small ones."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.levels import Level, Rank
from ebmrag.packing.overflow import allergy_overflow, is_allergy
from ebmrag.packing.quota import tier_quotas
from ebmrag.packing.types import Candidate, PackResult, State
from tests.packing.strategies import candidate_sets

windows = st.integers(min_value=1, max_value=200)
k_mins = st.integers(min_value=0, max_value=3)


def _assignments(candidates: list[Candidate]) -> itertools.product[tuple[int, ...]]:
    """Every way to pack: -1 = dropped, j = option j."""
    return itertools.product(*[range(-1, len(c.options)) for c in candidates])


Score = tuple[float, ...]  # the objective's steps, compared lexicographically


def _score(candidates: list[Candidate], choice: tuple[int, ...], k_min: int, objective: str = "critical") -> Score:
    """The lexicographic objective of ebm-exact, written out plainly: allergies packed; levels 1, 2 and 3
    packed, rank by rank (critical, abnormal, other); levels 1-3 in words (not as a fact line); levels 1-2 in
    full text; level 3 in full text; quota slots filled; utility. "paper" keeps the last two."""
    quotas = tier_quotas(candidates, k_min)
    taken = [(c, j) for c, j in zip(candidates, choice, strict=True) if j >= 0]
    packed = Counter(c.tier for c, _ in taken)
    slots = sum(min(q, packed[t]) for t, q in quotas.items())
    utility = sum(c.options[j].utility for c, j in taken)
    if objective == "paper":
        return (slots, utility)
    classes = Counter((c.level, c.rank) for c, _ in taken if not is_allergy(c))
    worded = Counter(c.level for c, j in taken if c.critical and c.options[j].state is not State.FACT)
    full = Counter(c.level for c, j in taken if j == 0)
    first = Level.ALWAYS, Level.CURRENT_ENCOUNTER

    def ranks(level: Level) -> tuple[int, ...]:
        return tuple(classes[(level, rank)] for rank in sorted(Rank, reverse=True))

    return (sum(is_allergy(c) for c, _ in taken), *ranks(Level.ALWAYS), *ranks(Level.CURRENT_ENCOUNTER),
            *ranks(Level.STANDING_HISTORY), sum(worded.values()), sum(full[v] for v in first),
            full[Level.STANDING_HISTORY], slots, utility)


def _brute_force(candidates: list[Candidate], window: int, k_min: int, objective: str = "critical") -> Score:
    """Allergies that overflow the window on their own are chosen by their rule (severe, newest) before the search."""
    left_out = allergy_overflow(candidates, window) if objective == "critical" else set()
    feasible = (
        choice
        for choice in _assignments(candidates)
        if sum(c.options[j].tokens for c, j in zip(candidates, choice, strict=True) if j >= 0) <= window
        and all(choice[i] < 0 for i in left_out)
    )
    return max(_score(candidates, choice, k_min, objective) for choice in feasible)


def _choice_of(result: PackResult, candidates: list[Candidate]) -> tuple[int, ...]:
    states = {p.fragment_id: p.state for p in result.packed}
    return tuple(
        next((j for j, o in enumerate(c.options) if o.state is states.get(c.fragment.id)), -1) for c in candidates
    )


def _check_trace(result: PackResult, candidates: list[Candidate], window: int) -> None:
    ids = [p.fragment_id for p in result.packed] + [d.fragment_id for d in result.dropped]
    assert sorted(ids) == sorted(c.fragment.id for c in candidates), "every fragment traced exactly once"
    assert result.tokens_used <= window
    assert all(d.detail for d in result.dropped), "every drop has a reason text"


@settings(max_examples=200, deadline=None)
@given(candidate_sets(max_size=6), windows, k_mins, st.sampled_from(["critical", "paper"]))
def test_exact_equals_brute_force(candidates: list[Candidate], window: int, k_min: int, objective: str) -> None:
    result = ExactPacker(k_min=k_min, objective=objective, findings_first=False).pack(candidates, window)
    _check_trace(result, candidates, window)
    best = _brute_force(candidates, window, k_min, objective)
    got = _score(candidates, _choice_of(result, candidates), k_min, objective)
    assert got[:-1] == best[:-1], "each level of the objective is maximal before the next is considered"
    assert got[-1] == pytest.approx(best[-1], abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(candidate_sets(max_size=10), windows, k_mins)
def test_quotas_and_must_keep_whenever_feasible(candidates: list[Candidate], window: int, k_min: int) -> None:
    """The solver's guarantees; the findings pass after it may trade a T4 quota slot for a finding."""
    result = ExactPacker(k_min=k_min, findings_first=False).pack(candidates, window)
    packed = {p.fragment_id for p in result.packed}
    cheapest = {c.fragment.id: min(o.tokens for o in c.options) for c in candidates}
    for level in (Level.ALWAYS, Level.CURRENT_ENCOUNTER, Level.STANDING_HISTORY):
        upto = [c for c in candidates if c.level <= level]
        if sum(cheapest[c.fragment.id] for c in upto) <= window:
            assert all(c.fragment.id in packed for c in upto), f"levels 1..{level.value} fit together, so all are kept"
    critical = [c for c in candidates if c.critical]
    quotas = tier_quotas(candidates, k_min)
    cheapest_per_tier = {t: sorted(cheapest[c.fragment.id] for c in candidates if c.tier is t) for t in quotas}
    need = sum(sum(cheapest_per_tier[t][:q]) for t, q in quotas.items())
    if not critical and need <= window:
        counts = Counter(p.tier for p in result.packed)
        assert all(counts[t] >= q for t, q in quotas.items()), "quotas met when the cheapest quota set fits"


@settings(max_examples=150, deadline=None)
@given(candidate_sets(max_size=12), windows, k_mins)
def test_exact_never_worse_than_greedy(candidates: list[Candidate], window: int, k_min: int) -> None:
    exact = ExactPacker(k_min=k_min, findings_first=False).pack(candidates, window)
    greedy = GreedyPacker(k_min=k_min).pack(candidates, window)
    _check_trace(greedy, candidates, window)
    exact_score = _score(candidates, _choice_of(exact, candidates), k_min)
    greedy_score = _score(candidates, _choice_of(greedy, candidates), k_min)
    assert exact_score[:-1] >= greedy_score[:-1]
    if exact_score[:-1] == greedy_score[:-1]:
        assert exact_score[-1] >= greedy_score[-1] - 1e-9


@settings(max_examples=100, deadline=None)
@given(candidate_sets(max_size=10), windows)
def test_one_state_per_fragment_and_exclusion_recorded(candidates: list[Candidate], window: int) -> None:
    for packer in (ExactPacker(), GreedyPacker()):
        result = packer.pack(candidates, window)
        by_id = {c.fragment.id: c for c in candidates}
        for p in result.packed:
            states = {o.state for o in by_id[p.fragment_id].options}
            assert p.state in states
            assert set(p.excluded_states) == states - {p.state}


def test_greedy_follows_density_and_tier_quota() -> None:
    from tests.packing.helpers import make_candidate

    dense_t4 = make_candidate("chat", "T4", tokens=10, utility=2.0)
    sparse_t1 = make_candidate("biopsy", "T1", tokens=40, utility=1.0)
    filler = make_candidate("note", "T4", tokens=30, utility=1.5)
    result = GreedyPacker(k_min=1, levels=False).pack([dense_t4, sparse_t1, filler], window=50)
    reasons = {p.fragment_id: p.reason.value for p in result.packed}
    assert reasons == {"biopsy": "quota", "chat": "quota"}, "T1 quota first, then T4 quota; filler no longer fits"


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_bad_k_min_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="k_min"):
        ExactPacker(k_min=bad)  # type: ignore[arg-type]


def test_bad_window_rejected() -> None:
    with pytest.raises(ValueError, match="window"):
        ExactPacker().pack([], 0)


@settings(max_examples=150, deadline=None)
@given(candidate_sets(max_size=10), windows, k_mins, st.sampled_from([1.0, 1e-22, 1e-300]))
def test_no_fragment_that_fits_is_dropped_while_room_is_left(candidates: list[Candidate], window: int, k_min: int,
                                                             scale: float) -> None:
    """Issue 20.3: decade-old labs (utility ~e^-50) were dropped "for density" with half the window empty,
    because their utility vanished beside the objective's big-M bonuses in float64."""
    tiny = [replace(c, options=tuple(replace(o, utility=o.utility * (scale if c.order % 2 else 1.0))
                                     for o in c.options)) for c in candidates]
    result = ExactPacker(k_min=k_min).pack(tiny, window)
    room = window - result.tokens_used
    by_id = {c.fragment.id: c for c in tiny}
    for dropped in result.dropped:
        assert min(o.tokens for o in by_id[dropped.fragment_id].options) > room, dropped
        assert (f"{room} tokens were left" in dropped.detail or "exceeds the window" in dropped.detail
                or "allergies alone overflow" in dropped.detail)
