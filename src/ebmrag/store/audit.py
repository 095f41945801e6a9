"""Who saw what: an append-only access log in the patient store, chained with a key the database never holds.

Each entry names the time, the key, the tenant, the patient, the action, the request id and the fragment ids
disclosed (into a context, to a model, or in a listing) — never any record text. Its hash is an HMAC-SHA256,
under a server secret kept in a file outside the database, of the entry and the previous entry's hash. Someone
who can write the database but not read that file can neither edit an entry and recompute the hashes after it,
nor forge a head for a shortened log:

- the **signed head** (`audit_head`, one row, written in the same transaction as each entry) names the last
  entry and where the keyed chain began, signed with the same key: a removed tail no longer reaches it, and an
  earlier head cannot be signed without the key;
- the **head file** (`audit.head` in the data directory, rewritten after each commit) names the last entry too, out of
  the database's reach: a log wiped back to before its keyed chain, head row and all, still falls short of it;
- `ebmrag audit head` prints the head for an operator to keep elsewhere; `ebmrag audit verify --expect-head`
  checks that the log still reaches it.

Stores written before the key existed hold an unkeyed chain (plain sha256, scheme `sha256`): those entries are
still checked as they were, the keyed chain starts at the next entry, and no unkeyed entry may follow a keyed one.
When the server finds, while appending, that the log no longer reaches its signed head, it appends a signed
`audit-anomaly:` entry saying so (and logs it) rather than quietly signing the shortened log as whole.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebmrag.store.database import StoreError, now
from ebmrag.store.patients import PatientStore

log = logging.getLogger(__name__)

LEGACY, KEYED = "sha256", "hmac-sha256"
ANOMALY = "audit-anomaly: "
HEAD_FILE = "audit.head"
MIN_KEY_CHARS = 32
MAX_LISTED = 20  # problems of one kind listed one by one; the rest are counted
_KEYS: dict[Path, bytes] = {}  # the key of each key file, read once per process (it never changes under a log)
_KEYS_LOCK = threading.Lock()
_UNWRITABLE: set[Path] = set()  # head files already warned about


class AuditKeyError(StoreError):
    """The audit key is missing, unreadable or not the one the log was written with: nothing is audited
    (the service answers 503) until the right file is in place."""


@dataclass(frozen=True)
class AuditEntry:
    key_id: str
    tenant: str
    patient: str
    action: str
    request_id: str
    fragments: tuple[str, ...] = ()


@dataclass(frozen=True)
class Head:
    """The last entry (seq, hash), where the keyed chain began, which key signed it, and the signature."""

    seq: int
    hash: str
    keyed_from: int
    key_print: str
    signature: str

    @classmethod
    def from_row(cls, row: Sequence[Any] | None) -> Head | None:
        return cls(int(row[0]), str(row[1]), int(row[2]), str(row[3]), str(row[4])) if row else None

    def signed_by(self, key: bytes) -> bool:
        return hmac.compare_digest(head_signature(key, self.seq, self.hash, self.keyed_from), self.signature)


@dataclass
class AuditReport:
    """What `verify` found. `problems`: signs of tampering. `cannot_check`: why the keyed entries could not be
    checked (no key, or another key) — the rest of the chain still was."""

    entries: int = 0
    legacy: int = 0
    keyed: int = 0
    last: str = "0:"
    problems: list[str] = field(default_factory=list)
    cannot_check: str = ""

    @property
    def intact(self) -> bool:
        return not self.problems and not self.cannot_check

    def summary(self) -> str:
        parts = [f"{self.entries} entries"]
        if self.legacy:
            parts.append(f"entries 1 to {self.legacy} are of the unkeyed chain written before the audit key (sha256 "
                         "only: an edit there with its hashes recomputed would not show)")
        if self.keyed:
            first = self.entries - self.keyed + 1
            parts.append(f"entries {first} to {self.entries} are keyed (HMAC-SHA256)" if self.legacy else
                         "all keyed (HMAC-SHA256)")
        return "; ".join(parts) + f"; head {self.last}"


# ---------------------------------------------------------------------------------------------------- hashes
def _canonical(*parts: Any) -> bytes:
    return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _entry_parts(seq: int, at: str, entry: AuditEntry, prev: str) -> list[Any]:
    return [seq, at, entry.key_id, entry.tenant, entry.patient, entry.action, entry.request_id, list(entry.fragments),
            prev]


def entry_hash(seq: int, at: str, entry: AuditEntry, prev: str) -> str:
    """The unkeyed hash of the chain written before the audit key: anyone can recompute it."""
    return hashlib.sha256(_canonical(*_entry_parts(seq, at, entry, prev))).hexdigest()


def keyed_hash(key: bytes, seq: int, at: str, entry: AuditEntry, prev: str) -> str:
    return hmac.new(key, _canonical(KEYED, *_entry_parts(seq, at, entry, prev)), hashlib.sha256).hexdigest()


def head_signature(key: bytes, seq: int, digest: str, keyed_from: int) -> str:
    """Domain-separated from the entries' hashes, so no entry's hash can stand in for a head."""
    return hmac.new(key, _canonical("audit-head", seq, digest, keyed_from), hashlib.sha256).hexdigest()


def key_print(key: bytes) -> str:
    """Names the key without revealing it: tells "another key" apart from "every entry rewritten"."""
    return hmac.new(key, b"ebmrag audit key print", hashlib.sha256).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- the key
def read_key(path: Path) -> bytes | None:
    """The secret in `path` (its text, at least MIN_KEY_CHARS characters), or None when there is no file."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditKeyError(f"cannot read the audit key file {path}: {type(exc).__name__}") from None
    if len(text) < MIN_KEY_CHARS:
        raise AuditKeyError(f"the audit key file {path} holds fewer than {MIN_KEY_CHARS} characters")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the audit key file %s can be read by other accounts (mode %o); make it 0600", path,
                    stat.S_IMODE(mode))
    return text.encode("utf-8")


