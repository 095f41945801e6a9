"""Issue 18.2: bounded windows and bounded solver memory."""

from __future__ import annotations

import tracemalloc

import pytest

from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.types import MAX_WINDOW
from tests.packing.helpers import make_candidate


def test_an_absurd_window_is_a_clear_error_not_an_out_of_memory() -> None:
    candidates = [make_candidate("a", "T2", tokens=10, utility=1.0)]
    for window in (0, -5, MAX_WINDOW + 1, 1_000_000_000):
        with pytest.raises(ValueError, match="window must be a whole number of tokens from 1 to"):
            ExactPacker().pack(candidates, window)


def test_a_huge_window_with_a_big_record_stays_in_bounded_memory_and_fits() -> None:
    tiers = ("T1", "T2", "T3", "T4")
    candidates = [make_candidate(f"f{i}", tiers[i % 4], tokens=40 + i % 90, utility=1.0 + i % 7 / 10, order=i,
                                 compressed_tokens=10 + i % 20 if i % 4 < 2 else None) for i in range(2000)]
    window = 60_000  # less than the ~109k the record needs, so the DP has to run
    tracemalloc.start()
    result = ExactPacker().pack(candidates, window)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result.tokens_used <= window
    assert "token grid" in result.solver_note and result.to_json()["solver_note"] == result.solver_note
    assert peak < 400 * 2**20, f"peak {peak / 2**20:.0f} MB"
    every = ExactPacker().pack(candidates, 200_000)
    assert not every.dropped and not every.solver_note, "room for everything: no DP, nothing dropped"
