"""`[ehr]`: how charts are pulled from FHIR servers, and the named connections to them (docs/configuration.md).

A connection holds everything needed to act as a SMART Backend Services client of one EHR for one tenant: the
FHIR base URL, the client id the EHR registered, and the file of the private key whose public half the EHR holds.
Keys and client ids live here, on the server, only: a request names a connection, never a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

ALGORITHMS = ("RS384", "ES384")  # what SMART Backend Services requires servers to accept
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # the store's tenant and patient id rule


@dataclass(frozen=True)
class EhrConnection:
    """One FHIR server as one tenant reaches it. `client_id` empty: the server is open (no token is asked for);
    otherwise `private_key_file` (PEM, or a JWK / JWKS in JSON) signs the client assertion, under `key_id` (the
    `kid` the EHR knows it by; empty: the JWK's own `kid`).

    Where requests may go is decided here, not by what a server answers: the token endpoint the server's
    (unauthenticated) discovery names must be on the FHIR base's origin or one of `token_origins` (or
    `token_endpoint` names it and discovery is not asked), Bulk Data files are fetched from the base's origin or
    one of `bulk_file_origins` only, and every URL is https unless `allow_http` (local testing)."""

    name: str
    tenant: str
    fhir_base: str
    client_id: str = ""
    private_key_file: str = ""
    key_id: str = ""
    algorithm: str = "ES384"
    scope: str = "system/*.rs"
    token_endpoint: str = ""  # set: the token endpoint, and discovery is not asked for one
    token_origins: tuple[str, ...] = ()  # origins besides the FHIR base's a discovered token endpoint may be on
    bulk_file_origins: tuple[str, ...] = ()  # origins besides the FHIR base's Bulk Data files may be fetched from
    allow_http: bool = False  # plain http for the base, the token endpoint and files (local testing only)

    def __post_init__(self) -> None:
        where = f"[ehr.connections.{self.name}]"
        if not _NAME.match(self.name):
            raise ValueError(f"connection names must be 1-128 letters, digits or . _ : -, got {self.name!r}")
        if not _NAME.match(self.tenant):
            raise ValueError(f"{where} tenant must be a tenant id (letters, digits, . _ : -), got {self.tenant!r}")
        check_base(self.fhir_base, f"{where} fhir_base")
        self.check_scheme(self.fhir_base, f"{where} fhir_base")
        if self.token_endpoint:
            check_base(self.token_endpoint, f"{where} token_endpoint")
            self.check_scheme(self.token_endpoint, f"{where} token_endpoint")
        for key in ("token_origins", "bulk_file_origins"):
            object.__setattr__(self, key, tuple(self.check_origin(o, f"{where} {key}") for o in getattr(self, key)))
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"{where} algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.client_id and not self.private_key_file:
            raise ValueError(f"{where} has a client_id but no private_key_file to sign its client assertions")
        if not self.scope.strip():
            raise ValueError(f"{where} scope is empty (for example system/*.rs)")

    @property
    def base(self) -> str:
        return self.fhir_base.rstrip("/")

    def check_scheme(self, url: str, what: str) -> None:
        """https, or http where the connection allows it (a test server on 127.0.0.1)."""
        if urlsplit(url).scheme != "https" and not self.allow_http:
            raise ValueError(f"{what} must be an https URL (allow_http = true permits http, for local testing "
                             "only), got an http one")

    def check_origin(self, url: str, what: str) -> str:
        """An origin (`https://auth.example` or with a port), as `scheme://host:port` with the port written out."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError(f"{what}: {url!r} is not an origin like https://auth.example") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or \
                parts.query or parts.fragment or parts.username is not None:
            raise ValueError(f"{what}: {url!r} is not an origin like https://auth.example (no path, no query)")
        self.check_scheme(url, what)
        return f"{parts.scheme}://{parts.hostname.lower()}:{port or {'http': 80, 'https': 443}[parts.scheme]}"


