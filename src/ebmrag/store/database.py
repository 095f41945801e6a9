"""The patient store's tables and its two backends: SQLite (embedded, the default) or PostgreSQL.

`SqlStore` is what every part of the store (`store/patients.py` lists them) runs its SQL through: one
connection, a transaction per call, and the placeholder style of the backend (statements are written with
"?"). Tenant isolation does not rest on this module: every statement of the parts names the tenant and the
patient itself; PostgreSQL's row-level security, set up here, is a second wall behind that scoping.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError, EbmragError
from ebmrag.kvcache import private_sqlite, scrub

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

TENANT_TABLES = ("patients", "fragments", "idempotency", "pending",  # rows of patient data: scoped by tenant everywhere
                 "ehr_resources", "ehr_sync", "erasure_seq", "erasures")
log = logging.getLogger(__name__)


class StoreError(EbmragError):
    """The store cannot be reached or refused a write."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def key_file_from_environment() -> Path | None:
    """The audit chain's key file named by EBMRAG_AUDIT_KEY_FILE, which wins over any configured one."""
    named = os.environ.get(AUDIT_KEY_FILE_ENV, "")
    return Path(named) if named else None


class SqlStore:
    """The SQL both backends share; subclasses supply a connection and the placeholder style."""

    placeholder = "?"
    backend = "sqlite"
    audit_key_file: Path | None = None  # the audit chain's secret: outside the database, never in it
    audit_head_file: Path | None = None  # the chain's last entry, mirrored out of the database's reach

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

    def _lock_patient(self, cur: Any, tenant: str, patient: str) -> None:
        """Serialise writers of one patient across processes (SQLite's BEGIN IMMEDIATE already does)."""

    def _one_snapshot(self, cur: Any) -> None:
        """Make the transaction's reads one snapshot (SQLite's are already)."""

    def after_erasure(self) -> None:
        """What the backend does once an erasure has committed so the text leaves its files (SQLite: the WAL)."""


class SQLiteConnection(SqlStore):
    """One SQLite file (WAL) in the data directory; one connection shared under a lock."""

    def __init__(self, path: Path, audit_key_file: Path | None = None) -> None:
        """`audit_key_file`: default EBMRAG_AUDIT_KEY_FILE, else `audit.key` beside the database (`audit.head`
        goes beside the database either way)."""
        self.path = path
        self.audit_key_file = audit_key_file or key_file_from_environment() or path.parent / "audit.key"
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


class PostgresConnection(SqlStore):
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
        self.audit_key_file = audit_key_file or key_file_from_environment()
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
