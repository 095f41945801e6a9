"""The patient store behind `ebmrag serve`: one interface, SQLite (embedded, the default) or PostgreSQL.

Isolation lives here, not in the handlers: every method that reads or writes patient data takes the
tenant and the patient, and every SQL statement is scoped by both. A patient is stored under the id of
its URL (`/v1/patients/{pid}`) within its tenant; the record's own patient id (a FHIR `Patient/…`) is
rewritten to it, so two tenants may each hold a "p1" that never meet. Writes are one transaction: a
Bundle is stored whole or not at all, and a crash leaves the previous state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError, EbmragError
from ebmrag.kvcache import private_sqlite, scrub
from ebmrag.records.fragment import Fragment, PatientRecord, parse_timestamp

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tenants (tenant TEXT PRIMARY KEY, created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS patients (tenant TEXT NOT NULL, patient TEXT NOT NULL, origin TEXT NOT NULL,
       skipped TEXT NOT NULL, updated TEXT NOT NULL, identifiers TEXT NOT NULL DEFAULT '[]',
       PRIMARY KEY (tenant, patient))""",
    """CREATE TABLE IF NOT EXISTS fragments (tenant TEXT NOT NULL, patient TEXT NOT NULL, fragment_id TEXT NOT NULL,
       position INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (tenant, patient, fragment_id))""",
    """CREATE INDEX IF NOT EXISTS fragments_in_order ON fragments (tenant, patient, position)""",
    """CREATE TABLE IF NOT EXISTS api_keys (key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, role TEXT NOT NULL,
       patients TEXT NOT NULL, digest TEXT NOT NULL, created TEXT NOT NULL, revoked INTEGER NOT NULL DEFAULT 0,
       expires TEXT NOT NULL DEFAULT '')""",
    """CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, at TEXT NOT NULL, key_id TEXT NOT NULL,
       tenant TEXT NOT NULL, patient TEXT NOT NULL, action TEXT NOT NULL, request_id TEXT NOT NULL,
       fragments TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL, scheme TEXT NOT NULL DEFAULT 'sha256')""",
    """CREATE TABLE IF NOT EXISTS audit_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL,
       hash TEXT NOT NULL, keyed_from INTEGER NOT NULL, key_print TEXT NOT NULL, signature TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS pending (tenant TEXT NOT NULL, patient TEXT NOT NULL, fragment_id TEXT NOT NULL,
       kind TEXT NOT NULL, producer TEXT NOT NULL, announced TEXT NOT NULL,
       PRIMARY KEY (tenant, patient, fragment_id))""",
    """CREATE TABLE IF NOT EXISTS idempotency (tenant TEXT NOT NULL, patient TEXT NOT NULL, idem_key TEXT NOT NULL,
       response TEXT NOT NULL, PRIMARY KEY (tenant, patient, idem_key))""",
    """CREATE TABLE IF NOT EXISTS ui_sessions (token_digest TEXT PRIMARY KEY, key_id TEXT NOT NULL,
       created TEXT NOT NULL, expires TEXT NOT NULL, last_seen TEXT NOT NULL)""",  # /ui sign-ins: store/sessions.py
    # Charts pulled from FHIR servers (ehr/pull.py): the raw resources of each source, kept so that a `_since`
    # refresh fetches only what changed, and each source's sync point and the fragment ids its chart gave.
    """CREATE TABLE IF NOT EXISTS ehr_resources (tenant TEXT NOT NULL, patient TEXT NOT NULL, source TEXT NOT NULL,
       resource_type TEXT NOT NULL, resource_id TEXT NOT NULL, version TEXT NOT NULL, body TEXT NOT NULL,
       PRIMARY KEY (tenant, patient, source, resource_type, resource_id))""",
    """CREATE TABLE IF NOT EXISTS ehr_sync (tenant TEXT NOT NULL, patient TEXT NOT NULL, source TEXT NOT NULL,
       since TEXT NOT NULL, pulled TEXT NOT NULL, fragments TEXT NOT NULL, PRIMARY KEY (tenant, patient, source))""",
    # Erasures outlast the pulls begun before them (`erasure_mark`, `put_pulled`): each tenant's erasures are
    # numbered in commit order, and the last number of each erased patient id is kept (no chart data).
    """CREATE TABLE IF NOT EXISTS erasure_seq (tenant TEXT PRIMARY KEY, seq INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS erasures (tenant TEXT NOT NULL, patient TEXT NOT NULL, seq INTEGER NOT NULL,
       erased TEXT NOT NULL, PRIMARY KEY (tenant, patient))""",
)

