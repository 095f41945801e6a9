"""A content-addressed key → bytes store in one SQLite file: the shared shape of every on-disk cache.

Embedding vectors, tier decisions, compressed states and model replies are pure functions of their
input, so each is cached under sha256(namespace, input). Keys are digests, never patient ids, so a
cache key names no patient; values may hold record text (a compressed state, a reply), which is why
`forget` exists: erasing a patient erases the entries computed from their texts.

Writes are SQLite transactions (WAL): a crash leaves the previous state readable. One connection is
shared by the threads of a process under a lock.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ebmrag.protocols import checkpoint

_BATCH = 500  # SQLite's default limit on bound parameters is 999


def digest(*parts: str) -> str:
    """sha256 over the parts, NUL-separated so ("ab", "c") and ("a", "bc") differ."""
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def private_sqlite(path: Path) -> sqlite3.Connection:
    """A SQLite file only its owner can read (its -wal and -shm files take the same mode), in a folder made
    owner-only when this creates it; deleted rows are overwritten on disk (secure_delete) and the file is in WAL
    mode. Caches and the patient store hold patient text: not for other accounts on the machine."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    if path.exists():  # never open and close a descriptor of a file SQLite may hold: that drops its POSIX locks
        os.chmod(path, 0o600)
    else:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA secure_delete=ON")
    db.execute("PRAGMA journal_mode=WAL")
    return db


def scrub(db: sqlite3.Connection) -> None:
    """After an erasure: copy the WAL into the database and truncate it, so deleted text (already overwritten
    in the database by secure_delete) does not linger in the WAL file."""
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class KeyValueCache:
    """get_many / put_many / forget over one table of (key TEXT, `column` BLOB); `column` keeps the
    files written by earlier versions (vectors.vector, replies.reply) readable."""

    def __init__(self, path: Path, table: str, column: str = "value") -> None:
        if not (table.isidentifier() and column.isidentifier()):
            raise ValueError(f"cache table and column names must be identifiers, got {table!r}, {column!r}")
        self.path, self.table, self.column = path, table, column
        self._db = private_sqlite(path)
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, {column} BLOB NOT NULL)")
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of the keys found; a checkpoint between batches, never while holding the lock (a paused
        reader must not keep another request from the cache)."""
        found: dict[str, bytes] = {}
        for start in range(0, len(keys), _BATCH):
            if start:
                checkpoint()
            chunk = list(keys[start : start + _BATCH])
            marks = ",".join("?" * len(chunk))
            with self._lock:
                rows = self._db.execute(f"SELECT key, {self.column} FROM {self.table} WHERE key IN ({marks})",
                                        chunk).fetchall()
            found.update((key, _bytes(value)) for key, value in rows)
        return found

    def get(self, key: str) -> bytes | None:
        return self.get_many([key]).get(key)

    def put_many(self, items: Mapping[str, bytes]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", list(items.items()))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def forget(self, keys: Iterable[str]) -> int:
        """Delete these keys (overwritten on disk, the WAL truncated); returns how many rows went."""
        rows = [(k,) for k in keys]
        with self._lock:
            before = self._db.total_changes
            self._db.execute("BEGIN")
            try:
                self._db.executemany(f"DELETE FROM {self.table} WHERE key = ?", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            gone = self._db.total_changes - before
            if gone:
                scrub(self._db)
            return gone

    def scan(self) -> list[tuple[str, bytes]]:
        """Every (key, value): for erasure by content, where no key is known (cached model replies)."""
        with self._lock:
            rows = self._db.execute(f"SELECT key, {self.column} FROM {self.table}").fetchall()
        return [(k, _bytes(v)) for k, v in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _bytes(value: bytes | str) -> bytes:
    """Rows written by earlier versions hold TEXT (model replies); new ones hold BLOBs."""
    return value if isinstance(value, bytes) else str(value).encode()
