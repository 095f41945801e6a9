"""A content-addressed key → bytes store in one SQLite file: the shared shape of every on-disk cache.

Embedding vectors, tier decisions, compressed states and model replies are pure functions of their
input, so each is cached under sha256(namespace, input). Keys are digests, never patient ids, so a
cache key names no patient; values may hold record text (a compressed state, a reply), which is why
`forget` exists: erasing a patient erases the entries computed from their texts.

Writes are SQLite transactions (WAL): a crash leaves the previous state readable. One connection is
shared by the threads of a process under a lock.

**A cache is disposable; an erasure is not.** Everything here can be computed again, so a cache never fails the
request that uses it:

- A file that is corrupt ("database disk image is malformed", "file is not a database"), of another format
  (`PRAGMA user_version` other than `CACHE_FORMAT`, or a table of another shape) or unreadable (another account's
  file, an I/O error) is moved aside as `<name>.corrupt-<UTC time>-<pid>` with its -wal, -shm and -journal, in one
  warning line, and a fresh file is opened. Corruption found later, by a read or a write, is handled the same way at
  that moment: the read is a miss, the write is skipped, and the next call uses the fresh file. Each value carries
  its CRC-32, so damage SQLite cannot see (bytes changed inside a row) is a miss too, never a wrong tier or vector.
- A busy file ("database is locked": another process writing, or truncating its WAL after an erasure) is waited
  for `busy_timeout` (0.3 s); then a read is a miss and a write is skipped.
- **Moved-aside files are deleted at once.** They may hold patient text, and nothing would ever erase from them: a
  later `forget` could not reach them, and keeping them "for diagnosis" would keep a chart past its erasure. The
  warning line keeps what diagnosis needs (the file, the error, the size). Leftovers of a process killed between
  the move and the deletion are deleted by the next move or erasure. Only a directory found where the file belongs
  is left aside, not deleted: this code did not make it.
- **An erasure never skips.** `forget` and `scan` (erasure by content) wait for a busy file up to
  `erase_timeout` (30 s) and raise `CacheErasureError` when they cannot finish, never returning a count that
  leaves text behind; a corrupt file met by an erasure is moved aside and deleted, which erases everything in it.

Files are replaced under an exclusive `flock` on `<name>-lock`, and opened under a shared one, so no process pairs a
fresh database with the WAL of the one moved aside; a connection whose path now names another file (another
process replaced it) is closed and opened again before its next use. SQLite sees the move and neither checkpoints
into nor deletes the WAL of the new file when the old connection closes.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import logging
import os
import sqlite3
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import NamedTuple, TypeVar

from ebmrag.protocols import checkpoint

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # PRAGMA user_version: 1 = values carry their CRC-32; 0 = before (adopted); others moved aside
BUSY_TIMEOUT_S = 0.3  # how long a read or write waits for a busy file before it is a miss or skipped
ERASE_TIMEOUT_S = 30.0  # how long an erasure waits for a busy file before it raises
_ERASE_ATTEMPT_S = 1.0  # one attempt of an erasure; the cache's lock is given up between attempts
_REOPEN_AFTER_S = 30.0  # a file that could neither be opened nor moved aside is tried again after this
_BATCH = 500  # SQLite's default limit on bound parameters is 999
_CRC = "crc32"
_SIDE_FILES = ("-wal", "-shm", "-journal")
_T = TypeVar("_T")


def digest(*parts: str) -> str:
    """sha256 over the parts, NUL-separated so ("ab", "c") and ("a", "bc") differ."""
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def private_sqlite(path: Path, timeout: float = 5.0) -> sqlite3.Connection:
    """A SQLite file only its owner can read (its -wal and -shm files take the same mode), in a folder made
    owner-only when this creates it; deleted rows are overwritten on disk (secure_delete) and the file is in WAL
    mode. Caches and the patient store hold patient text: not for other accounts on the machine. `timeout`: how
    long a statement waits for a busy file. Processes starting together may race to create the file and folder."""
    _private_folder(path.parent)
    try:  # O_EXCL: never open and close a descriptor of a file SQLite may hold: that drops its POSIX locks
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    except FileExistsError:
        os.chmod(path, 0o600)
    db = sqlite3.connect(str(path), timeout=timeout, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA secure_delete=ON")
    db.execute("PRAGMA journal_mode=WAL")
    return db


def scrub(db: sqlite3.Connection) -> None:
    """After an erasure: copy the WAL into the database and truncate it, so deleted text (already overwritten
    in the database by secure_delete) does not linger in the WAL file."""
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class CacheErasureError(RuntimeError):
    """An erasure could not reach every copy in a cache file (busy past `erase_timeout`, a file that can be neither
    opened nor moved aside): the caller must not report the erasure done. Retrying it is safe."""


class _Fault(Enum):
    CORRUPT = "corrupt"  # malformed, not a database, another format: moved aside
    UNREADABLE = "unreadable"  # cannot be opened as it is: moved aside when met at open
    BUSY = "busy"  # locked by another connection: waited for, then a miss (an erasure: retried)
    OTHER = "other"  # disk full, a closed connection: a miss or a skipped write


class _OtherFormatError(Exception):
    """The file is a SQLite database of another cache format or table shape."""


def fault_of(exc: BaseException) -> _Fault:
    """What a failure says about the cache file (SQLite's primary result code; its message where there is none)."""
    if isinstance(exc, _OtherFormatError):
        return _Fault.CORRUPT
    if isinstance(exc, OSError):
        return _Fault.UNREADABLE
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc).lower()
    if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or "malformed" in text \
            or "not a database" in text:
        return _Fault.CORRUPT
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in text:
        return _Fault.BUSY
    if primary in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR,
                   sqlite3.SQLITE_AUTH):
        return _Fault.UNREADABLE
    return _Fault.OTHER


