"""SMART Backend Services authorization (client credentials with a private-key JWT assertion).

The flow (hl7.org/fhir/smart-app-launch/backend-services.html): find the token endpoint (the server's
`.well-known/smart-configuration`, else the CapabilityStatement's `oauth-uris` extension), sign a short-lived
assertion (`iss` = `sub` = client id, `aud` = the token endpoint, `exp` five minutes ahead, a fresh `jti`) with
the client's RS384 or ES384 key, and trade it for an access token. The token is kept until shortly before it
expires; a 401 from the FHIR server gets one fresh token (`FhirClient` asks `refresh()`), never a loop.

Discovery is unauthenticated, so what it names is checked before the signed assertion goes there: the token
endpoint must be on the FHIR base's origin or one the connection lists (`token_origins`), and https unless the
connection allows http (`allow_http`, local testing). A connection's own `token_endpoint` replaces discovery. What
an authorization server says when it refuses is repeated only as a short, one-line, control-free excerpt.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt

from ebmrag.ehr.fhir import EhrError, FhirClient, diagnostics, excerpt, origin
from ebmrag.ehr.keys import SigningKey, load_signing_key
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.ehr.wire import AnswerTimeout, Exchange
from ebmrag.errors import RecordError
from ebmrag.records.limits import load_json

log = logging.getLogger(__name__)
OAUTH_URIS = "http://fhir-registry.smarthealthit.org/StructureDefinition/oauth-uris"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_SECONDS = 300  # the longest an assertion may live (SMART Backend Services)
EXPIRY_MARGIN = 30.0  # seconds (at most a tenth of its life): a token this close to its end is replaced before use
DEFAULT_TOKEN_SECONDS = 300  # a token answer without expires_in
TOKEN_ANSWER_BYTES = 1 << 20  # a token answer larger than this is refused


@dataclass(frozen=True)
class SmartConfiguration:
    token_endpoint: str
    algorithms: tuple[str, ...] = ()  # the signing algorithms the server lists (empty: it does not say)


def discover(client: FhirClient, capability: Mapping[str, Any] | None) -> SmartConfiguration:
    """The token endpoint from `.well-known/smart-configuration`, else from the CapabilityStatement (as the server
    says: `trusted_token_endpoint` checks it)."""
    try:
        found = client.read(".well-known/smart-configuration", operation="SMART discovery", authorized=False)
    except EhrError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        found = {}  # an older server: the CapabilityStatement says it
    token = found.get("token_endpoint") if isinstance(found, Mapping) else None
    algorithms = found.get("token_endpoint_auth_signing_alg_values_supported") if isinstance(found, Mapping) else None
    if not isinstance(token, str) or not token:
        token = _capability_token_url(capability)
    if not token:
        raise EhrError("SMART discovery: the FHIR server names no token endpoint (neither in "
                       ".well-known/smart-configuration nor in its CapabilityStatement's oauth-uris)")
    if "://" not in token:
        raise EhrError("SMART discovery: the token endpoint is not an absolute URL")
    return SmartConfiguration(token, tuple(a for a in algorithms if isinstance(a, str))
                              if isinstance(algorithms, list) else ())


def trusted_token_endpoint(connection: EhrConnection, url: str) -> str:
    """`url` when the signed assertion may go there: https (or http where the connection allows it), on the FHIR
    base's origin or one of the connection's `token_origins`, without credentials, query or fragment. Anyone who
    can answer the unauthenticated discovery could otherwise collect a valid client assertion and hand back a
    token of its own."""
    where = f"[ehr.connections.{connection.name}]"
    try:
        parts = urlsplit(url)
        there = origin(url)
    except ValueError:
        raise EhrError("SMART discovery: the token endpoint is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None or parts.query \
            or parts.fragment:
        raise EhrError("SMART discovery: the token endpoint is not a plain http(s) URL")
    if parts.scheme != "https" and not connection.allow_http:
        raise EhrError(f"SMART discovery: the token endpoint is not https; not used (allow_http in {where} is for "
                       "local testing)")
    allowed = {origin(connection.base), *(origin(o) for o in connection.token_origins)}
    if there not in allowed:
        raise EhrError(f"SMART discovery: the token endpoint is on another origin than the FHIR base "
                       f"({excerpt(f'{there[0]}://{there[1]}', 80)}); not used: list it in {where} token_origins, "
                       "or set token_endpoint there")
    return url


def _capability_token_url(capability: Mapping[str, Any] | None) -> str:
    rests = capability.get("rest") if isinstance(capability, Mapping) else None
    for rest in rests if isinstance(rests, list) else []:
        security = rest.get("security") if isinstance(rest, Mapping) else None
        extensions = security.get("extension") if isinstance(security, Mapping) else None
        for extension in extensions if isinstance(extensions, list) else []:
            if not isinstance(extension, Mapping) or extension.get("url") != OAUTH_URIS:
                continue
            for inner in extension.get("extension") or []:
                uri = inner.get("valueUri") if isinstance(inner, Mapping) and inner.get("url") == "token" else None
                if isinstance(uri, str):
                    return uri
    return ""


def client_assertion(key: SigningKey, client_id: str, token_endpoint: str, now: float | None = None) -> str:
    """The signed JWT that authenticates the client (RFC 7523), good for five minutes and once (`jti`)."""
    issued = int(now if now is not None else time.time())
    claims = {"iss": client_id, "sub": client_id, "aud": token_endpoint, "exp": issued + ASSERTION_SECONDS,
              "iat": issued, "jti": secrets.token_urlsafe(24)}
    return jwt.encode(claims, key.key, algorithm=key.algorithm, headers={"kid": key.kid, "typ": "JWT"})


class TokenSource:
    """Access tokens of one connection, cached until `EXPIRY_MARGIN` before they expire (thread-safe: the pages of
    one pull, and the pulls of one connection in this process, share a token: `connect` keeps one source per
    connection)."""

    def __init__(self, connection: EhrConnection, key: SigningKey, token_endpoint: str, timeout: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.connection, self.key, self.endpoint, self.clock = connection, key, token_endpoint, clock
        self.timeout = timeout
        self._lock = threading.Lock()
        self._token, self._until = "", 0.0
        self.issued = 0  # tokens fetched (a test, or an operator's log, sees how often)
        self.scope = ""  # what the server granted

    def token(self) -> str:
        with self._lock:
            if self._token and self.clock() < self._until:
                return self._token
            return self._fetch()

    def refresh(self) -> str:
        with self._lock:
            return self._fetch()

    def _fetch(self) -> str:
        form = {"grant_type": "client_credentials", "scope": self.connection.scope,
                "client_assertion_type": ASSERTION_TYPE,
                "client_assertion": client_assertion(self.key, self.connection.client_id, self.endpoint)}
        started = self.clock()
        try:
            with httpx.Client(timeout=self.timeout, follow_redirects=False) as http:
                request = http.build_request("POST", self.endpoint, data=form, headers={"Accept": "application/json"})
                with Exchange(http, request, header_seconds=self.timeout,
                              until=time.monotonic() + self.timeout) as exchange:  # the whole exchange, not a read
                    status, raw = exchange.reply.status_code, _bounded_body(exchange.pieces())
        except httpx.TransportError as exc:
            why = f"no complete answer within {self.timeout:g} s" if isinstance(exc, AnswerTimeout) else \
                f"could not be reached ({type(exc).__name__})"
            raise EhrError(f"token request: the authorization server {why}", operation="token request",
                           unreachable=True) from None
        except httpx.DecodingError as exc:  # ours (ehr.wire)
            raise EhrError(f"token request: the authorization server's answer could not be read: {exc}",
                           operation="token request") from None
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:  # a bad URL, ...
            raise EhrError(f"token request: the authorization server's answer could not be read "
                           f"({type(exc).__name__})", operation="token request") from None
        body = _json_or_empty(raw)
        token = body.get("access_token") if isinstance(body, Mapping) else None
        if status != 200 or not isinstance(token, str) or not token:
            said = diagnostics(body) or ("no access_token in the answer" if status == 200 else "")
            raise EhrError(f"token request: the authorization server refused ({status})"
                           + (f": {said}" if said else ""), status=status, operation="token request")
        lifetime = body.get("expires_in")
        seconds = float(lifetime) if isinstance(lifetime, int | float) and lifetime >= 0 else DEFAULT_TOKEN_SECONDS
        self._token, self._until = token, started + seconds - min(EXPIRY_MARGIN, seconds / 10)
        self.scope = str(body.get("scope") or self.connection.scope)  # none said: granted as asked (RFC 6749 5.1)
        self.issued += 1
        log.info("connection %s: access token for %s, %.0f s", self.connection.name, excerpt(self.scope, 200), seconds)
        return token


def _bounded_body(pieces: Iterator[bytes]) -> bytes:
    """The token answer, at most TOKEN_ANSWER_BYTES of it (a token answer is small; a bigger one is not read on)."""
    body = bytearray()
    for piece in pieces:
        body += piece
        if len(body) > TOKEN_ANSWER_BYTES:
            raise EhrError("token request: the authorization server's answer is too large",
                           operation="token request")
    return bytes(body)


def _json_or_empty(raw: bytes) -> Any:
    try:
        return load_json(raw, "token answer") if raw else {}
    except RecordError:
        return {}


def connect(connection: EhrConnection, params: EhrParams, *,
            http: httpx.Client | None = None) -> tuple[FhirClient, Mapping[str, Any]]:
    """A client of the connection's server, authorized when the connection has a client id, and the server's
    CapabilityStatement (read first: it also says where the token endpoint is, for servers without
    .well-known/smart-configuration)."""
    client = FhirClient(connection.base, params, http=http)
    capability = client.read("metadata", operation="read CapabilityStatement", authorized=False)
    if not isinstance(capability, Mapping) or capability.get("resourceType") != "CapabilityStatement":
        raise EhrError("read CapabilityStatement: the FHIR server's /metadata is not a CapabilityStatement")
    if connection.client_id:
        if connection.token_endpoint:  # the operator's word (checked when the settings were read): no discovery
            config = SmartConfiguration(connection.token_endpoint)
        else:
            config = discover(client, capability)
            trusted_token_endpoint(connection, config.token_endpoint)
        if config.algorithms and connection.algorithm not in config.algorithms:
            raise EhrError(f"SMART discovery: the server accepts assertions signed with "
                           f"{', '.join(config.algorithms)}, not {connection.algorithm} "
                           f"([ehr.connections.{connection.name}] algorithm)")
        client.auth = token_source(connection, config.token_endpoint, params.timeout_seconds)
    return client, capability


_SOURCES: dict[tuple[Any, ...], TokenSource] = {}
_SOURCES_LOCK = threading.Lock()


def token_source(connection: EhrConnection, token_endpoint: str, timeout: float) -> TokenSource:
    """The process's token source of this connection (a new one when its key file or any setting changed), so
    consecutive pulls reuse a token that has not expired instead of asking for one each."""
    try:
        stamp = Path(connection.private_key_file).stat().st_mtime_ns
    except OSError:
        stamp = 0  # load_signing_key says why
    identity = (token_endpoint, connection.client_id, connection.scope, connection.algorithm, connection.key_id,
                str(Path(connection.private_key_file).resolve()), stamp)
    with _SOURCES_LOCK:
        source = _SOURCES.get(identity)
        if source is None:
            key = load_signing_key(connection.private_key_file, connection.algorithm, connection.key_id)
            source = _SOURCES[identity] = TokenSource(connection, key, token_endpoint, timeout)
        return source
