"""Sign-in sessions of the `/ui` trace viewer, kept in the patient store.

The browser holds a random 256-bit token, never the API key: a stolen cookie ends with its session (sign-out,
expiry, the key's revocation) instead of working for as long as the key does. The store keeps only sha256 of
the token, so a copy of the database hands out no session, and beside it the key it acts for, when it was
created, when it expires at the latest and when it was last used (for the idle limit). The table
(`ui_sessions`) is part of `store.database.SCHEMA`; it holds no patient data and no tenant, so it is not
tenant-scoped: a session is found by its token alone and then acts as its key.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ebmrag.store.patients import PatientStore

TOKEN_BYTES = 32  # 256 bits
SESSIONS_PER_KEY = 20  # a key's older sessions end beyond this: signing in in a loop cannot grow the table


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _stamp(moment: datetime) -> str:
    """UTC ISO text of one fixed width, so stamps compare as text in SQL the way they do as times."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class UiSession:
    key_id: str
    created: datetime
    expires: datetime  # absolute: the session ends then however busy it is
    last_seen: datetime

    def alive(self, moment: datetime, idle: timedelta) -> bool:
        """Within its absolute lifetime and used within the last `idle`."""
        return moment < self.expires and moment < self.last_seen + idle


class UiSessions:
    """The `ui_sessions` table: start, find, touch and end sessions by their token."""

    def __init__(self, store: PatientStore) -> None:
        self.store = store

    def start(self, key_id: str, lifetime: timedelta, moment: datetime | None = None) -> str:
        """A new session for `key_id`; returns its token (the only copy: the store keeps its digest)."""
        moment = moment or datetime.now(UTC)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        with self.store.transaction() as cur:
            self.store._execute(cur, "INSERT INTO ui_sessions (token_digest, key_id, created, expires, last_seen) "
                                     "VALUES (?, ?, ?, ?, ?)",
                                (token_digest(token), key_id, _stamp(moment), _stamp(moment + lifetime),
                                 _stamp(moment)))
            self.store._execute(cur, "DELETE FROM ui_sessions WHERE key_id = ? AND token_digest NOT IN (SELECT "
                                     "token_digest FROM ui_sessions WHERE key_id = ? ORDER BY created DESC LIMIT ?)",
                                (key_id, key_id, SESSIONS_PER_KEY))
        return token

    def find(self, token: str) -> UiSession | None:
        with self.store.transaction() as cur:
            row = self.store._execute(cur, "SELECT key_id, created, expires, last_seen FROM ui_sessions "
                                           "WHERE token_digest = ?", (token_digest(token),)).fetchone()
        if row is None:
            return None
        created, expires, last_seen = (datetime.fromisoformat(str(v)) for v in row[1:4])
        return UiSession(str(row[0]), created, expires, last_seen)

    def touch(self, token: str, moment: datetime | None = None) -> None:
        """Record a use: the idle limit counts from here."""
        with self.store.transaction() as cur:
            self.store._execute(cur, "UPDATE ui_sessions SET last_seen = ? WHERE token_digest = ?",
                                (_stamp(moment or datetime.now(UTC)), token_digest(token)))

    def end(self, token: str) -> bool:
        """Sign-out or a dead session: the row goes, so a copied cookie no longer works."""
        with self.store.transaction() as cur:
            return bool(self.store._execute(cur, "DELETE FROM ui_sessions WHERE token_digest = ?",
                                            (token_digest(token),)).rowcount)

    def end_expired(self, idle: timedelta, moment: datetime | None = None) -> int:
        """Remove every session past its absolute or idle limit (called at each sign-in, so the table stays
        the size of the sessions in use)."""
        moment = moment or datetime.now(UTC)
        with self.store.transaction() as cur:
            return int(self.store._execute(cur, "DELETE FROM ui_sessions WHERE expires <= ? OR last_seen <= ?",
                                           (_stamp(moment), _stamp(moment - idle))).rowcount)
