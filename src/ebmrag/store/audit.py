"""Who saw what: an append-only, hash-chained access log in the patient store.

Each entry names the time, the key, the tenant, the patient, the action, the request id and the fragment
ids disclosed (into a context, to a model, or in a listing) — never any record text. Its hash covers the
entry and the previous entry's hash, so `verify` finds an edited entry (its hash no longer matches), a
removed one (a gap in the sequence, or the next entry's `prev` no longer matches) and a truncated tail
when the caller knows the last hash it saw.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.store.patients import PatientStore, now


@dataclass(frozen=True)
class AuditEntry:
    key_id: str
    tenant: str
    patient: str
    action: str
    request_id: str
    fragments: tuple[str, ...] = ()


def entry_hash(seq: int, at: str, entry: AuditEntry, prev: str) -> str:
    canonical = json.dumps([seq, at, entry.key_id, entry.tenant, entry.patient, entry.action, entry.request_id,
                            list(entry.fragments), prev], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def append(store: PatientStore, entry: AuditEntry) -> str:
    """Add one entry under the store's write lock (SQLite: the database lock; PostgreSQL: a table lock, so
    worker processes never read the same tail); returns its hash."""
    with store.transaction() as cur:
        if store.backend == "postgresql":
            cur.execute("LOCK TABLE audit IN SHARE ROW EXCLUSIVE MODE")
        seq, prev = store.audit_tail(cur)
        at = now()
        digest = entry_hash(seq + 1, at, entry, prev)
        store._execute(cur, "INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (seq + 1, at, entry.key_id, entry.tenant, entry.patient, entry.action, entry.request_id,
                        json.dumps(list(entry.fragments)), prev, digest))
    return digest


def verify(rows: Sequence[Sequence[Any]]) -> list[str]:
    """Problems found in the chain (empty: intact)."""
    problems: list[str] = []
    prev, expected_seq = "", 1
    for row in rows:
        seq, at, key_id, tenant, patient, action, request_id, fragments, stored_prev, stored_hash = row
        entry = AuditEntry(key_id, tenant, patient, action, request_id, tuple(json.loads(fragments)))
        if int(seq) != expected_seq:
            problems.append(f"entry {expected_seq} to {int(seq) - 1} missing (removed)")
        if stored_prev != prev:
            problems.append(f"entry {seq}: does not follow the entry before it (an entry was removed or edited)")
        if entry_hash(int(seq), at, entry, stored_prev) != stored_hash:
            problems.append(f"entry {seq}: its content does not match its hash (edited)")
        prev, expected_seq = stored_hash, int(seq) + 1
    return problems
