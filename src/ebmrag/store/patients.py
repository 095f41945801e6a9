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
       patients TEXT NOT NULL, digest TEXT NOT NULL, created TEXT NOT NULL, revoked INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, at TEXT NOT NULL, key_id TEXT NOT NULL,
       tenant TEXT NOT NULL, patient TEXT NOT NULL, action TEXT NOT NULL, request_id TEXT NOT NULL,
       fragments TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS pending (tenant TEXT NOT NULL, patient TEXT NOT NULL, fragment_id TEXT NOT NULL,
       kind TEXT NOT NULL, producer TEXT NOT NULL, announced TEXT NOT NULL,
       PRIMARY KEY (tenant, patient, fragment_id))""",
    """CREATE TABLE IF NOT EXISTS idempotency (tenant TEXT NOT NULL, patient TEXT NOT NULL, idem_key TEXT NOT NULL,
       response TEXT NOT NULL, PRIMARY KEY (tenant, patient, idem_key))""",
)


TENANT_TABLES = ("patients", "fragments", "idempotency", "pending")  # rows of patient data: scoped by tenant everywhere
log = logging.getLogger(__name__)


REQUEST_DIGEST = "_request_digest"  # kept beside an idempotent response: what the first request carried


class IdempotencyConflictError(EbmragError):
    """An Idempotency-Key reused with a different body."""


def _record_digest(record: PatientRecord) -> str:
    rows = sorted((f.id, f.text, f.section or "", f.timestamp.isoformat() if f.timestamp else "", f.source or "",
                   f.encounter or "") for f in record.fragments)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


class StoreError(EbmragError):
    """The store cannot be reached or refused a write."""


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    role: str
    patients: tuple[str, ...]  # empty: every patient of the tenant
    digest: str
    created: str
    revoked: bool = False

    def may_see(self, patient: str) -> bool:
        return not self.patients or patient in self.patients


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def fragment_to_json(fragment: Fragment) -> str:
    return json.dumps({"id": fragment.id, "text": fragment.text, "section": fragment.section,
                       "timestamp": fragment.timestamp.isoformat() if fragment.timestamp else None,
                       "source": fragment.source, "encounter": fragment.encounter}, ensure_ascii=False)


def fragment_from_json(body: str, patient: str) -> Fragment:
    raw = json.loads(body)
    return Fragment(raw["id"], patient, raw["text"], raw.get("section"),
                    parse_timestamp(raw.get("timestamp"), f"stored fragment {raw['id']}"), raw.get("source"),
                    encounter=raw.get("encounter"))


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
            self._execute(cur, "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, 0)",
                          (key.key_id, key.tenant, key.role, json.dumps(list(key.patients)), key.digest, key.created))

    def key(self, key_id: str) -> ApiKey | None:
        with self.transaction() as cur:
            row = self._execute(cur, "SELECT key_id, tenant, role, patients, digest, created, revoked FROM api_keys "
                                     "WHERE key_id = ?", (key_id,)).fetchone()
        return _key(row) if row else None

    def keys(self, tenant: str | None = None) -> list[ApiKey]:
        query = "SELECT key_id, tenant, role, patients, digest, created, revoked FROM api_keys"
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
        None when there was no such patient."""
        with self.transaction(tenant) as cur:
            rows = self._execute(cur, "SELECT body FROM fragments WHERE tenant = ? AND patient = ?",
                                 (tenant, patient)).fetchall()
            gone = self._execute(cur, "DELETE FROM patients WHERE tenant = ? AND patient = ?", (tenant, patient))
            if not gone.rowcount:
                return None
            self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM idempotency WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ?", (tenant, patient))
        self.after_erasure()
        return [fragment_from_json(r[0], patient) for r in rows]

    def after_erasure(self) -> None:
        """What the backend does once an erasure has committed so the text leaves its files (SQLite: the WAL)."""

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
        IdempotencyConflictError (silently replaying would drop a new result)."""
        with self.transaction(tenant) as cur:
            row = self._execute(cur, "SELECT response FROM idempotency WHERE tenant = ? AND patient = ? AND "
                                     "idem_key = ?", (tenant, patient, idem_key)).fetchone()
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
                          (tenant, patient, idem_key, json.dumps({**response, REQUEST_DIGEST: digest})))
        return response

    # ------------------------------------------------------------------ audit (see serve.audit)
    def audit_tail(self, cur: Any) -> tuple[int, str]:
        row = self._execute(cur, "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), str(row[1])) if row else (0, "")

    def audit_rows(self) -> list[tuple[Any, ...]]:
        with self.transaction() as cur:
            return list(self._execute(cur, "SELECT seq, at, key_id, tenant, patient, action, request_id, fragments, "
                                           "prev, hash FROM audit ORDER BY seq").fetchall())


def _key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4], row[5], bool(row[6]))


class SQLiteStore(PatientStore):
    """One SQLite file (WAL) in the data directory; one connection shared under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = private_sqlite(path)
        self._db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.RLock()
        self.setup()

    def after_erasure(self) -> None:
        with self._lock:
            scrub(self._db)

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

    def __init__(self, url: str, schema: str = "ebmrag") -> None:
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

    def drop(self) -> None:
        """Remove this schema and everything in it (tests)."""
        with self.transaction() as cur:
            cur.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


def _without_password(url: str) -> str:
    head, at, tail = url.rpartition("@")
    return f"{head.split(':')[0]}:…@{tail}" if at and ":" in head.split("//")[-1] else url


def open_store(data_dir: Path, url: str = "") -> PatientStore:
    """`url` empty: SQLite in the data directory; else a postgresql:// URL."""
    if not url:
        return SQLiteStore(data_dir / "store.sqlite")
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    raise ConfigError(f"[store] url must be empty (SQLite) or postgresql://…, got {url.split(':')[0]}://…")