# Columns added after a release: a store made before them gets them on open (ALTER TABLE ... ADD COLUMN), its old
# rows taking the default (a key without expiry; an audit entry of the unkeyed chain).
ADDED_COLUMNS = (
    ("api_keys", "expires", "TEXT NOT NULL DEFAULT ''"),
    ("audit", "scheme", "TEXT NOT NULL DEFAULT 'sha256'"),
)
AUDIT_KEY_FILE_ENV = "EBMRAG_AUDIT_KEY_FILE"
AUDIT_COLUMNS = "seq, at, key_id, tenant, patient, action, request_id, fragments, prev, hash, scheme"
KEY_COLUMNS = "key_id, tenant, role, patients, digest, created, revoked, expires"

TENANT_TABLES = ("patients", "fragments", "idempotency", "pending",  # rows of patient data: scoped by tenant everywhere
                 "ehr_resources", "ehr_sync", "erasure_seq", "erasures")
log = logging.getLogger(__name__)


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


class StoreError(EbmragError):
    """The store cannot be reached or refused a write."""


class PatientErasedError(EbmragError):
    """The patient was erased after this pull (or export) began: what it fetched is not stored (`put_pulled`)."""

    code = "patient-erased"


class ChartSourceConflictError(EbmragError):
    """A pull would put a second person's chart under one store id: the store patient holds a chart pulled from
    another source (another FHIR server or patient id), or, for a Bulk Data export, a chart from anywhere else.
    Nothing was written; the message names no patient."""

    code = "chart-source-conflict"


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    role: str
    patients: tuple[str, ...]  # empty: every patient of the tenant
    digest: str
    created: str
    revoked: bool = False
    expires: str = ""  # ISO 8601 with its offset; empty: never

    def may_see(self, patient: str) -> bool:
        return not self.patients or patient in self.patients

    def expired(self, moment: datetime | None = None) -> bool:
        if not self.expires:
            return False
        ends = datetime.fromisoformat(self.expires)
        return (ends if ends.tzinfo else ends.replace(tzinfo=UTC)) <= (moment or datetime.now(UTC))


@dataclass(frozen=True)
class PulledResource:
    """One raw FHIR resource as a pull keeps it: by (type, id), with the version it had."""

    resource_type: str
    resource_id: str
    version: str  # meta.versionId, else meta.lastUpdated, else ""
    body: str  # the resource's JSON


@dataclass(frozen=True)
class PulledState:
    """Where a source's last pull of a patient left off."""

    since: str  # the `_since` instant of the next refresh
    pulled: str  # when it was stored
    fragments: tuple[str, ...]  # the fragment ids its chart gave: a later pull replaces these, and only these


@dataclass(frozen=True)
class PulledWrite:
    """What one pull changed in the patient's fragments (and how many raw resources it wrote)."""

    added: int
    changed: int
    removed: int
    unchanged: int
    resources: int


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


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


