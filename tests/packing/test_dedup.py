"""Copy-forward notes collapsed: copies take one slot, different numbers are never copies."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from ebmrag.packing.dedup import collapse_duplicates, numbers, pack_collapsed, shingles
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.types import Candidate, DropReason, PackOption, State
from ebmrag.records.fragment import Fragment, Tier, TierDecision

NURSING = "Patient resting comfortably in bed, call bell within reach, side rails up, no complaints voiced overnight."


def candidate(fid: str, text: str, tier: Tier = Tier.T4, day: int = 1, tokens: int = 20,
              must_keep: bool = False) -> Candidate:
    fragment = Fragment(fid, "p", text, timestamp=datetime(2026, 3, day, tzinfo=UTC),
                        decision=TierDecision(tier, "test", must_keep=must_keep))
    option = PackOption(State.FULL, f"[{fid}] {text}", tokens, 1.0, body=text)
    return Candidate(fragment, f"[{fid}]", (option,), 0.5, must_keep, int(fid[1:]))


def test_verbatim_copies_keep_the_newest_and_name_it() -> None:
    copies = [candidate(f"n{i}", NURSING, day=i + 1) for i in range(4)]
    kept, dropped = collapse_duplicates([*copies, candidate("n9", "Potassium 6.4 mmol/L.", Tier.T2)])
    assert [c.fragment.id for c in kept] == ["n3", "n9"]
    assert {d.fragment_id for d in dropped} == {"n0", "n1", "n2"}
    assert all(d.reason is DropReason.DUPLICATE and "n3" in d.detail for d in dropped)


def test_near_copies_collapse_but_different_numbers_never_do() -> None:
    edited = NURSING.replace("overnight", "during the night")
    assert len(collapse_duplicates([candidate("n1", NURSING), candidate("n2", edited)])[1]) == 1
    potassium = [candidate("n1", "Serum potassium 6.4 mmol/L on the morning panel, repeat ordered.", Tier.T2),
                 candidate("n2", "Serum potassium 4.1 mmol/L on the morning panel, repeat ordered.", Tier.T2)]
    assert collapse_duplicates(potassium)[1] == [], "K 6.4 and K 4.1 are two results, not copies"
    assert numbers("K 6,4 and 12") == ("12", "6.4")


def test_the_more_critical_copy_is_kept_and_chinese_is_shingled_by_character() -> None:
    text = "患者对青霉素过敏，用药后出现喉头水肿和全身皮疹，需避免再次使用。"
    kept, dropped = collapse_duplicates([candidate("n1", text, Tier.T4, day=9),
                                         candidate("n2", text, Tier.T1, day=1, must_keep=True)])
    assert [c.fragment.id for c in kept] == ["n2"] and dropped[0].fragment_id == "n1"
    assert len(shingles(text)) > 10


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([NURSING, "Creatinine 2.8 mg/dL after contrast.", "Creatinine 1.1 mg/dL at baseline.",
                                 "Vital signs stable, afebrile, eating well.", "Biopsy: grade 2 adenocarcinoma."]),
                min_size=1, max_size=12),
       st.integers(min_value=20, max_value=300))
def test_copies_never_occupy_two_slots_and_every_fragment_is_traced(texts: list[str], window: int) -> None:
    candidates = [candidate(f"n{i}", t, day=1 + i % 20) for i, t in enumerate(texts)]
    result = pack_collapsed(ExactPacker(), candidates, window)
    packed_texts = [p.body for p in result.packed]
    assert len(packed_texts) == len(set(packed_texts)), "one slot per distinct text"
    assert sorted(p.fragment_id for p in result.packed) + sorted(d.fragment_id for d in result.dropped) != []
    traced = {p.fragment_id for p in result.packed} | {d.fragment_id for d in result.dropped}
    assert traced == {c.fragment.id for c in candidates} and result.tokens_used <= window


@settings(max_examples=40, deadline=None)
@given(st.lists(st.frozensets(st.text("abcdef ", min_size=1, max_size=8), max_size=12), max_size=30),
       st.integers(1, 7))
def test_vectorised_minhash_equals_signing_one_set_at_a_time(sets: list[frozenset[str]], batch: int) -> None:
    import zlib

    import numpy as np

    from ebmrag.packing.dedup import _A, _B, _HASHES, _PRIME, _signatures

    def one(items: frozenset[str]) -> tuple[int, ...]:
        if not items:
            return (0,) * _HASHES
        hashes = np.array([zlib.crc32(s.encode()) for s in items], dtype=np.uint64)
        return tuple(int(v) for v in ((hashes[None, :] * _A[:, None] + _B[:, None]) % np.uint64(_PRIME)).min(axis=1))

    assert _signatures(sets, batch) == [one(s) for s in sets]
