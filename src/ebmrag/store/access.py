"""API keys and roles: who may call what, for which tenant and which patients.

A key is `ebm_<key id>_<secret>`; the store keeps only sha256(secret), so a copy of the database does
not hand out keys. A key may carry an expiry (`keys create --expires-in 90d`, at most [serve] key_max_days);
from then on it is refused like a revoked one. `rotate_key` hands out a successor and lets the old key run out
after a grace period, so a client can switch without an outage. Every key acts for one tenant; it may be
limited to listed patients (the shape of a SMART-on-FHIR `patient/*` launch scope). Roles decide the actions:

- clinician: read a patient's fragments, ask, pack, search;
- service (an EHR feed, the results gateway): the clinician's actions plus writing records;
- admin: everything, including erasure and the knowledge base.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ebmrag.store.database import now
from ebmrag.store.keys import ApiKey
from ebmrag.store.patients import PatientStore

READ, WRITE, ERASE, SEARCH, KB_ADMIN = "read", "write", "erase", "search", "kb_admin"
ROLES: dict[str, frozenset[str]] = {
    "clinician": frozenset({READ, SEARCH}),
    "service": frozenset({READ, SEARCH, WRITE}),
    "admin": frozenset({READ, SEARCH, WRITE, ERASE, KB_ADMIN}),
}
_KEY = re.compile(r"^ebm_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})$")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class AccessError(Exception):
    """status 401 (no or bad key), 403 (role) or 404 (a patient the key may not see: not revealed). `key`: the
    key refused, when it is known (revoked, expired): the refusal is audited under it."""

    def __init__(self, status: int, detail: str, key: ApiKey | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.key = status, detail, key


def valid_name(value: str, what: str) -> str:
    """Tenant and patient ids: letters, digits and . _ : - (so they can never smuggle a path or SQL)."""
    if not _NAME.match(value):
        raise ValueError(f"{what} must be 1-128 letters, digits or . _ : - (starting with a letter or digit), "
                         f"got {value!r}")
    return value


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def duration(text: str, what: str) -> timedelta:
    """"90d", "12h", "30m", "2w", "45s" as a time span."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise ValueError(f"{what} must be a number and a unit (s, m, h, d or w), like 90d, got {text!r}")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def moment_of(text: str, what: str) -> datetime:
    """An ISO 8601 date or time; without an offset it is UTC (a bare date: its first moment)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be an ISO 8601 date or time, like 2026-12-31 or 2026-12-31T18:00+01:00, "
                         f"got {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def key_expiry(expires_in: str = "", expires: str = "", max_days: float = 0.0,
               moment: datetime | None = None) -> datetime | None:
    """When a new key ends: `expires_in` from now or at `expires`, else after `max_days` ([serve] key_max_days;
    0: never). Past or beyond `max_days` is an error: a key must not outlive the deployment's policy."""
    if expires_in and expires:
        raise ValueError("give --expires-in or --expires, not both")
    moment = moment or datetime.now(UTC)
    if expires_in:
        ends: datetime | None = moment + duration(expires_in, "--expires-in")
    elif expires:
        ends = moment_of(expires, "--expires")
    else:
        ends = moment + timedelta(days=max_days) if max_days else None
    if ends is not None and ends <= moment:
        raise ValueError(f"the expiry {ends.isoformat(timespec='seconds')} is not in the future")
    if ends is not None and max_days and ends > moment + timedelta(days=max_days, minutes=1):
        raise ValueError(f"a key may live at most {max_days:g} days ([serve] key_max_days), "
                         f"not until {ends.isoformat(timespec='seconds')}")
    return ends


def _new_key(tenant: str, role: str, patients: tuple[str, ...], expires: datetime | None) -> tuple[str, ApiKey]:
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    ends = expires.astimezone(UTC).isoformat(timespec="seconds") if expires else ""
    return f"ebm_{key_id}_{secret}", ApiKey(key_id, tenant, role, tuple(patients), _digest(secret), now(), False, ends)


def create_key(store: PatientStore, tenant: str, role: str, patients: tuple[str, ...] = (),
               expires: datetime | None = None) -> tuple[str, ApiKey]:
    """(the key to hand out, what the store keeps). `expires`: when it stops working (None: never)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    valid_name(tenant, "tenant")
    for patient in patients:
        valid_name(patient, "patient id")
    secret, key = _new_key(tenant, role, tuple(patients), expires)
    store.add_key(key)
    return secret, key


def rotate_key(store: PatientStore, key_id: str, grace: timedelta,
               expires: datetime | None = None) -> tuple[str, ApiKey, ApiKey]:
    """A successor with the same tenant, role and patients (ending at `expires`), and the old key ending after
    `grace` (or sooner, if it was to end sooner): (the new key to hand out, the new key, the old key as now kept)."""
    old = store.key(key_id)
    if old is None:
        raise ValueError(f"no key with id {key_id!r}")
    if old.revoked or old.expired():
        raise ValueError(f"key {key_id} is {'revoked' if old.revoked else 'expired'}: create a new key instead")
    moment = datetime.now(UTC)
    ends = min(moment + grace, moment_of(old.expires, "the stored expiry")) if old.expires else moment + grace
    secret, new = _new_key(old.tenant, old.role, old.patients, expires)
    kept = replace(old, expires=ends.astimezone(UTC).isoformat(timespec="seconds"))
    store.rotate_key(old, new, kept.expires)
    return secret, new, kept


def authenticate(store: PatientStore, authorization: str | None) -> ApiKey:
    if not authorization or not authorization.startswith("Bearer "):
        raise AccessError(401, "send an API key: Authorization: Bearer ebm_…")
    match = _KEY.match(authorization.removeprefix("Bearer ").strip())
    key = store.key(match.group(1)) if match else None
    if key is None or match is None or not hmac.compare_digest(key.digest, _digest(match.group(2))):
        raise AccessError(401, "the API key is not valid")
    if key.revoked:
        raise AccessError(401, "the API key has been revoked", key)
    if key.expired():
        raise AccessError(401, f"the API key expired on {key.expires}; ask for a new one", key)
    return key


def require(key: ApiKey, action: str, patient: str | None = None) -> None:
    if action not in ROLES[key.role]:
        raise AccessError(403, f"a {key.role} key may not {action.replace('_', ' ')}")
    if patient is not None and not key.may_see(patient):
        raise AccessError(404, "no such patient")
