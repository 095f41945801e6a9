"""The SQL of the access log's tables (`audit`, `audit_head`); the chain itself, its keys and its checks are
`store/audit.py`, which calls these inside its own transaction (the entry and the signed head in one).

The log spans tenants (one chain per store), so these statements are not tenant-scoped; an entry names
fragment ids, never record text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ebmrag.store.database import SqlStore

AUDIT_COLUMNS = "seq, at, key_id, tenant, patient, action, request_id, fragments, prev, hash, scheme"


class AuditTable(SqlStore):
    """The `audit` and `audit_head` tables: a part of PatientStore."""

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
