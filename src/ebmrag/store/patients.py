"""The patient store behind `ebmrag serve`: one interface, SQLite (embedded, the default) or PostgreSQL.

Isolation lives here, not in the handlers: every method that reads or writes patient data takes the
tenant and the patient, and every SQL statement is scoped by both. A patient is stored under the id of
its URL (`/v1/patients/{pid}`) within its tenant; the record's own patient id (a FHIR `Patient/…`) is
rewritten to it, so two tenants may each hold a "p1" that never meet. Writes are one transaction: a
Bundle is stored whole or not at all, and a crash leaves the previous state.

The store is composed of its parts, each a module of `store/` that owns some tables and shares the one
connection (`SqlStore`, `store/database.py`):

- `store/keys.py`: tenants and API keys;
- `store/charts.py`: patients, their fragments, results announced but not arrived, idempotent writes;
- `store/erasures.py`: erasing a patient, and erasures that outlast the pulls begun before them;
- `store/pulled.py`: charts pulled from FHIR servers (raw resources, sync points);
- `store/audit_table.py`: the access log's rows (the chain is `store/audit.py`).
"""

from __future__ import annotations

from pathlib import Path

from ebmrag.errors import ConfigError
from ebmrag.store.audit_table import AuditTable
from ebmrag.store.charts import PatientCharts
from ebmrag.store.database import PostgresConnection, SQLiteConnection, key_file_from_environment
from ebmrag.store.erasures import Erasures
from ebmrag.store.keys import TenantKeys
from ebmrag.store.pulled import PulledCharts


class PatientStore(PulledCharts, PatientCharts, Erasures, TenantKeys, AuditTable):
    """Every part of the store over one connection; the backends below supply it (and the placeholder style)."""


class SQLiteStore(SQLiteConnection, PatientStore):
    """The patient store in one SQLite file (WAL) in the data directory; one connection shared under a lock."""


class PostgresStore(PostgresConnection, PatientStore):
    """The patient store in PostgreSQL through psycopg 3; `schema` keeps one deployment's (or one test run's)
    tables apart."""


def open_store(data_dir: Path, url: str = "", audit_key_file: str = "") -> PatientStore:
    """`url` empty: SQLite in the data directory; else a postgresql:// URL. The audit chain's key file is
    EBMRAG_AUDIT_KEY_FILE, else `audit_key_file` ([serve] audit_key_file), else `audit.key` in the data directory
    (so the worker processes of one deployment share it, on either backend)."""
    key_file = key_file_from_environment() or (Path(audit_key_file) if audit_key_file else data_dir / "audit.key")
    if not url:
        return SQLiteStore(data_dir / "store.sqlite", key_file)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url, audit_key_file=key_file, audit_head_file=data_dir / "audit.head")
    raise ConfigError(f"[store] url must be empty (SQLite) or postgresql://…, got {url.split(':')[0]}://…")
