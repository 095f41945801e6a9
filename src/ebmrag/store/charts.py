"""Patient charts as uploads and result feeds write them: the patient row, its fragments in order, results
announced but not yet arrived, and the remembered responses of idempotent writes.

Every statement names the tenant and the patient, and every transaction here is scoped to the tenant
(`transaction(tenant)`); a write is one transaction, so a Bundle is stored whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ebmrag.errors import EbmragError
from ebmrag.records.fragment import Fragment, PatientRecord, parse_timestamp
from ebmrag.store.database import SqlStore, now

REQUEST_DIGEST = "_request_digest"  # kept beside an idempotent response: what the first request carried
IDEMPOTENCY_SCHEME = "sha256:"  # an Idempotency-Key is stored as this and the hex sha256 of the whole key
LEGACY_IDEMPOTENCY_CHARS = 200  # rows from before kept the key as sent, cut to this many characters


class IdempotencyConflictError(EbmragError):
    """An Idempotency-Key reused with a different body."""


def idempotency_digest(idem_key: str) -> str:
    """How an Idempotency-Key is stored and compared: the sha256 of the whole key (UTF-8; a lone surrogate, which a
    header cannot carry, is replaced)."""
    return IDEMPOTENCY_SCHEME + hashlib.sha256(idem_key.encode("utf-8", "replace")).hexdigest()


def _record_digest(record: PatientRecord) -> str:
    rows = sorted((f.id, f.text, f.section or "", f.timestamp.isoformat() if f.timestamp else "", f.source or "",
                   f.encounter or "") for f in record.fragments)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def fragment_to_json(fragment: Fragment) -> str:
    return json.dumps({"id": fragment.id, "text": fragment.text, "section": fragment.section,
                       "timestamp": fragment.timestamp.isoformat() if fragment.timestamp else None,
                       "source": fragment.source, "encounter": fragment.encounter,
                       **({"date_in_future": True} if fragment.date_in_future else {})}, ensure_ascii=False)


def fragment_from_json(body: str, patient: str) -> Fragment:
    raw = json.loads(body)
    return Fragment(raw["id"], patient, raw["text"], raw.get("section"),
                    parse_timestamp(raw.get("timestamp"), f"stored fragment {raw['id']}"), raw.get("source"),
                    encounter=raw.get("encounter"), date_in_future=raw.get("date_in_future") is True)


class PatientCharts(SqlStore):
    """The `patients`, `fragments`, `pending` and `idempotency` tables: a part of PatientStore. Pulled charts
    (`store/pulled.py`) write through `_write_patient` and `_insert` too."""

    def put_record(self, tenant: str, patient: str, record: PatientRecord) -> int:
        """Create or replace: every old fragment goes, the new ones come, in one transaction."""
        with self.transaction(tenant) as cur:
            self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._write_patient(cur, tenant, patient, record)
            self._insert(cur, tenant, patient, record.fragments, 0)
        return len(record.fragments)

    def upsert_fragments(self, tenant: str, patient: str, record: PatientRecord) -> tuple[int, int]:
        """Append new fragments and replace those whose id exists (a FHIR resource sent again): (added,
        replaced). The patient is created when new."""
        with self.transaction(tenant) as cur:
            return self._upsert(cur, tenant, patient, record)

    def _upsert(self, cur: Any, tenant: str, patient: str, record: PatientRecord) -> tuple[int, int]:
        """Cost follows the fragments sent, not the patient's whole record (a results feed appends one at a
        time to charts of thousands)."""
        known: dict[str, int] = {}
        ids = [f.id for f in record.fragments]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._execute(cur, f"SELECT fragment_id, position FROM fragments WHERE tenant = ? AND patient = ? "
                                      f"AND fragment_id IN ({marks})", (tenant, patient, *chunk)).fetchall()
            known.update({r[0]: r[1] for r in rows})
        last = self._execute(cur, "SELECT MAX(position) FROM fragments WHERE tenant = ? AND patient = ?",
                             (tenant, patient)).fetchone()[0]
        self._write_patient(cur, tenant, patient, record)
        fresh = [f for f in record.fragments if f.id not in known]
        for fragment in (f for f in record.fragments if f.id in known):
            self._execute(cur, "UPDATE fragments SET body = ? WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (fragment_to_json(fragment), tenant, patient, fragment.id))
        self._insert(cur, tenant, patient, fresh, (last if last is not None else -1) + 1)
        for fragment in record.fragments:  # an announced result that arrives is no longer pending
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (tenant, patient, fragment.id))
        return len(fresh), len(record.fragments) - len(fresh)

    def _write_patient(self, cur: Any, tenant: str, patient: str, record: PatientRecord) -> None:
        values = (record.origin, json.dumps(list(record.skipped)), now(),
                  json.dumps([list(i) for i in record.identifiers]), tenant, patient)
        if self._execute(cur, "UPDATE patients SET origin = ?, skipped = ?, updated = ?, identifiers = ? WHERE "
                              "tenant = ? AND patient = ?", values).rowcount == 0:
            self._execute(cur, "INSERT INTO patients (origin, skipped, updated, identifiers, tenant, patient) "
                               "VALUES (?, ?, ?, ?, ?, ?)", values)

    def _insert(self, cur: Any, tenant: str, patient: str, fragments: Sequence[Fragment], start: int) -> None:
        for offset, fragment in enumerate(fragments):
            self._execute(cur, "INSERT INTO fragments VALUES (?, ?, ?, ?, ?)",
                          (tenant, patient, fragment.id, start + offset, fragment_to_json(fragment)))

    def record(self, tenant: str, patient: str) -> PatientRecord | None:
        with self.transaction(tenant) as cur:
            head = self._execute(cur, "SELECT skipped, identifiers FROM patients WHERE tenant = ? AND patient = ?",
                                 (tenant, patient)).fetchone()
            if head is None:
                return None
            rows = self._execute(cur, "SELECT body FROM fragments WHERE tenant = ? AND patient = ? ORDER BY position",
                                 (tenant, patient)).fetchall()
        fragments = tuple(fragment_from_json(r[0], patient) for r in rows)
        identifiers = tuple((str(k), str(v)) for k, v in json.loads(head[1]))
        return PatientRecord(patient, fragments, f"store:{tenant}/{patient}", tuple(json.loads(head[0])), identifiers)

    # ------------------------------------------------------------------ results announced, not yet arrived
    def announce(self, tenant: str, patient: str, fragment_id: str, kind: str, producer: str) -> None:
        with self.transaction(tenant) as cur:
            if self._execute(cur, "SELECT 1 FROM fragments WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                             (tenant, patient, fragment_id)).fetchone():
                return  # the result overtook its announcement
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (tenant, patient, fragment_id))
            self._execute(cur, "INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?)",
                          (tenant, patient, fragment_id, kind, producer, now()))

    def pending(self, tenant: str, patient: str) -> list[dict[str, str]]:
        with self.transaction(tenant) as cur:
            rows = self._execute(cur, "SELECT fragment_id, kind, producer, announced FROM pending WHERE tenant = ? "
                                      "AND patient = ? ORDER BY announced", (tenant, patient)).fetchall()
        return [{"id": r[0], "kind": r[1], "producer": r[2], "announced": r[3]} for r in rows]

    # ------------------------------------------------------------------ idempotency
    def upsert_idempotent(self, tenant: str, patient: str, idem_key: str, record: PatientRecord,
                          respond: Any) -> dict[str, Any]:
        """The upsert and its remembered response in one transaction: a retried request with the same key and
        the same fragments gets the first response and writes nothing; the same key with other fragments is an
        IdempotencyConflictError (silently replaying would drop a new result). Writers of one patient take turns,
        so a retry racing its first attempt waits for it and is replayed.

        The key is kept as the sha256 of the whole key (`idempotency_digest`), so keys are compared whole (two
        alike in their first 200 characters never meet) and none is stored as sent. A row written before, under the
        key as sent (at most 200 characters), is still found by that key, and rewritten to the digest then."""
        digest_key = idempotency_digest(idem_key)
        with self.transaction(tenant) as cur:
            self._lock_patient(cur, tenant, patient)
            row = self._idempotent_row(cur, tenant, patient, idem_key, digest_key)
            digest = _record_digest(record)
            if row:
                stored = json.loads(row[0])
                if stored.pop(REQUEST_DIGEST, digest) != digest:
                    raise IdempotencyConflictError(f"the Idempotency-Key {idem_key!r} was used with another body; "
                                                   "nothing was stored (send the new body under a new key)")
                return dict(stored, replayed=True)
            added, replaced = self._upsert(cur, tenant, patient, record)
            response: dict[str, Any] = respond(added, replaced)
            self._execute(cur, "INSERT INTO idempotency VALUES (?, ?, ?, ?)",
                          (tenant, patient, digest_key, json.dumps({**response, REQUEST_DIGEST: digest})))
        return response

    def _idempotent_row(self, cur: Any, tenant: str, patient: str, idem_key: str, digest_key: str) -> Any:
        """The remembered response of `idem_key`: under its digest, else (a row from before digests) under the key
        as sent, which is then rewritten to its digest."""
        where = "FROM idempotency WHERE tenant = ? AND patient = ? AND idem_key = ?"
        row = self._execute(cur, f"SELECT response {where}", (tenant, patient, digest_key)).fetchone()
        if row or idem_key.startswith(IDEMPOTENCY_SCHEME) or len(idem_key) > LEGACY_IDEMPOTENCY_CHARS:
            return row
        row = self._execute(cur, f"SELECT response {where}", (tenant, patient, idem_key)).fetchone()
        if row:
            self._execute(cur, "UPDATE idempotency SET idem_key = ? WHERE tenant = ? AND patient = ? AND "
                               "idem_key = ?", (digest_key, tenant, patient, idem_key))
        return row