class _Failed(NamedTuple):
    """An open that failed: the (device, inode) of the file tried, and why."""

    seen: tuple[int, int] | None
    error: BaseException


class _BusyError(Exception):
    """One attempt of an erasure found the file busy (or could not take the cache's lock)."""


class KeyValueCache:
    """get_many / put_many / forget over one table of (key TEXT, `column` BLOB, crc32 INTEGER); `column` keeps the
    files written by earlier versions (vectors.vector, replies.reply) readable. Several caches may share one file
    (derived.sqlite holds three tables)."""

    def __init__(self, path: Path, table: str, column: str = "value", *, busy_timeout: float = BUSY_TIMEOUT_S,
                 erase_timeout: float = ERASE_TIMEOUT_S) -> None:
        if not (table.isidentifier() and column.isidentifier()) or column in ("key", _CRC):
            raise ValueError(f"cache table and column names must be identifiers other than key and {_CRC}, got "
                             f"{table!r}, {column!r}")
        if busy_timeout <= 0 or erase_timeout <= 0:
            raise ValueError(f"busy_timeout and erase_timeout must be > 0, got {busy_timeout}, {erase_timeout}")
        self.path, self.table, self.column = path, table, column
        self.busy_timeout, self.erase_timeout = busy_timeout, erase_timeout
        self._guard = path.with_name(path.name + "-lock")
        self._db: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file self._db holds
        self._retry_at = 0.0
        self._open_fault: _Fault | None = None  # why the last open gave no connection
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        with self._lock:
            self._connection()

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The values of the keys found; a checkpoint between batches, never while holding the lock (a paused
        reader must not keep another request from the cache). A busy, corrupt or damaged batch is a miss."""
        found: dict[str, bytes] = {}
        for start in range(0, len(keys), _BATCH):
            if start:
                checkpoint()
            rows = self._attempt("read", self._select(list(keys[start : start + _BATCH])))
            found.update((key, value) for key, value in self._checked(rows or []) if value is not None)
        return found

    def _select(self, keys: list[str]) -> Callable[[sqlite3.Connection], list[tuple[str, bytes | str, int | None]]]:
        marks = ",".join("?" * len(keys))
        return lambda db: db.execute(f"SELECT key, {self.column}, {_CRC} FROM {self.table} WHERE key IN ({marks})",
                                     keys).fetchall()

    def get(self, key: str) -> bytes | None:
        return self.get_many([key]).get(key)

    def put_many(self, items: Mapping[str, bytes]) -> None:
        """Store the values; skipped (the next call computes them again) when the file is busy or broken."""
        if not items:
            return
        rows = [(key, value, zlib.crc32(value)) for key, value in items.items()]
        self._attempt("write", lambda db: self._transaction(db, lambda: db.executemany(
            f"INSERT OR REPLACE INTO {self.table} (key, {self.column}, {_CRC}) VALUES (?, ?, ?)", rows)))

    def forget(self, keys: Iterable[str]) -> int:
        """Delete these keys (overwritten on disk, the WAL truncated); returns how many rows went. Raises
        `CacheErasureError` rather than return with text left behind (module doc)."""
        rows = [(k,) for k in keys]
        if not rows:
            return 0

        def delete(db: sqlite3.Connection) -> int:
            before = db.total_changes
            self._transaction(db, lambda: db.executemany(f"DELETE FROM {self.table} WHERE key = ?", rows))
            return db.total_changes - before

        gone = self._erasing(delete, 0)
        self._erasing(_truncate_wal, None)  # always: an earlier erasure's truncation may have been cut short
        return gone

    def scan(self) -> list[tuple[str, bytes | None]]:
        """Every (key, value), None for a value that fails its checksum: for erasure by content, where no key is
        known (cached model replies); an erasure, so it waits for a busy file and raises rather than miss rows."""
        return list(self._checked(self._erasing(
            lambda db: db.execute(f"SELECT key, {self.column}, {_CRC} FROM {self.table}").fetchall(), [])))

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- one operation, its faults survived ------------------------------------------------------------------------

    def _attempt(self, what: str, action: Callable[[sqlite3.Connection], _T]) -> _T | None:
        """`action` on the connection, or None (a miss, a skipped write) when the cache is busy or broken."""
        if not self._lock.acquire(timeout=self.busy_timeout):
            return None
        try:
            db = self._connection()
            if db is None:
                return None
            try:
                return action(db)
            except sqlite3.Error as exc:
                self._survive(exc, what)
                return None
        finally:
            self._lock.release()

    def _erasing(self, action: Callable[[sqlite3.Connection], _T], emptied: _T) -> _T:
        """`action` on the connection, retried while the file is busy until `erase_timeout`; `emptied` when the
        file turned out corrupt and was deleted (nothing of anyone is left in it)."""
        deadline = time.monotonic() + self.erase_timeout
        while True:
            try:
                return self._erase_once(action, emptied, deadline)
            except _BusyError:
                if time.monotonic() >= deadline:
                    raise CacheErasureError(f"cache {self.path.name} stayed busy for {self.erase_timeout:g} s; "
                                            "the erasure did not finish") from None
                time.sleep(0.01)  # let another thread of this process in between attempts

    def _erase_once(self, action: Callable[[sqlite3.Connection], _T], emptied: _T, deadline: float) -> _T:
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise _BusyError
        try:
            self._sweep(strict=True)
            db = self._connection(erasing=True)
            if db is None:
                if not os.path.lexists(self.path):
                    return emptied  # no file: nothing to erase
                raise _BusyError if self._open_fault is _Fault.BUSY else CacheErasureError(
                    f"cache {self.path.name} can be neither opened nor moved aside; the erasure did not finish")
            try:
                db.execute(f"PRAGMA busy_timeout = {int(min(_ERASE_ATTEMPT_S, self.erase_timeout) * 1000)}")
                return action(db)
            except sqlite3.Error as exc:
                fault = fault_of(exc)
                if fault is _Fault.BUSY:
                    raise _BusyError from exc
                if fault is _Fault.CORRUPT and self._discard(self._identity, str(exc)):
                    return emptied
                raise CacheErasureError(f"cache {self.path.name} failed during an erasure: {exc}") from exc
            finally:
                with contextlib.suppress(sqlite3.Error):
                    if self._db is db:
                        db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        finally:
            self._lock.release()

    def _survive(self, exc: sqlite3.Error, what: str) -> None:
        fault = fault_of(exc)
        if fault is _Fault.CORRUPT:
            self._discard(self._identity, str(exc))
        elif fault is _Fault.BUSY:
            log.debug("cache %s busy: %s skipped", self.path.name, what)
        else:
            self._warn_once(f"{what}:{fault.value}", "cache %s: a %s failed (%s); going on without it",
                            self.path.name, what, exc)

    def _transaction(self, db: sqlite3.Connection, body: Callable[[], object]) -> None:
        """`body` in a write transaction taken at once (BEGIN IMMEDIATE waits on the busy timeout, where a
        deferred one can fail at its first write without waiting)."""
        db.execute("BEGIN IMMEDIATE")
        try:
            body()
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                if db.in_transaction:
                    db.execute("ROLLBACK")
            raise

    def _checked(self, rows: Iterable[tuple[str, bytes | str, int | None]]) -> Iterator[tuple[str, bytes | None]]:
        """(key, value), None for a value whose CRC-32 does not match (rows from before checksums have none)."""
        damaged = 0
        for key, value, crc in rows:
            data = _bytes(value)
            if crc is not None and zlib.crc32(data) != crc:
                damaged += 1
                yield key, None
            else:
                yield key, data
        if damaged:
            self._warn_once("damaged", "cache %s: %d values fail their checksum; computed again", self.path.name,
                            damaged)

    # -- the file: opened, checked, replaced -----------------------------------------------------------------------

    def _connection(self, erasing: bool = False) -> sqlite3.Connection | None:
        """The open connection, reopened when the path names another file now (replaced by another process or
        another cache of the same file); None while the file is busy or unusable."""
        if self._db is not None:
            if _identity(self.path) == self._identity:
                return self._db
            self._close()
        if not erasing and time.monotonic() < self._retry_at:
            return None
        return self._open()

    def _open(self) -> sqlite3.Connection | None:
        """Open and check the file; a corrupt, other-format or unreadable one is moved aside and a fresh one
        opened (once)."""
        for _ in range(2):
            try:
                opened = self._try_open()
            except OSError as exc:  # the lock file itself: a folder this account cannot write
                opened = _Failed(None, exc)
            if isinstance(opened, sqlite3.Connection):
                return opened
            fault = self._open_fault = fault_of(opened.error)
            if fault is _Fault.BUSY:
                return None
            if fault is _Fault.OTHER or not self._discard(opened.seen, str(opened.error) or
                                                          type(opened.error).__name__):
                break
        self._retry_at = time.monotonic() + _REOPEN_AFTER_S
        return None

    def _try_open(self) -> sqlite3.Connection | _Failed:
        """The connection, or why not with the identity of the file that failed: under the shared lock, so no
        other process replaces the file between the two."""
        with _flock(self._guard, fcntl.LOCK_SH):
            try:
                db = self._connect()
            except (sqlite3.Error, OSError, _OtherFormatError) as exc:
                return _Failed(_identity(self.path), exc)
            self._db, self._identity, self._retry_at, self._open_fault = db, _identity(self.path), 0.0, None
            return db

    def _connect(self) -> sqlite3.Connection:
        if os.path.lexists(self.path) and not stat.S_ISREG(os.lstat(self.path).st_mode):
            raise IsADirectoryError(f"{self.path.name} is not a regular file")
        db = private_sqlite(self.path, timeout=self.busy_timeout)
        try:
            self._adopt(db)
        except BaseException:
            db.close()
            raise
        return db

    def _adopt(self, db: sqlite3.Connection) -> None:
        """Check the format; create the table, or give a table from before checksums its column (CACHE_FORMAT 0),
        in one write transaction, so processes opening one file together agree."""
        if self._format(db) == CACHE_FORMAT and self._columns(db) >= {"key", self.column, _CRC}:
            return

        def create_or_migrate() -> None:
            version, columns = self._format(db), self._columns(db)
            if not columns:
                db.execute(f"CREATE TABLE {self.table} (key TEXT PRIMARY KEY, {self.column} BLOB NOT NULL, "
                           f"{_CRC} INTEGER)")
            elif not columns >= {"key", self.column}:
                raise _OtherFormatError(f"table {self.table} has columns {sorted(columns)}")
            elif _CRC not in columns:
                db.execute(f"ALTER TABLE {self.table} ADD COLUMN {_CRC} INTEGER")
            if version != CACHE_FORMAT:
                db.execute(f"PRAGMA user_version = {CACHE_FORMAT}")

        self._transaction(db, create_or_migrate)

    def _format(self, db: sqlite3.Connection) -> int:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version not in (0, CACHE_FORMAT):
            raise _OtherFormatError(f"cache format {version}, this ebmrag writes {CACHE_FORMAT}")
        return version

    def _columns(self, db: sqlite3.Connection) -> set[str]:
        return {row[1] for row in db.execute(f"PRAGMA table_info({self.table})")}

    def _discard(self, seen: tuple[int, int] | None, reason: str) -> bool:
        """Move the file found unusable (`seen`) aside with its side files and delete them (module doc); one
        warning line. True when that file is gone (or another process replaced it already)."""
        try:
            with _flock(self._guard, fcntl.LOCK_EX):
                current = _identity(self.path)
                if current != seen:
                    return True
                if current is None:
                    raise FileNotFoundError(f"no {self.path.name} to move: the folder is what fails")
                size = os.lstat(self.path).st_size if os.path.lexists(self.path) else 0
                stamp = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
                for suffix in ("", *_SIDE_FILES):
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(f"{self.path}{suffix}", f"{self.path}.corrupt-{stamp}{suffix}")
            self._close()  # after the move: SQLite sees it and leaves the new file's WAL alone
            self._sweep(strict=False)
        except OSError as exc:
            self._warn_once("discard", "cache %s is unusable (%s) and could not be moved aside (%s); going on "
                            "without it", self.path.name, reason, exc)
            return False
        log.warning("cache %s was unusable (%s; %d bytes): moved aside and deleted, starting empty", self.path.name,
                    reason, size)
        return True

    def _sweep(self, strict: bool) -> None:
        """Delete moved-aside copies of this file (they may hold patient text); `strict`: an erasure, which must
        not finish with one left."""
        for leftover in self.path.parent.glob(f"{glob.escape(self.path.name)}.corrupt-*"):
            try:
                if leftover.is_dir() and not leftover.is_symlink():
                    continue  # a folder found where the file belongs: not ours to delete
                leftover.unlink(missing_ok=True)
            except OSError as exc:
                if strict:
                    raise CacheErasureError(f"a moved-aside copy of cache {self.path.name} could not be deleted: "
                                            f"{exc}") from exc
                self._warn_once("sweep", "cache %s: a moved-aside copy could not be deleted (%s)", self.path.name,
                                exc)

    def _close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db, self._identity = None, None

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        """A warning the first time per cache and kind, debug after: a full disk must not flood the log."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        log.log(level, message, *args)


def _truncate_wal(db: sqlite3.Connection) -> None:
    """`scrub`, checked: a checkpoint that could not truncate (a reader still on the WAL) is busy, retried."""
    busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    if busy:
        raise sqlite3.OperationalError("database is locked: the WAL could not be truncated yet")


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, None when there is none: a replaced file has another."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _private_folder(folder: Path) -> None:
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700, exist_ok=True)


@contextlib.contextmanager
def _flock(guard: Path, mode: int) -> Iterator[None]:
    """An flock on the cache's lock file (never on the database: closing a descriptor of it would drop SQLite's
    own POSIX locks)."""
    _private_folder(guard.parent)
    try:
        fd = os.open(guard, os.O_CREAT | os.O_RDWR, 0o600)
    except PermissionError:  # another account's (a run under sudo): replaced, as its cache file will be
        guard.unlink(missing_ok=True)
        fd = os.open(guard, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the flock


def _bytes(value: bytes | str) -> bytes:
    """Rows written by earlier versions hold TEXT (model replies); new ones hold BLOBs."""
    return value if isinstance(value, bytes) else str(value).encode()
