"""Tune and check halves of a labelled set, fixed by a hash of each item's group key.

Every rule or model change is tuned on one half and reported once on the other. The half is a pure
function of a key that keeps related items together (a case id, a report's PubMed id, a note id), so
the split needs no stored list and the same item always lands in the same half, whoever runs it.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Half = Literal["tune", "check"]
HALVES: tuple[Half, ...] = ("tune", "check")


def half_of(key: str) -> Half:
    """'tune' or 'check' for a group key (a case id, 'ade:<pmid>', a document id)."""
    value = int(hashlib.sha256(f"ebmrag-half:{key}".encode()).hexdigest(), 16)
    return "tune" if value % 2 == 0 else "check"


def group_key(item_id: str, parts: int = 3) -> str:
    """The document part of a colon-separated item id ('mtsamples:note17:hpi:4' -> 'mtsamples:note17:hpi'),
    as the external corpora's own split groups them."""
    return ":".join(item_id.split(":")[:parts])
