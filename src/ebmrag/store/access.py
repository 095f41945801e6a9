"""API keys and roles: who may call what, for which tenant and which patients.

A key is `ebm_<key id>_<secret>`; the store keeps only sha256(secret), so a copy of the database does
not hand out keys. Every key acts for one tenant; it may be limited to listed patients (the shape of a
SMART-on-FHIR `patient/*` launch scope). Roles decide the actions:

- clinician: read a patient's fragments, ask, pack, search;
- service (an EHR feed, the results gateway): the clinician's actions plus writing records;
- admin: everything, including erasure and the knowledge base.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from ebmrag.store.patients import ApiKey, PatientStore, now

READ, WRITE, ERASE, SEARCH, KB_ADMIN = "read", "write", "erase", "search", "kb_admin"
ROLES: dict[str, frozenset[str]] = {
    "clinician": frozenset({READ, SEARCH}),
    "service": frozenset({READ, SEARCH, WRITE}),
    "admin": frozenset({READ, SEARCH, WRITE, ERASE, KB_ADMIN}),
}
_KEY = re.compile(r"^ebm_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})$")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)


class AccessError(Exception):
    """status 401 (no or bad key), 403 (role) or 404 (a patient the key may not see: not revealed)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def valid_name(value: str, what: str) -> str:
    """Tenant and patient ids: letters, digits and . _ : - (so they can never smuggle a path or SQL)."""
    if not _NAME.match(value):
        raise ValueError(f"{what} must be 1-128 letters, digits or . _ : - (starting with a letter or digit), "
                         f"got {value!r}")
    return value


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(store: PatientStore, tenant: str, role: str, patients: tuple[str, ...] = ()) -> tuple[str, ApiKey]:
    """(the key to hand out, what the store keeps)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    valid_name(tenant, "tenant")
    for patient in patients:
        valid_name(patient, "patient id")
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    key = ApiKey(key_id, tenant, role, tuple(patients), _digest(secret), now())
    store.add_key(key)
    return f"ebm_{key_id}_{secret}", key


def authenticate(store: PatientStore, authorization: str | None) -> ApiKey:
    if not authorization or not authorization.startswith("Bearer "):
        raise AccessError(401, "send an API key: Authorization: Bearer ebm_…")
    match = _KEY.match(authorization.removeprefix("Bearer ").strip())
    key = store.key(match.group(1)) if match else None
    if key is None or match is None or not hmac.compare_digest(key.digest, _digest(match.group(2))):
        raise AccessError(401, "the API key is not valid")
    if key.revoked:
        raise AccessError(401, "the API key has been revoked")
    return key


def require(key: ApiKey, action: str, patient: str | None = None) -> None:
    if action not in ROLES[key.role]:
        raise AccessError(403, f"a {key.role} key may not {action.replace('_', ' ')}")
    if patient is not None and not key.may_see(patient):
        raise AccessError(404, "no such patient")
