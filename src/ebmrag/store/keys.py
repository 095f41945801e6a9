"""Tenants and their API keys, as the patient store keeps them (`store/access.py` issues and checks keys).

Keys and tenants are not patient data: their transactions name no tenant, and a key is looked up by its
id alone (its row says which tenant it acts for). Only a digest of the key's secret is stored, never the key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ebmrag.store.database import SqlStore, now

KEY_COLUMNS = "key_id, tenant, role, patients, digest, created, revoked, expires"


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


class TenantKeys(SqlStore):
    """The `tenants` and `api_keys` tables: a part of PatientStore."""

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


def _key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4], row[5], bool(row[6]), row[7] or "")