def check_base(url: str, what: str) -> str:
    """A FHIR base must be an absolute http(s) URL without query or fragment (paging links are compared with it)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{what} must be an http(s) URL like https://ehr.example/fhir, got {url!r}")
    return url.rstrip("/")


CONNECTION_KEYS = tuple(f.name for f in fields(EhrConnection) if f.name != "name")
_LIST_KEYS = ("token_origins", "bulk_file_origins")
_BOOL_KEYS = ("allow_http",)


@dataclass(frozen=True)
class EhrParams:
    """Paging, patience and the named connections. `connections` maps a name to its table's keys, as TOML holds
    them (`[ehr.connections.<name>]`); `connection(name)` gives the checked `EhrConnection`."""

    page_size: int = 100  # `_count` of every search and $everything page
    timeout_seconds: float = 30.0  # one HTTP request: connect, send and the answer head, in all (ehr.wire)
    retries: int = 3  # a 429 or 503 retried this often, waiting its Retry-After (or the backoff)
    error_retries: int = 1  # another 5xx or a network error retried this often (the backoff between)
    max_backoff_seconds: float = 30.0  # the backoff doubles from 0.5 s up to this
    max_retry_after_seconds: float = 120.0  # a server asking to wait longer is an error, not a wait
    export_wait_seconds: float = 3600.0  # a Bulk $export not complete after this is cancelled
    since_skew_seconds: float = 5.0  # the next `_since` starts this long before the last pull's server time
    max_response_mb: float = 512.0  # one answer (a page, a Bulk Data file) read into memory at most
    max_pull_mb: float = 256.0  # every answer of one patient's pull together
    max_export_mb: float = 1024.0  # every file of one Bulk Data export together (spooled to disk, not memory)
    pull_seconds: float = 300.0  # one pull, or an export's downloads, from start to end (waits included)
    reference_depth: int = 2  # rounds of fetching what pulled resources refer to (drugs, organizations, panels)
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= 1000:
            raise ValueError(f"page_size must be 1 to 1000, got {self.page_size}")
        if min(self.timeout_seconds, self.max_backoff_seconds, self.export_wait_seconds, self.max_response_mb,
               self.max_pull_mb, self.max_export_mb, self.pull_seconds) <= 0:
            raise ValueError("timeout_seconds, max_backoff_seconds, export_wait_seconds, max_response_mb, "
                             "max_pull_mb, max_export_mb and pull_seconds must be > 0")
        if min(self.retries, self.error_retries, self.reference_depth) < 0:
            raise ValueError("retries, error_retries and reference_depth must be >= 0")
        if self.max_retry_after_seconds < 0 or self.since_skew_seconds < 0:
            raise ValueError("max_retry_after_seconds and since_skew_seconds must be >= 0")
        for name in self.connections:
            self.connection(name)  # every connection checked when the settings are read, not at its first use

    def connection(self, name: str) -> EhrConnection:
        """The named connection, checked; a KeyError when there is none."""
        raw = self.connections[name]
        if not isinstance(raw, dict):
            raise ValueError(f"[ehr.connections.{name}] must be a table")
        unknown = sorted(set(raw) - set(CONNECTION_KEYS))
        if unknown:
            raise ValueError(f"[ehr.connections.{name}] has unknown keys {unknown}; known: {list(CONNECTION_KEYS)}")
        wrong = sorted(k for k, v in raw.items() if not _well_typed(k, v))
        if wrong:
            raise ValueError(f"[ehr.connections.{name}] keys {wrong} must be strings ({', '.join(_LIST_KEYS)}: lists "
                             f"of strings; {', '.join(_BOOL_KEYS)}: true or false)")
        for required in ("tenant", "fhir_base"):
            if not raw.get(required):
                raise ValueError(f"[ehr.connections.{name}] needs {required}")
        values: dict[str, Any] = {k: tuple(v) if k in _LIST_KEYS else v for k, v in raw.items()}
        return EhrConnection(name=name, **values)

    def connection_for(self, name: str, tenant: str) -> EhrConnection | None:
        """The named connection if it belongs to `tenant`; None otherwise (another tenant's connection is as
        unknown to a key as a missing one)."""
        if name not in self.connections:
            return None
        found = self.connection(name)
        return found if found.tenant == tenant else None


def _well_typed(key: str, value: Any) -> bool:
    if key in _LIST_KEYS:
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    if key in _BOOL_KEYS:
        return isinstance(value, bool)
    return isinstance(value, str)