def create_key(path: Path) -> bytes:
    """Make the key file (0600, 32 random bytes as hex) unless it exists, and return the key it holds.

    Written whole to a private temporary file, then linked into place: the link fails if another process got
    there first, and then its complete key is read, so processes starting together agree on one key."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    handle = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(handle, 0o600)
        os.write(handle, (secrets.token_hex(32) + "\n").encode())
        os.fsync(handle)
        os.close(handle)
        try:
            os.link(draft, path)
            _sync_folder(path.parent)
            log.info("created the audit key %s", path)
        except FileExistsError:
            pass
    finally:
        draft.unlink(missing_ok=True)
    key = read_key(path)
    if key is None:
        raise AuditKeyError(f"the audit key file {path} vanished while it was made")
    return key


def _sync_folder(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _key_file(store: PatientStore) -> Path:
    if store.audit_key_file is None:
        raise AuditKeyError("the audit log needs a key file outside the database: open the store with "
                            "open_store(data_dir, url), or set EBMRAG_AUDIT_KEY_FILE or [serve] audit_key_file")
    return store.audit_key_file


def _writing_key(path: Path, may_create: bool) -> bytes:
    with _KEYS_LOCK:
        if path not in _KEYS:
            key = read_key(path)
            if key is None:
                if not may_create:
                    raise AuditKeyError(f"the audit log is keyed but its key file {path} is missing; restore it "
                                        "(every process writing this log must use the same file)")
                key = create_key(path)
            _KEYS[path] = key
        return _KEYS[path]


# ---------------------------------------------------------------------------------------------------- append
def append(store: PatientStore, entry: AuditEntry) -> str:
    """Add one entry under the store's write lock (SQLite: the database lock; PostgreSQL: a table lock, so
    worker processes never read the same tail), with the signed head in the same transaction; returns its hash."""
    path = _key_file(store)
    with store.transaction() as cur:
        if store.backend == "postgresql":
            cur.execute("LOCK TABLE audit IN SHARE ROW EXCLUSIVE MODE")
        seq, prev = store.audit_tail(cur)
        head = Head.from_row(store.audit_head(cur))
        first_keyed = store.audit_first_keyed(cur) if head is None else head.keyed_from  # scans only when headless
        key = _writing_key(path, may_create=head is None and first_keyed is None)
        if head is not None and head.key_print != key_print(key):
            raise AuditKeyError(f"the audit key file {path} is not the key this log was written with; every process "
                                "writing this log must use the same file")
        keyed_from = head.keyed_from if head is not None else first_keyed or seq + 1
        anomaly = _anomaly(head, key, seq, prev, first_keyed)
        if anomaly:
            log.error("audit log: %s; run `ebmrag audit verify`", anomaly)
            seq = max(seq, head.seq if head else 0)  # a removed tail stays a visible gap
            prev = _write(store, cur, key, seq + 1, prev, AuditEntry("-", "-", "", ANOMALY + anomaly, ""))
            seq += 1
        digest = _write(store, cur, key, seq + 1, prev, entry)
        store.set_audit_head(cur, (seq + 1, digest, keyed_from, key_print(key),
                                   head_signature(key, seq + 1, digest, keyed_from)))
    _mirror_head(store, seq + 1, digest)
    return digest


def _write(store: PatientStore, cur: Any, key: bytes, seq: int, prev: str, entry: AuditEntry) -> str:
    at = now()
    digest = keyed_hash(key, seq, at, entry, prev)
    store.insert_audit_row(cur, (seq, at, entry.key_id, entry.tenant, entry.patient, entry.action, entry.request_id,
                                 json.dumps(list(entry.fragments)), prev, digest, KEYED))
    return digest


def _anomaly(head: Head | None, key: bytes, seq: int, prev: str, first_keyed: int | None) -> str:
    """What is wrong with the tail the next entry would follow ("" when nothing)."""
    if head is None:
        return f"the signed head was missing though entries from {first_keyed} on are keyed" if first_keyed else ""
    if not head.signed_by(key):
        return "the signed head did not carry the audit key's signature"
    if head.seq > seq:
        return f"entries {seq + 1} to {head.seq} after entry {seq} were removed"
    if (head.seq, head.hash) != (seq, prev):
        return f"the last entry {seq} was not the signed head (entry {head.seq})"
    return ""


def _mirror_head(store: PatientStore, seq: int, digest: str) -> None:
    """Rewrite the head file after the commit (never ahead of the database). A write that loses a race with
    another process leaves an older head, which still checks out as part of the chain."""
    path = store.audit_head_file
    if path is None:
        return
    try:
        if (_read_head_file(path) or (0, ""))[0] >= seq:
            return
        draft = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        handle = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "w") as out:
            out.write(f"{seq}:{digest}\n")
        os.replace(draft, path)
    except (OSError, ValueError) as exc:
        if path not in _UNWRITABLE:
            _UNWRITABLE.add(path)
            log.warning("cannot write the audit head file %s (%s): a log cut back to before its keyed chain will "
                        "not be detected without it", path, type(exc).__name__)


def _read_head_file(path: Path) -> tuple[int, str] | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return parse_head(text)


def parse_head(text: str) -> tuple[int, str]:
    """"SEQ:HASH" (what `ebmrag audit head` prints) as (seq, hash)."""
    seq, colon, digest = text.strip().partition(":")
    if not (colon and seq.isdigit() and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise ValueError(f"a head is SEQ:HASH (an entry number, a colon and 64 hex digits), got {text[:80]!r}")
    return int(seq), digest


# ---------------------------------------------------------------------------------------------------- verify
def current_head(store: PatientStore) -> tuple[int, str]:
    """The last entry as (seq, hash): what an operator keeps outside to check the log against later."""
    with store.transaction() as cur:
        return store.audit_tail(cur)


def verify(store: PatientStore, expect_head: tuple[int, str] | None = None) -> AuditReport:
    """Check the whole log: each entry, the links between them, the signed head, the head file, and
    `expect_head` (a head an operator kept) when given."""
    path, mirror = store.audit_key_file, store.audit_head_file
    try:
        anchored = _read_head_file(mirror) if mirror else None  # read before the rows, so it is never ahead of them
    except (OSError, ValueError):
        anchored = None
        problem_with_file = f"the head file {mirror} is unreadable (edited)"
    else:
        problem_with_file = ""
    rows, raw_head = store.audit_snapshot()
    try:
        key, why = (read_key(path), f"no audit key file at {path}") if path else (None, "no audit key file is set")
    except AuditKeyError as exc:
        key, why = None, str(exc)
    report = check(rows, Head.from_row(raw_head), key, why, expect_head, anchored)
    if problem_with_file:
        report.problems.append(problem_with_file)
    return report


def check(rows: Sequence[Sequence[Any]], head: Head | None, key: bytes | None, no_key_reason: str = "no key given",
          expect_head: tuple[int, str] | None = None, anchored: tuple[int, str] | None = None) -> AuditReport:
    """The checks of `verify` on rows already read (the columns of audit_table.AUDIT_COLUMNS)."""
    report, rewritten = AuditReport(), []
    if key is not None and head is not None and head.key_print != key_print(key):
        key, no_key_reason = None, "the audit key given is not the key this log was written with"
    prev, expected, first_keyed = "", 1, None
    for row in rows:
        seq, stored_hash = int(row[0]), str(row[9])
        report.entries += 1
        if seq != expected:
            report.problems.append(f"entries {expected} to {seq - 1} are missing (removed)" if seq > expected else
                                   f"entry {seq} is out of order")
        if row[8] != prev:
            report.problems.append(f"entry {seq}: does not follow the entry before it (an entry was removed or edited)")
        scheme = row[10] if len(row) > 10 else LEGACY
        entry = _entry(row)
        if scheme == KEYED:
            report.keyed += 1
            first_keyed = first_keyed or seq
            if entry is None or (key is not None and not hmac.compare_digest(
                    keyed_hash(key, seq, row[1], entry, row[8]), stored_hash)):
                rewritten.append(seq)
            elif entry.action.startswith(ANOMALY):
                report.problems.append(f"entry {seq}: the server found when writing it that "
                                       f"{entry.action.removeprefix(ANOMALY)}")
        elif scheme == LEGACY:
            report.legacy += 1
            if first_keyed is not None or (head is not None and seq >= head.keyed_from):
                report.problems.append(f"entry {seq}: an unkeyed entry where the keyed chain runs (forged or "
                                       "downgraded)")
            elif entry is None or entry_hash(seq, row[1], entry, row[8]) != stored_hash:
                report.problems.append(f"entry {seq}: its content does not match its hash (edited)")
        else:
            report.problems.append(f"entry {seq}: unknown hash scheme {str(scheme)[:20]!r} (edited)")
        prev, expected = stored_hash, seq + 1
    report.last = f"{expected - 1}:{prev}"
    report.problems += _rewritten(rewritten, report.keyed)
    if key is None and (report.keyed or head is not None):
        report.cannot_check = (f"{no_key_reason}: the {report.keyed} keyed entries and the signed head cannot be "
                               "checked (use the file the server uses: [serve] audit_key_file or "
                               "EBMRAG_AUDIT_KEY_FILE, else audit.key in the data directory)")
    report.problems += _head_problems(head, key, expected - 1, prev, first_keyed, report.keyed)
    hashes = {int(r[0]): str(r[9]) for r in rows} if (anchored or expect_head) else {}
    report.problems += _anchor_problems(anchored, hashes, expected - 1, f"the head file ({HEAD_FILE})")
    report.problems += _anchor_problems(expect_head, hashes, expected - 1, "the expected head")
    return report


def _entry(row: Sequence[Any]) -> AuditEntry | None:
    try:
        fragments = json.loads(row[7])
        return AuditEntry(str(row[2]), str(row[3]), str(row[4]), str(row[5]), str(row[6]),
                          tuple(str(f) for f in fragments))
    except (ValueError, TypeError):
        return None


def _rewritten(seqs: list[int], keyed: int) -> list[str]:
    if not seqs:
        return []
    if len(seqs) == keyed and keyed > 1:
        return [f"none of the {keyed} keyed entries matches its keyed hash: all were rewritten, or the audit key "
                "is not the one they were written with"]
    listed = [f"entry {s}: its content does not match its keyed hash (edited, or rehashed without the key)"
              for s in seqs[:MAX_LISTED]]
    return listed + ([f"... and {len(seqs) - MAX_LISTED} more entries like it"] if len(seqs) > MAX_LISTED else [])


def _head_problems(head: Head | None, key: bytes | None, last: int, last_hash: str, first_keyed: int | None,
                   keyed: int) -> list[str]:
    if head is None:
        return [f"the signed head is missing though {keyed} entries are keyed: entries after the last one may have "
                "been removed"] if keyed else []
    problems = []
    if key is not None and not head.signed_by(key):
        problems.append("the signed head does not carry the audit key's signature (edited or forged)")
    if head.seq > last:
        problems.append(f"entries {last + 1} to {head.seq} are missing after entry {last}: the tail was removed "
                        f"(the signed head names entry {head.seq})")
    elif head.seq < last:
        problems.append(f"entries {head.seq + 1} to {last} come after the signed head (written outside the service)")
    elif head.hash != last_hash:
        problems.append(f"the last entry {last} is not the one the signed head names (edited or replaced)")
    if first_keyed is not None and first_keyed != head.keyed_from:
        problems.append(f"the keyed chain starts at entry {first_keyed}, but the signed head says "
                        f"{head.keyed_from} (entries were removed or downgraded)")
    return problems


def _anchor_problems(anchor: tuple[int, str] | None, hashes: dict[int, str], last: int, name: str) -> list[str]:
    """A head kept outside the database must still be an entry of the log, with the same hash."""
    if anchor is None or anchor[0] == 0:
        return []
    seq, digest = anchor
    if seq not in hashes:
        return [f"{name} names entry {seq}, which is no longer in the log (the log ends at {last}: entries were "
                "removed)"]
    if not hmac.compare_digest(hashes[seq], digest):
        return [f"entry {seq} is not the one {name} names (the log was rewritten)"]
    return []
