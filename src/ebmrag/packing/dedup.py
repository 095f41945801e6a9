"""Copy-forward notes collapsed: near-duplicate fragments take one slot, never several.

Charts repeat themselves (a nursing line copied into every shift note, a history pasted forward), and
without this step every copy competes for the window as if it were new evidence. Two fragments are
copies when their word 3-gram shingles (characters for Chinese) overlap by Jaccard ≥ `threshold` (0.7) AND
they state the same numbers: "K 6.4 mmol/L" and "K 4.1 mmol/L" are different results, never copies.
The copy kept is the most critical (must-keep, then tier), then the newest (a copy dated in the future never
is), then the first in record order; every other copy is dropped with reason `duplicate`, naming the kept one.
Among objective results (T1/T2) a fragment whose shingles lie almost wholly (≥ 90 %) inside a longer one's, numbers
included, is a copy of it too ("Biopsy: adenocarcinoma" inside "Inhibin B raised. Biopsy: adenocarcinoma"),
and the longer one, which says everything the shorter says, is kept.

Candidate pairs come from MinHash with banding (16 hashes, 8 bands of 2), then the exact Jaccard is
checked, so the cost stays near-linear in the number of fragments.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import numpy as np

from ebmrag.packing.types import Candidate, DroppedFragment, DropReason, Packer, PackResult, drop_entry
from ebmrag.protocols import checkpoint

_WORD = re.compile(r"[a-z0-9]+(?:\.[0-9]+)?|[\u4e00-\u9fff]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_PRIME = (1 << 61) - 1
_HASHES, _BANDS = 16, 8
_rng = np.random.default_rng(20261122)
_A = _rng.integers(1, _PRIME, _HASHES, dtype=np.uint64)
_B = _rng.integers(0, _PRIME, _HASHES, dtype=np.uint64)


def shingles(text: str) -> frozenset[str]:
    words = _WORD.findall(text.lower())
    if len(words) < 3:
        return frozenset(words)
    return frozenset(" ".join(words[i:i + 3]) for i in range(len(words) - 2))


def numbers(text: str) -> tuple[str, ...]:
    return tuple(sorted(n.replace(",", ".") for n in _NUMBER.findall(text)))


def _signatures(sets: Sequence[frozenset[str]], batch: int = 4096) -> list[tuple[int, ...]]:
    """MinHash signature of every shingle set, vectorised over `batch` sets at a time (bounded memory)."""
    return [row for start in range(0, len(sets), batch) for row in _sign_batch(sets[start:start + batch])]


def _sign_batch(sets: Sequence[frozenset[str]]) -> list[tuple[int, ...]]:
    """An empty set signs as zeros."""
    sizes = np.array([len(items) for items in sets])
    hashes = np.fromiter((zlib.crc32(s.encode()) for items in sets for s in items), dtype=np.uint64,
                         count=int(sizes.sum()))
    if not hashes.size:
        return [(0,) * _HASHES for _ in sets]
    # (a·h + b) mod p over uint64: the product may wrap at 2^64, which keeps the family deterministic and
    # well mixed (all that banding needs); it is not a proof-grade universal hash.
    mixed = (hashes[None, :] * _A[:, None] + _B[:, None]) % np.uint64(_PRIME)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    nonempty = sizes > 0
    minima = np.zeros((_HASHES, len(sets)), dtype=np.uint64)
    minima[:, nonempty] = np.minimum.reduceat(mixed, starts[nonempty], axis=1)
    return [tuple(column) for column in minima.T.tolist()]


def _keep_rank(candidate: Candidate) -> tuple[bool, int, bool, datetime, int]:
    """Higher is kept: must-keep, then the more objective tier, then the newest by a trustworthy date, then the
    first in order."""
    stamp = (candidate.fragment.timestamp or datetime.min).replace(tzinfo=None)
    return candidate.must_keep, -candidate.tier.rank, not candidate.fragment.date_in_future, stamp, -candidate.order


def collapse_duplicates(candidates: Sequence[Candidate], threshold: float = 0.7,
                        eligible: Callable[[Candidate], bool] | None = None
                        ) -> tuple[list[Candidate], list[DroppedFragment]]:
    """(the candidates to pack, the copies dropped); `eligible` limits which candidates are compared."""
    pool = [c for c in candidates if eligible is None or eligible(c)]
    if len(pool) < 2:
        return list(candidates), []
    groups: dict[str, list[Candidate]] = defaultdict(list)
    features = {c.fragment.id: (shingles(c.fragment.text), numbers(c.fragment.text)) for c in pool}
    checkpoint()  # between the steps of a large record's comparison: the host may pause or stop the work here
    root = _copy_groups(features, threshold)
    checkpoint()
    for candidate in pool:
        groups[root(candidate.fragment.id)].append(candidate)
    dropped: dict[str, DroppedFragment] = {}
    for members in groups.values():
        kept = max(members, key=_keep_rank)
        for copy in members:
            if copy is not kept:
                detail = f"a near-copy of {kept.fragment.id}, which is considered instead"
                dropped[copy.fragment.id] = replace(drop_entry(copy, DropReason.DUPLICATE, detail),
                                                    duplicate_of=kept.fragment.id)
    survivors = [c for c in pool if c.fragment.id not in dropped and c.tier.compressible]
    checkpoint()
    for copy, whole in _contained(survivors, features):
        if _keep_rank(whole)[:3] >= _keep_rank(copy)[:3]:  # never trade a newer or more critical copy for it
            detail = f"its text lies within {whole.fragment.id}, which is considered instead"
            dropped.setdefault(copy.fragment.id, replace(drop_entry(copy, DropReason.DUPLICATE, detail),
                                                         duplicate_of=whole.fragment.id))
    return [c for c in candidates if c.fragment.id not in dropped], list(dropped.values())


def _contained(pool: Sequence[Candidate], features: Mapping[str, tuple[frozenset[str], tuple[str, ...]]],
               share: float = 0.9) -> list[tuple[Candidate, Candidate]]:
    """(copy, whole) pairs: the copy's shingles and numbers lie (almost) wholly inside a longer whole. Only
    fragments sharing the copy's rarest shingle are compared (an inverted index), so the cost stays near
    linear in the record instead of quadratic."""
    sets = {c.fragment.id: features[c.fragment.id][0] for c in pool}
    nums = {c.fragment.id: Counter(features[c.fragment.id][1]) for c in pool}
    by_id = {c.fragment.id: c for c in pool}
    holders: dict[str, list[str]] = defaultdict(list)
    for fid, items in sets.items():
        for item in items:
            holders[item].append(fid)
    pairs = []
    for small in sorted(pool, key=lambda c: len(sets[c.fragment.id])):
        a = sets[small.fragment.id]
        if not a:
            continue
        rarest = min(a, key=lambda item: len(holders[item]))
        for other in holders[rarest]:
            b = sets[other]
            inside = len(b) > len(a) and len(a & b) >= share * len(a)
            if inside and not nums[small.fragment.id] - nums[other]:
                pairs.append((small, by_id[other]))
                break
    return pairs


def _copy_groups(features: Mapping[str, tuple[frozenset[str], tuple[str, ...]]],
                 threshold: float) -> Callable[[str], str]:
    """Union-find over fragment ids: verbatim copies in one pass, near-copies through MinHash buckets."""
    sets = {fid: items for fid, (items, _) in features.items()}
    nums = {fid: found for fid, (_, found) in features.items()}
    parent = {fid: fid for fid in features}

    def root(fid: str) -> str:
        while parent[fid] != fid:
            parent[fid] = parent[parent[fid]]
            fid = parent[fid]
        return fid

    exact: dict[tuple[frozenset[str], tuple[str, ...]], str] = {}
    unique: list[str] = []
    for fid in parent:
        earlier = exact.setdefault((sets[fid], nums[fid]), fid)
        if earlier != fid and sets[fid]:
            parent[root(fid)] = root(earlier)
        else:
            unique.append(fid)
    buckets: dict[tuple[int, tuple[int, ...], tuple[str, ...]], list[str]] = defaultdict(list)
    rows = _HASHES // _BANDS
    # Near-copies must state the same numbers, so only fragments whose numbers another fragment shares
    # can have one: the rest skip the MinHash pass.
    shared = Counter(nums[fid] for fid in unique)
    unique = [fid for fid in unique if shared[nums[fid]] > 1]
    for fid, signature in zip(unique, _signatures([sets[fid] for fid in unique]), strict=True):
        for band in range(_BANDS):
            buckets[(band, signature[band * rows:(band + 1) * rows], nums[fid])].append(fid)
    for members in buckets.values():
        for i, one in enumerate(members):
            for other in members[i + 1:]:
                a, b = sets[one], sets[other]
                if a and b and len(a & b) / len(a | b) >= threshold:
                    parent[root(other)] = root(one)
    return root


def pack_collapsed(packer: Packer, candidates: Sequence[Candidate], window: int,
                   eligible: Callable[[Candidate], bool] | None = None) -> PackResult:
    """Collapse copies, pack the rest; the copies join the trace's dropped list with their reason."""
    kept, copies = collapse_duplicates(candidates, eligible=eligible)
    result = packer.pack(kept, window)
    return replace(result, dropped=(*result.dropped, *copies))
