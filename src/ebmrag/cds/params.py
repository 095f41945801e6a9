"""`[cds]`: the CDS Hooks service of `ebmrag serve`, and the CDS clients (EHRs) it trusts (docs/configuration.md).

A CDS client proves who it is with a JWT signed by a key of its JWK Set (CDS Hooks 2.0, "Trusting CDS Clients").
Each trusted issuer is a table `[cds.issuers.<name>]`: its `iss`, where its JWK Set is (a file, or an https URL
fetched and cached; the only URL a token's `jku` may name), the tenant its calls are audited under, and the FHIR
servers whose `fhirAuthorization` tokens the service may use (a hook's `fhirServer` names a URL; the service
fetches only from a listed one, so a trusted client cannot point it anywhere else).

`base_url` is required when the service is on: a token's `aud` must name the endpoint under it, never under the
Host or X-Forwarded-* headers a caller chooses.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ebmrag.ehr.params import check_base

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # the store's tenant id rule
ISSUER_KEYS = ("iss", "tenant", "jwks_file", "jwks_url", "fhir_servers")


@dataclass(frozen=True)
class TrustedIssuer:
    """One CDS client. Exactly one of `jwks_file` (a JSON JWK Set on this server) and `jwks_url`."""

    name: str
    iss: str
    tenant: str
    jwks_file: str = ""
    jwks_url: str = ""
    fhir_servers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"[cds.issuers.{self.name}]"
        if not _NAME.match(self.name):
            raise ValueError(f"issuer names must be 1-128 letters, digits or . _ : -, got {self.name!r}")
        if not self.iss.strip():
            raise ValueError(f"{where} needs iss: the `iss` claim of the client's JWTs")
        if not _NAME.match(self.tenant):
            raise ValueError(f"{where} tenant must be a tenant id (letters, digits, . _ : -), got {self.tenant!r}")
        if bool(self.jwks_file) == bool(self.jwks_url):
            raise ValueError(f"{where} needs exactly one of jwks_file and jwks_url")
        if self.jwks_url and not _trusted_key_url(self.jwks_url):
            raise ValueError(f"{where} jwks_url must be an https URL (http only on a loopback host, for local tests), "
                             f"got {self.jwks_url!r}")
        for server in self.fhir_servers:
            check_base(server, f"{where} fhir_servers")
            if normal_base(server) is None:
                raise ValueError(f"{where} fhir_servers: {server!r} must be a FHIR base URL (no user part, a valid "
                                 "port)")

    def listed_base(self, fhir_server: str) -> str | None:
        """The listed FHIR base the hook's `fhirServer` is, or None: compared normalised (scheme and host in lower
        case, a default port dropped, no trailing slash). The listed spelling is returned, so what is fetched is
        exactly what the configuration lists."""
        wanted = normal_base(fhir_server)
        return next((s.rstrip("/") for s in self.fhir_servers if wanted is not None and normal_base(s) == wanted),
                    None)

    def may_fetch_from(self, fhir_server: str) -> bool:
        """Whether the hook's `fhirServer` is one of this client's listed FHIR bases (see `listed_base`)."""
        return self.listed_base(fhir_server) is not None


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normal_base(url: str) -> str | None:
    """A FHIR base as compared with the allow-list: `scheme://host[:port]/path` with scheme and host in lower case,
    the scheme's default port dropped and no trailing slash; None for what is no such base (another scheme, no
    host, a user part, a query or a fragment, a bad port)."""
    if "?" in url or "#" in url:
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown = f":{port}" if port is not None and port != _DEFAULT_PORTS[parts.scheme.lower()] else ""
    return f"{parts.scheme.lower()}://{host.lower()}{shown}{parts.path.rstrip('/')}"


def _trusted_key_url(url: str) -> bool:
    """https, or http to this machine (a JWK Set fetched over plain HTTP elsewhere could be swapped in transit)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    if not host:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and _loopback(host))


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class CdsParams:
    """The service's switches and limits, and the trusted issuers as TOML holds them (`[cds.issuers.<name>]`);
    `issuer(name)` gives the checked `TrustedIssuer`, `trusted(iss)` the one a token names."""

    enabled: bool = False  # GET /cds-services and the hook endpoints exist only when true
    base_url: str = ""  # the URL clients call (https://cds.example.org); a JWT's `aud` is checked against it only
    clock_skew_seconds: float = 30.0  # allowed between the client's clock and ours (exp, iat)
    jwks_cache_seconds: float = 300.0  # a JWK Set fetched from jwks_url is reused this long (a new kid refetches)
    fetch_timeout_seconds: float = 10.0  # one request to the EHR's FHIR server (missing prefetch)
    fetch_max_pages: int = 50  # pages of one fetched search (100 resources each); more: the call is refused (412)
    critical_hours: float = 24.0  # a critical result this recent gets a card
    issuers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.base_url:
            check_base(self.base_url, "base_url")
        elif self.enabled:
            raise ValueError("base_url is required when enabled = true: the URL clients call "
                             "(https://cds.example.org), which a JWT's aud must name")
        if self.clock_skew_seconds < 0 or self.jwks_cache_seconds < 0:
            raise ValueError("clock_skew_seconds and jwks_cache_seconds must be >= 0")
        if self.fetch_timeout_seconds <= 0 or self.critical_hours <= 0:
            raise ValueError("fetch_timeout_seconds and critical_hours must be > 0")
        if not 1 <= self.fetch_max_pages <= 1000:
            raise ValueError(f"fetch_max_pages must be 1 to 1000, got {self.fetch_max_pages}")
        seen: dict[str, str] = {}
        for name in self.issuers:
            iss = self.issuer(name).iss  # every issuer checked when the settings are read
            if iss in seen:
                raise ValueError(f"[cds.issuers.{name}] and [cds.issuers.{seen[iss]}] have the same iss")
            seen[iss] = name

    def issuer(self, name: str) -> TrustedIssuer:
        """The named issuer, checked; a KeyError when there is none."""
        raw = self.issuers[name]
        where = f"[cds.issuers.{name}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be a table")
        unknown = sorted(set(raw) - set(ISSUER_KEYS))
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; known: {list(ISSUER_KEYS)}")
        servers = raw.get("fhir_servers", [])
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise ValueError(f"{where} fhir_servers must be a list of FHIR base URLs")
        wrong = sorted(k for k, v in raw.items() if k != "fhir_servers" and not isinstance(v, str))
        if wrong:
            raise ValueError(f"{where} keys {wrong} must be strings")
        if not raw.get("iss") or not raw.get("tenant"):
            raise ValueError(f"{where} needs iss and tenant")
        return TrustedIssuer(name=name, **{k: v for k, v in raw.items() if k != "fhir_servers"},
                             fhir_servers=tuple(servers))

    def trusted(self, iss: str) -> TrustedIssuer | None:
        """The issuer whose `iss` this is, or None."""
        return next((found for name in self.issuers if (found := self.issuer(name)).iss == iss), None)