class PatientStore:
    """The SQL both backends share; subclasses supply a connection and the placeholder style."""

    placeholder = "?"
    backend = "sqlite"

    @contextmanager
    def transaction(self, tenant: str | None = None) -> Iterator[Any]:  # pragma: no cover - backends override
        """`tenant`: the transaction reads and writes that tenant's patient rows only (PostgreSQL enforces it
        with row-level security as well; every statement here also says so in its WHERE clause)."""
        raise NotImplementedError
        yield

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    def _execute(self, cursor: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        return cursor.execute(self._sql(statement), tuple(params))

    def setup(self) -> None:
        with self.transaction() as cur:
            for statement in SCHEMA:
                cur.execute(statement)
            for table, column, definition in ADDED_COLUMNS:
                if column not in self._columns(cur, table):
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN {self._if_not_exists}{column} {definition}")

    _if_not_exists = ""  # PostgreSQL: two processes opening an old store together must not both fail to add

    def _columns(self, cur: Any, table: str) -> set[str]:  # pragma: no cover - backends override
        raise NotImplementedError

    def ping(self) -> None:
        with self.transaction() as cur:
            self._execute(cur, "SELECT 1")

    # ------------------------------------------------------------------ tenants and keys
    def ensure_tenant(self, tenant: str) -> None:
        with self.transaction() as cur:
            if not self._execute(cur, "SELECT 1 FROM tenants WHERE tenant = ?", (tenant,)).fetchone():
                self._execute(cur, "INSERT INTO tenants VALUES (?, ?)", (tenant, now()))

    def tenant_exists(self, tenant: str) -> bool:
        with self.transaction() as cur:
            return self._execute(cur, "SELECT 1 FROM tenants WHERE tenant = ?", (tenant,)).fetchone() is not None

    def add_key(self, key: ApiKey) -> None:
        self.ensure_tenant(key.tenant)
        with self.transaction() as cur:
            self._insert_key(cur, key)

    def _insert_key(self, cur: Any, key: ApiKey) -> None:
        self._execute(cur, f"INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 0, ?)",
                      (key.key_id, key.tenant, key.role, json.dumps(list(key.patients)), key.digest, key.created,
                       key.expires))

    def rotate_key(self, old: ApiKey, new: ApiKey, old_expires: str) -> None:
        """The new key and the old one's shortened life in one transaction: never two keys without an end, never
        the old one cut short without its successor stored."""
        with self.transaction() as cur:
            self._insert_key(cur, new)
            self._execute(cur, "UPDATE api_keys SET expires = ? WHERE key_id = ?", (old_expires, old.key_id))

    def key(self, key_id: str) -> ApiKey | None:
        with self.transaction() as cur:
            row = self._execute(cur, f"SELECT {KEY_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return _key(row) if row else None

    def keys(self, tenant: str | None = None) -> list[ApiKey]:
        query = f"SELECT {KEY_COLUMNS} FROM api_keys"
        with self.transaction() as cur:
            rows = self._execute(cur, query + (" WHERE tenant = ?" if tenant else "") + " ORDER BY created",
                                 (tenant,) if tenant else ()).fetchall()
        return [_key(r) for r in rows]

    def revoke(self, key_id: str) -> bool:
        with self.transaction() as cur:
            return bool(self._execute(cur, "UPDATE api_keys SET revoked = 1 WHERE key_id = ?", (key_id,)).rowcount)

    # ------------------------------------------------------------------ patients
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

    def delete_patient(self, tenant: str, patient: str) -> list[Fragment] | None:
        """Erase the patient; returns the erased fragments (the caller forgets what caches hold of them), or
        None when there was no such patient. Either way the erasure is numbered (`erasure_mark`): a pull of this
        patient begun before it stores nothing, in any process (even a first pull, of a patient not stored yet)."""
        with self.transaction(tenant) as cur:
            self._lock_patient(cur, tenant, patient)  # after a pull's write of this patient, or before it
            self._tombstone(cur, tenant, patient)
            rows = self._execute(cur, "SELECT body FROM fragments WHERE tenant = ? AND patient = ?",
                                 (tenant, patient)).fetchall()
            gone = self._execute(cur, "DELETE FROM patients WHERE tenant = ? AND patient = ?", (tenant, patient))
            if not gone.rowcount:
                return None
            self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM idempotency WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM ehr_resources WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM ehr_sync WHERE tenant = ? AND patient = ?", (tenant, patient))
        self.after_erasure()
        return [fragment_from_json(r[0], patient) for r in rows]

    def after_erasure(self) -> None:
        """What the backend does once an erasure has committed so the text leaves its files (SQLite: the WAL)."""

    def _tombstone(self, cur: Any, tenant: str, patient: str) -> None:
        """The tenant's next erasure number, kept as the patient's last. The counter's row stays locked until this
        transaction commits, so the numbers follow commit order: an erasure that commits after `erasure_mark` was
        read always has a higher number than the mark."""
        self._execute(cur, "INSERT INTO erasure_seq VALUES (?, 0) ON CONFLICT (tenant) DO NOTHING", (tenant,))
        self._execute(cur, "UPDATE erasure_seq SET seq = seq + 1 WHERE tenant = ?", (tenant,))
        seq = self._execute(cur, "SELECT seq FROM erasure_seq WHERE tenant = ?", (tenant,)).fetchone()[0]
        self._execute(cur, "DELETE FROM erasures WHERE tenant = ? AND patient = ?", (tenant, patient))
        self._execute(cur, "INSERT INTO erasures VALUES (?, ?, ?, ?)", (tenant, patient, seq, now()))

    def erasure_mark(self, tenant: str) -> int:
        """The number of the tenant's last committed erasure: read when a pull or an export begins, and handed to
        `put_pulled`, which refuses a patient erased after it."""
        with self.transaction(tenant) as cur:
            row = self._execute(cur, "SELECT seq FROM erasure_seq WHERE tenant = ?", (tenant,)).fetchone()
        return int(row[0]) if row else 0

    def _check_not_erased(self, cur: Any, tenant: str, patient: str, mark: int | None) -> None:
        if mark is None:
            return
        row = self._execute(cur, "SELECT seq FROM erasures WHERE tenant = ? AND patient = ?",
                            (tenant, patient)).fetchone()
        if row and int(row[0]) > mark:
            raise PatientErasedError("the patient was erased while this pull ran; nothing it fetched was stored "
                                     "(pull again to store the chart anew)")

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

    # ------------------------------------------------------------------ charts pulled from FHIR servers (ehr/)
    def pulled_state(self, tenant: str, patient: str, source: str) -> PulledState | None:
        with self.transaction(tenant) as cur:
            row = self._execute(cur, "SELECT since, pulled, fragments FROM ehr_sync WHERE tenant = ? AND patient = ? "
                                     "AND source = ?", (tenant, patient, source)).fetchone()
        return PulledState(row[0], row[1], tuple(json.loads(row[2]))) if row else None

    def pulled_resources(self, tenant: str, patient: str, source: str) -> list[str]:
        """The kept resources' JSON, in (type, id) order."""
        with self.transaction(tenant) as cur:
            rows = self._execute(cur, "SELECT body FROM ehr_resources WHERE tenant = ? AND patient = ? AND source = ? "
                                      "ORDER BY resource_type, resource_id", (tenant, patient, source)).fetchall()
        return [str(r[0]) for r in rows]

    def pulled_sources(self, tenant: str, patient: str) -> list[str]:
        """The sources the patient's pulled charts came from (one at most, since `put_pulled` keeps it so)."""
        with self.transaction(tenant) as cur:
            rows = self._execute(cur, "SELECT source FROM ehr_sync WHERE tenant = ? AND patient = ? ORDER BY source",
                                 (tenant, patient)).fetchall()
        return [str(r[0]) for r in rows]

    def put_pulled(self, tenant: str, patient: str, source: str, record: PatientRecord,
                   resources: Sequence[PulledResource], since: str, replace_all: bool, *,
                   replace_source: bool = False, require_free: bool = False,
                   erased_after: int | None = None) -> PulledWrite:
        """One pull stored whole or not at all: the raw resources (`replace_all`: they are all the source holds
        now; else they are what changed), the sync point, and the chart. The chart replaces the fragments this
        source's last pull gave; fragments from elsewhere (an upload, a result feed) stay, and a fragment whose
        text did not change is not rewritten, so the preparation after the write computes only what is new. The
        pulled fragments come first, in the chart's order (a refreshed chart packs as a fresh read of it would).

        A store patient holds one pulled source at most: a pull from another source is a
        ChartSourceConflictError unless `replace_source`, which erases the other source's resources, sync state
        and fragments in this transaction. `require_free` (a Bulk Data export, which names no store id itself):
        the patient must not exist yet, or hold this source already. `erased_after`: the `erasure_mark` read when
        the pull began; a patient erased since is a PatientErasedError, nothing written (an erasure outlasts the
        pulls begun before it, whichever process runs them)."""
        with self.transaction(tenant) as cur:
            self._lock_patient(cur, tenant, patient)
            self._check_not_erased(cur, tenant, patient, erased_after)
            erased = self._bind_source(cur, tenant, patient, source, replace_source, require_free)
            if replace_all:
                self._execute(cur, "DELETE FROM ehr_resources WHERE tenant = ? AND patient = ? AND source = ?",
                              (tenant, patient, source))
            for resource in resources:
                self._execute(cur, "DELETE FROM ehr_resources WHERE tenant = ? AND patient = ? AND source = ? AND "
                                   "resource_type = ? AND resource_id = ?",
                              (tenant, patient, source, resource.resource_type, resource.resource_id))
                self._execute(cur, "INSERT INTO ehr_resources VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (tenant, patient, source, resource.resource_type, resource.resource_id,
                               resource.version, resource.body))
            row = self._execute(cur, "SELECT fragments FROM ehr_sync WHERE tenant = ? AND patient = ? AND source = ?",
                                (tenant, patient, source)).fetchone()
            before = set(json.loads(row[0])) if row else set()
            counts = self._replace_pulled_fragments(cur, tenant, patient, record, before)
            self._execute(cur, "DELETE FROM ehr_sync WHERE tenant = ? AND patient = ? AND source = ?",
                          (tenant, patient, source))
            self._execute(cur, "INSERT INTO ehr_sync VALUES (?, ?, ?, ?, ?, ?)",
                          (tenant, patient, source, since, now(), json.dumps([f.id for f in record.fragments])))
        added, changed, removed, unchanged = counts
        return PulledWrite(added, changed, removed + erased, unchanged, len(resources))

    def _lock_patient(self, cur: Any, tenant: str, patient: str) -> None:
        """Serialise writers of one patient across processes (SQLite's BEGIN IMMEDIATE already does)."""

    def _bind_source(self, cur: Any, tenant: str, patient: str, source: str, replace_source: bool,
                     require_free: bool) -> int:
        """Check (and with `replace_source` clear) the patient's other pulled sources; returns how many of their
        fragments were erased."""
        rows = self._execute(cur, "SELECT source, fragments FROM ehr_sync WHERE tenant = ? AND patient = ?",
                             (tenant, patient)).fetchall()
        others = [(str(r[0]), json.loads(r[1])) for r in rows if str(r[0]) != source]
        if require_free and len(others) == len(rows) and self._execute(
                cur, "SELECT 1 FROM patients WHERE tenant = ? AND patient = ?", (tenant, patient)).fetchone():
            raise ChartSourceConflictError("the patient id already holds a chart from elsewhere (an upload or "
                                           "another source); not stored")
        if others and not replace_source:
            raise ChartSourceConflictError("the patient already holds a chart pulled from another source (another "
                                           "FHIR server or patient id); nothing stored (replace erases that chart "
                                           "and stores this one)")
        erased = 0
        for other, fragment_ids in others:
            for fragment_id in fragment_ids:
                erased += self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ? AND "
                                             "fragment_id = ?", (tenant, patient, fragment_id)).rowcount
            for table in ("ehr_resources", "ehr_sync"):
                self._execute(cur, f"DELETE FROM {table} WHERE tenant = ? AND patient = ? AND source = ?",
                              (tenant, patient, other))
        return erased

    def _replace_pulled_fragments(self, cur: Any, tenant: str, patient: str, record: PatientRecord,
                                  before: set[str]) -> tuple[int, int, int, int]:
        """(added, changed, removed, unchanged): rows written only where the fragment is new or its body differs."""
        stored: dict[str, str] = {}
        ids = [f.id for f in record.fragments] + sorted(before)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows = self._execute(cur, f"SELECT fragment_id, body FROM fragments WHERE tenant = ? AND patient = ? AND "
                                      f"fragment_id IN ({','.join('?' * len(chunk))})",
                                 (tenant, patient, *chunk)).fetchall()
            stored.update({str(r[0]): str(r[1]) for r in rows})
        gone = sorted(i for i in before if i in stored and i not in {f.id for f in record.fragments})
        for fragment_id in gone:
            self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (tenant, patient, fragment_id))
        self._write_patient(cur, tenant, patient, record)
        fresh, changed, unchanged = [], 0, 0
        for fragment in record.fragments:
            body = fragment_to_json(fragment)
            if fragment.id not in stored:
                fresh.append(fragment)
            elif stored[fragment.id] != body:
                changed += 1
                self._execute(cur, "UPDATE fragments SET body = ? WHERE tenant = ? AND patient = ? AND "
                                   "fragment_id = ?", (body, tenant, patient, fragment.id))
            else:
                unchanged += 1
        last = self._execute(cur, "SELECT MAX(position) FROM fragments WHERE tenant = ? AND patient = ?",
                             (tenant, patient)).fetchone()[0]
        self._insert(cur, tenant, patient, fresh, (last if last is not None else -1) + 1)
        for fragment in fresh:  # an announced result that arrives is no longer pending
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (tenant, patient, fragment.id))
        self._reorder(cur, tenant, patient, [f.id for f in record.fragments])
        return len(fresh), changed, len(gone), unchanged

    def _reorder(self, cur: Any, tenant: str, patient: str, first: Sequence[str]) -> None:
        """Positions as a fresh read of the chart would give them: `first` (the pulled chart, in its order), then
        the other fragments in their order; only rows whose position moves are written."""
        rows = self._execute(cur, "SELECT fragment_id, position FROM fragments WHERE tenant = ? AND patient = ? "
                                  "ORDER BY position", (tenant, patient)).fetchall()
        leading = set(first)
        wanted = [*first, *(str(r[0]) for r in rows if str(r[0]) not in leading)]
        now_at = {str(r[0]): int(r[1]) for r in rows}
        for position, fragment_id in enumerate(wanted):
            if now_at.get(fragment_id) != position:
                self._execute(cur, "UPDATE fragments SET position = ? WHERE tenant = ? AND patient = ? AND "
                                   "fragment_id = ?", (position, tenant, patient, fragment_id))

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

    # ------------------------------------------------------------------ audit (see store.audit)
    audit_key_file: Path | None = None  # the audit chain's secret: outside the database, never in it
    audit_head_file: Path | None = None  # the chain's last entry, mirrored out of the database's reach

    def audit_tail(self, cur: Any) -> tuple[int, str]:
        row = self._execute(cur, "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), str(row[1])) if row else (0, "")

    def audit_first_keyed(self, cur: Any) -> int | None:
        row = self._execute(cur, "SELECT MIN(seq) FROM audit WHERE scheme = 'hmac-sha256'").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def audit_head(self, cur: Any) -> tuple[Any, ...] | None:
        """The signed head: (seq, hash, keyed_from, key_print, signature), or None before the keyed chain."""
        row = self._execute(cur, "SELECT seq, hash, keyed_from, key_print, signature FROM audit_head "
                                 "WHERE id = 1").fetchone()
        return tuple(row) if row else None

    def set_audit_head(self, cur: Any, head: Sequence[Any]) -> None:
        if not self._execute(cur, "UPDATE audit_head SET seq = ?, hash = ?, keyed_from = ?, key_print = ?, "
                                  "signature = ? WHERE id = 1", tuple(head)).rowcount:
            self._execute(cur, "INSERT INTO audit_head (id, seq, hash, keyed_from, key_print, signature) "
                               "VALUES (1, ?, ?, ?, ?, ?)", tuple(head))

    def insert_audit_row(self, cur: Any, row: Sequence[Any]) -> None:
        self._execute(cur, f"INSERT INTO audit ({AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def audit_rows(self) -> list[tuple[Any, ...]]:
        """Every entry in order: the columns of AUDIT_COLUMNS (the scheme last)."""
        return self.audit_snapshot()[0]

    def audit_snapshot(self) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]:
        """The entries and the signed head as of one moment (a concurrent append must not look like a removed
        or an unsigned tail)."""
        with self.transaction() as cur:
            self._one_snapshot(cur)
            head = self.audit_head(cur)
            rows = self._execute(cur, f"SELECT {AUDIT_COLUMNS} FROM audit ORDER BY seq").fetchall()
        return [tuple(r) for r in rows], head

    def _one_snapshot(self, cur: Any) -> None:
        """Make the transaction's reads one snapshot (SQLite's are already)."""


def _key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4], row[5], bool(row[6]), row[7] or "")


