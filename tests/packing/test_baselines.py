from __future__ import annotations

from ebmrag.models.tokens import HuggingFaceTokenCounter
from ebmrag.packing.baselines import FifoPacker, SemanticPacker, UniformPacker
from ebmrag.packing.types import DropReason, State
from tests.packing.helpers import make_candidate


def test_fifo_truncates_at_first_overflow_in_record_order() -> None:
    candidates = [
        make_candidate("a", "T4", 30, 1.0, order=0),
        make_candidate("b", "T1", 50, 3.0, order=1),
        make_candidate("c", "T4", 5, 1.0, order=2),
    ]
    result = FifoPacker().pack(candidates, window=60)
    assert [p.fragment_id for p in result.packed] == ["a"]
    assert {d.fragment_id: d.reason for d in result.dropped} == {"b": DropReason.CAPACITY, "c": DropReason.CAPACITY}
    assert "stopped at fragment 'b'" in result.dropped[1].detail


def test_semantic_orders_by_similarity() -> None:
    candidates = [
        make_candidate("low", "T1", 10, 3.0, order=0, similarity=0.1),
        make_candidate("high", "T4", 10, 0.1, order=1, similarity=0.9),
    ]
    result = SemanticPacker().pack(candidates, window=10)
    assert [p.fragment_id for p in result.packed] == ["high"]


def test_uniform_keeps_a_share_of_every_fragment_and_fits() -> None:
    counter = HuggingFaceTokenCounter()
    candidates = []
    for i, n in enumerate([80, 40, 20, 3]):
        base = make_candidate(f"f{i}", "T2", n, 1.0, order=i)
        candidates.append(base)
    window = 60
    result = UniformPacker(counter).pack(candidates, window)
    assert sum(counter.count(p.text) for p in result.packed) <= window
    assert all(p.state is State.TRUNCATED for p in result.packed)
    assert {d.reason for d in result.dropped} <= {DropReason.TRUNCATED_AWAY}
    assert len(result.packed) >= 2, "long fragments keep a share"


def test_uniform_packs_everything_full_when_it_fits() -> None:
    counter = HuggingFaceTokenCounter()
    candidates = [make_candidate("a", "T2", 5, 1.0), make_candidate("b", "T4", 5, 1.0, order=1)]
    result = UniformPacker(counter).pack(candidates, window=100)
    assert {p.state for p in result.packed} == {State.FULL} and not result.dropped
