"""The certificate of a pack (packing.certificate): per level what was packed, left out and collapsed, whether the
order is proven optimal, and the first critical fragment left out with the tokens it would need."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ebmrag.packing.certificate import certificate
from ebmrag.packing.dedup import pack_collapsed
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.levels import Level
from ebmrag.packing.types import Candidate, DropReason, PackOption, State
from ebmrag.records.fragment import Fragment, Tier, TierDecision

ALLERGY = TierDecision(Tier.T1, "test-allergy", must_keep=True, always="allergy")
TODAY = TierDecision(Tier.T2, "test-result")  # a T2 finding: level 2 when current
HISTORY = TierDecision(Tier.T2, "test-history", standing=True)  # a standing T2 finding of an earlier visit: level 3
ROUTINE = TierDecision(Tier.T4, "test-note")


def chart_line(fid: str, order: int, decision: TierDecision, full: int, compressed: int | None = None,
               current: bool = False, text: str = "") -> Candidate:
    """A fragment with a full state of `full` tokens and, when given, a compressed one of `compressed`."""
    body = text or f"line {fid}"
    stamp = datetime(2026, 3, 1, tzinfo=UTC) + timedelta(hours=order)
    fragment = Fragment(fid, "p", body, timestamp=stamp, decision=decision)
    options = [PackOption(State.FULL, f"[{fid}] {body}", full, 1.0, body=body)]
    if compressed is not None:
        options.append(PackOption(State.COMPRESSED, f"[{fid}] short", compressed, 0.9, 0.9, body="short"))
    return Candidate(fragment, f"[{fid}]", tuple(options), 0.5, decision.must_keep, order, current=current)


def crowded_morning() -> list[Candidate]:
    """An old biopsy first in the record (level 3, too long for what is left), an allergy, two of today's
    results of which only one fits, a short standing diagnosis and a routine note."""
    return [
        chart_line("old-biopsy", 0, HISTORY, 50),
        chart_line("allergy", 1, ALLERGY, 10),
        chart_line("sodium", 2, TODAY, 30, current=True),
        chart_line("troponin", 3, TODAY, 60, compressed=35, current=True),
        chart_line("diabetes", 4, HISTORY, 20),
        chart_line("nursing", 5, ROUTINE, 5),
    ]


def test_a_small_window_names_the_first_critical_fragment_left_out_and_what_it_needs() -> None:
    result = ExactPacker(k_min=0).pack(crowded_morning(), 60)
    assert {p.fragment_id for p in result.packed} == {"allergy", "sodium", "diabetes"}
    cert = certificate(result)
    first = cert.first_critical_left_out
    assert first is not None
    # troponin (level 2) comes after the old biopsy (level 3) in the record, but its level is the more important
    assert (first.fragment_id, first.level, first.level_name) == ("troponin", Level.CURRENT_ENCOUNTER,
                                                                   "current_encounter")
    assert first.needs == 35, "the tokens of its smallest (compressed) state, not of its full text"
    assert first.room == 60 - result.tokens_used == 0
    assert first.reason == DropReason.CAPACITY.value
    assert cert.critical_left_out == 2 and cert.optimal
    counts = {c.level: (c.packed, c.left_out, c.collapsed) for c in cert.levels}
    assert counts == {Level.ALWAYS: (1, 0, 0), Level.CURRENT_ENCOUNTER: (1, 1, 0),
                      Level.STANDING_HISTORY: (1, 1, 0), Level.UTILITY: (0, 1, 0)}


def test_a_window_that_holds_everything_certifies_nothing_critical_lost() -> None:
    result = ExactPacker().pack(crowded_morning(), 1000)
    data = result.to_json()["certificate"]
    assert data["critical_left_out"] == 0 and data["first_critical_left_out"] is None and data["optimal"] is True
    assert [(c["level"], c["name"], c["left_out"]) for c in data["levels"]] == [
        (1, "always", 0), (2, "current_encounter", 0), (3, "standing_history", 0), (4, "utility", 0)]
    assert sum(c["packed"] for c in data["levels"]) == len(result.packed) == 6


def test_exact_proves_the_order_but_greedy_and_the_paper_objective_do_not() -> None:
    morning = crowded_morning()
    assert ExactPacker().pack(morning, 60).optimal
    assert not GreedyPacker().pack(morning, 60).optimal
    assert not ExactPacker(objective="paper").pack(morning, 60).optimal
    greedy = GreedyPacker().pack(morning, 60).to_json()["certificate"]
    assert greedy["optimal"] is False and greedy["first_critical_left_out"]["needs"] > 0


def test_a_coarsened_token_grid_is_not_a_proof() -> None:
    """A table too large for memory is solved on a coarser token grid (exact.MAX_TABLE_CELLS): optimal on the grid,
    not proven on the real window."""
    long_notes = [chart_line(f"n{i}", i, ROUTINE, 6_000) for i in range(100)]
    result = ExactPacker(k_min=0).pack(long_notes, 500_000)
    assert "token grid" in result.solver_note
    assert not result.optimal and certificate(result).optimal is False


def test_a_collapsed_copy_is_not_left_out() -> None:
    text = "Troponin I 2.4 ng/mL at 06:00, above the reference range, cardiology informed by phone."
    copies = [chart_line("first", 0, TODAY, 20, current=True, text=text),
              chart_line("copied", 1, TODAY, 20, current=True, text=text)]
    result = pack_collapsed(ExactPacker(), copies, 100)
    assert [d.reason for d in result.dropped] == [DropReason.DUPLICATE]
    cert = certificate(result)
    current = next(c for c in cert.levels if c.level is Level.CURRENT_ENCOUNTER)
    assert (current.packed, current.left_out, current.collapsed) == (1, 0, 1)
    assert cert.critical_left_out == 0 and cert.first_critical_left_out is None


def test_every_dropped_entry_records_its_smallest_state_and_record_order() -> None:
    """drop_entry records the smallest state and record order of every fragment it drops."""
    result = ExactPacker(k_min=0).pack(crowded_morning(), 60)
    by_id = {d.fragment_id: d for d in result.dropped}
    assert (by_id["old-biopsy"].needs, by_id["old-biopsy"].order) == (50, 0)
    assert (by_id["nursing"].needs, by_id["nursing"].order) == (5, 5)