def _key_file_from_environment() -> Path | None:
    named = os.environ.get(AUDIT_KEY_FILE_ENV, "")
    return Path(named) if named else None


class SQLiteStore(PatientStore):
    """One SQLite file (WAL) in the data directory; one connection shared under a lock."""

    def __init__(self, path: Path, audit_key_file: Path | None = None) -> None:
        """`audit_key_file`: default EBMRAG_AUDIT_KEY_FILE, else `audit.key` beside the database (`audit.head`
        goes beside the database either way)."""
        self.path = path
        self.audit_key_file = audit_key_file or _key_file_from_environment() or path.parent / "audit.key"
        self.audit_head_file = path.parent / "audit.head"
        self._db = private_sqlite(path)
        self._db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.RLock()
        self.setup()

    def after_erasure(self) -> None:
        with self._lock:
            scrub(self._db)

    def _columns(self, cur: Any, table: str) -> set[str]:
        return {str(row[1]) for row in cur.execute(f"PRAGMA table_info({table})").fetchall()}

    @contextmanager
    def transaction(self, tenant: str | None = None) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")


class PostgresStore(PatientStore):
    """PostgreSQL through psycopg 3; `schema` keeps one deployment's (or one test run's) tables apart."""

    placeholder = "%s"
    backend = "postgresql"
    _if_not_exists = "IF NOT EXISTS "

    def __init__(self, url: str, schema: str = "ebmrag", audit_key_file: Path | None = None,
                 audit_head_file: Path | None = None) -> None:
        """`audit_key_file`: default EBMRAG_AUDIT_KEY_FILE; `open_store` gives `audit.key` in the data directory.
        Every process writing to one database must use the same file. `audit_head_file`: default `audit.head`
        beside the key file."""
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigError("a PostgreSQL store needs the serve extra: pip install 'ebmrag[serve]'") from exc
        if not schema.isidentifier():
            raise ConfigError(f"store schema must be an identifier, got {schema!r}")
        try:
            self._db = psycopg.connect(url, autocommit=False)
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach the PostgreSQL store at {_without_password(url)}: {exc}") from None
        self.schema = schema
        self.audit_key_file = audit_key_file or _key_file_from_environment()
        self.audit_head_file = audit_head_file or (self.audit_key_file.with_name("audit.head")
                                                   if self.audit_key_file else None)
        self._lock = threading.RLock()
        with self._lock, self._db.cursor() as cur:
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            cur.execute(f"SET search_path TO {schema}")
            self._db.commit()
        self.setup()
        self.row_security = self._enable_row_security()

    def _enable_row_security(self) -> bool:
        """Patient rows are visible only to a transaction that names their tenant: a policy per table, and
        tenant-scoped transactions run as the unprivileged role `ebmrag_tenant` (a superuser would bypass
        the policies). Without the privilege to set this up, the service runs on its SQL scoping alone
        and says so (`/readyz`)."""
        import psycopg

        try:
            with self.transaction() as cur:
                cur.execute("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ebmrag_tenant') "
                            "THEN CREATE ROLE ebmrag_tenant NOLOGIN; END IF; END $$")
                cur.execute("SELECT pg_has_role(current_user, 'ebmrag_tenant', 'MEMBER')")
                if not cur.fetchone()[0]:
                    cur.execute("GRANT ebmrag_tenant TO current_user")
                cur.execute(f"GRANT USAGE ON SCHEMA {self.schema} TO ebmrag_tenant")
                for table in TENANT_TABLES:
                    cur.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO ebmrag_tenant")
                    cur.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
                    cur.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
                    cur.execute(f"DROP POLICY IF EXISTS tenant_only ON {table}")
                    mine = "tenant = current_setting('ebmrag.tenant', true)"
                    cur.execute(f"CREATE POLICY tenant_only ON {table} USING ({mine}) WITH CHECK ({mine})")
        except psycopg.Error as exc:
            log.warning("PostgreSQL row-level security is off (%s); tenant isolation rests on the SQL scoping",
                        type(exc).__name__)
            return False
        return True

    @contextmanager
    def transaction(self, tenant: str | None = None) -> Iterator[Any]:
        with self._lock:
            try:
                with self._db.cursor() as cur:
                    if tenant is not None and getattr(self, "row_security", False):
                        cur.execute("SET LOCAL ROLE ebmrag_tenant")
                        cur.execute("SELECT set_config('ebmrag.tenant', %s, true)", (tenant,))
                    yield cur
                self._db.commit()
            except BaseException:
                self._db.rollback()
                raise

    def _columns(self, cur: Any, table: str) -> set[str]:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                    "AND table_name = %s", (table,))
        return {str(row[0]) for row in cur.fetchall()}

    def _one_snapshot(self, cur: Any) -> None:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def _lock_patient(self, cur: Any, tenant: str, patient: str) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"ebmrag pulled chart {tenant}/{patient}",))

    def drop(self) -> None:
        """Remove this schema and everything in it (tests), and close the connection: a store dropped is done, and
        one left open until the garbage collector finds it holds one of the server's `max_connections`."""
        with self.transaction() as cur:
            cur.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self._db.close()


def _without_password(url: str) -> str:
    head, at, tail = url.rpartition("@")
    return f"{head.split(':')[0]}:…@{tail}" if at and ":" in head.split("//")[-1] else url


def open_store(data_dir: Path, url: str = "", audit_key_file: str = "") -> PatientStore:
    """`url` empty: SQLite in the data directory; else a postgresql:// URL. The audit chain's key file is
    EBMRAG_AUDIT_KEY_FILE, else `audit_key_file` ([serve] audit_key_file), else `audit.key` in the data directory
    (so the worker processes of one deployment share it, on either backend)."""
    key_file = _key_file_from_environment() or (Path(audit_key_file) if audit_key_file else data_dir / "audit.key")
    if not url:
        return SQLiteStore(data_dir / "store.sqlite", key_file)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url, audit_key_file=key_file, audit_head_file=data_dir / "audit.head")
    raise ConfigError(f"[store] url must be empty (SQLite) or postgresql://…, got {url.split(':')[0]}://…")
