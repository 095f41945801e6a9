"""Who is calling a CDS service: the client's JWT checked as CDS Hooks 2.0 requires ("Trusting CDS Clients").

Every hook and feedback call carries `Authorization: Bearer <JWT>`. The token is refused (401) unless:
- its header names an asymmetric algorithm (ES384 and RS384 are the specification's; ES/RS/PS 256-512 are
  accepted; `none` and HMAC never), `typ` JWT and a `kid`;
- its `iss` is a trusted issuer ([cds.issuers.<name>]) and `kid` names a key of that issuer's JWK Set: a file on
  this server, or the configured `jwks_url` (fetched, cached, refetched for a new kid at most every 5 minutes);
  a `jku` header must be that URL, never another, and an issuer with a `jwks_file` takes none: the set of keys
  is never taken from the token;
- the key matches the algorithm (RSA for RS/PS, EC on the algorithm's curve for ES) and the signature verifies;
- `aud` is the URL of the endpoint called (string or list), `exp` is in the future but at most five minutes
  ahead, `iat` is not in the future, all within [cds] clock_skew_seconds;
- its `jti` has not been seen from that issuer before (a replay cache that keeps each id until its token
  expires; per worker process).
A refusal names the check that failed, never the token's contents. It carries, once the token named a trusted
issuer and a kid, that pair as a throttle name (serve.throttle): bad tokens are counted per address and per issuer
key, and a valid token is always checked and accepted, whatever came before it from its address.

A JWK Set URL that stops answering does not stop the service: the last set fetched is used for up to MAX_STALE
after its fetch (the failure logged once), and retried every RETRY_FAILED_AFTER. Each issuer's fetch holds its own
lock, so one slow EHR delays no other; while one call refetches, the others use the set they have.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt

from ebmrag.cds.params import CdsParams, TrustedIssuer
from ebmrag.ehr.wire import Exchange
from ebmrag.serve.throttle import named

ALGORITHMS = ("ES384", "RS384", "ES256", "ES512", "RS256", "RS512", "PS256", "PS384", "PS512")
_KEY_TYPES = {"ES": "EC", "RS": "RSA", "PS": "RSA"}
_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
MAX_LIFETIME = 300.0  # seconds a token may still have to live: CDS Hooks and SMART keep them short
REFETCH_AFTER = 300.0  # an unknown kid refetches an issuer's jwks_url at most this often
RETRY_FAILED_AFTER = 30.0  # after a failed fetch, the last good set is used this long before another try
MAX_STALE = 24 * 3600.0  # a JWK Set whose refetches fail is still used this long after its last good fetch
MAX_JWKS_BYTES = 1 << 20
MAX_REPLAY_ENTRIES = 200_000

log = logging.getLogger(__name__)


class CdsAuthError(Exception):
    """A refused token; the message says which check failed (answered 401). `client_fault`: False when the
    service could not check it (the issuer's JWK Set unavailable), so the caller's address is not counted as
    guessing. `credential`: the trusted issuer and key id the token claimed, as a throttle name (serve.throttle),
    when it got that far: a credential that keeps failing is throttled as such."""

    def __init__(self, message: str, client_fault: bool = True) -> None:
        super().__init__(message)
        self.client_fault = client_fault
        self.credential: str | None = None


@dataclass(frozen=True)
class CdsCaller:
    """The verified client: its issuer (and so its tenant) and the token's id."""

    issuer: TrustedIssuer
    jti: str

    @property
    def tenant(self) -> str:
        return self.issuer.tenant


class ReplayCache:
    """(issuer, jti) pairs seen, each kept until its token expires. Bounded: past MAX_REPLAY_ENTRIES the expired
    ones go, then the soonest to expire (whose tokens are about to be refused as expired anyway)."""

    def __init__(self, limit: int = MAX_REPLAY_ENTRIES) -> None:
        self.limit = limit
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def first_use(self, issuer: str, jti: str, until: float, now: float) -> bool:
        """Record the id; False when it was already used by a token that has not expired."""
        with self._lock:
            key = (issuer, jti)
            if self._seen.get(key, 0.0) > now:
                return False
            self._seen[key] = until
            if len(self._seen) > self.limit:
                self._seen = {k: v for k, v in self._seen.items() if v > now}
                if len(self._seen) > self.limit:
                    keep = sorted(self._seen.items(), key=lambda item: item[1])[len(self._seen) - self.limit:]
                    self._seen = dict(keep)
            return True


@dataclass(frozen=True)
class _Fetched:
    """One jwks_url's keys: when they were last fetched well (-inf: never) and when a fetch was last tried."""

    keys: dict[str, dict[str, Any]]
    good_at: float
    tried_at: float
    failing: bool = False


class KeySets:
    """The trusted issuers' JWK Sets by `kid`: a file is reread when it changes, a URL is fetched at most every
    `jwks_cache_seconds` (and once more for a kid it did not hold, at most every REFETCH_AFTER seconds); a failed
    refetch keeps the last good set for up to MAX_STALE (see the module doc)."""

    def __init__(self, params: CdsParams, http: httpx.Client | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.params, self.clock = params, clock
        self.http = http  # None: a client of its own per fetch, so one issuer's deadline never cuts another's
        self._files: dict[str, tuple[Any, dict[str, dict[str, Any]]]] = {}  # path -> (stamp, keys)
        self._urls: dict[str, _Fetched] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()  # held only to find or make a source's lock

    def key(self, issuer: TrustedIssuer, kid: str) -> dict[str, Any] | None:
        if issuer.jwks_file:
            with self._lock(issuer.jwks_file):
                return self._from_file(Path(issuer.jwks_file)).get(kid)
        return self._from_url(issuer, kid).get(kid)

    def _lock(self, source: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(source, threading.Lock())

    def _from_file(self, path: Path) -> dict[str, dict[str, Any]]:
        try:
            info = os.stat(path)
            stamp = (info.st_mtime_ns, info.st_size)
            cached = self._files.get(str(path))
            if cached is not None and cached[0] == stamp:
                return cached[1]
            keys = _key_set(path.read_bytes()[:MAX_JWKS_BYTES + 1])
        except OSError:
            raise CdsAuthError("the issuer's JWK Set file cannot be read", client_fault=False) from None
        self._files[str(path)] = (stamp, keys)
        return keys

    def _from_url(self, issuer: TrustedIssuer, kid: str) -> dict[str, dict[str, Any]]:
        """The issuer's keys, refetched when due. While another call refetches them, a usable set is used as it
        is rather than waited for."""
        url, lock = issuer.jwks_url, self._lock(issuer.jwks_url)
        if not lock.acquire(blocking=False):
            held = self._urls.get(url)
            if held is not None and self.clock() - held.good_at < MAX_STALE:
                return held.keys
            lock.acquire()
        try:
            held = self._urls.get(url)
            if held is None or self._due(held, kid):
                held = self._refetch(issuer, held)
            if self.clock() - held.good_at >= MAX_STALE:
                raise CdsAuthError("the issuer's JWK Set could not be fetched", client_fault=False)
            return held.keys
        finally:
            lock.release()

    def _due(self, held: _Fetched, kid: str) -> bool:
        now = self.clock()
        if now - held.tried_at < RETRY_FAILED_AFTER and held.failing:
            return False
        if now - held.good_at >= self.params.jwks_cache_seconds:
            return True
        return kid not in held.keys and now - held.tried_at >= REFETCH_AFTER

    def _refetch(self, issuer: TrustedIssuer, held: _Fetched | None) -> _Fetched:
        """A fetch; when it fails, the last good keys are kept (the failure logged once, not at every call)."""
        now = self.clock()
        try:
            fetched = _Fetched(self._fetch(issuer.jwks_url), now, now)
        except CdsAuthError as exc:
            if held is None or not held.failing:
                log.warning("CDS issuer %s: its JWK Set could not be fetched (%s); the last good set is used for up "
                            "to %g h after its fetch", issuer.name, exc, MAX_STALE / 3600)
            fetched = _Fetched(held.keys if held else {}, held.good_at if held else -math.inf, now, failing=True)
        else:
            if held is not None and held.failing:
                log.info("CDS issuer %s: its JWK Set is fetched again", issuer.name)
        self._urls[issuer.jwks_url] = fetched
        return fetched

    def _fetch(self, url: str) -> dict[str, dict[str, Any]]:
        """GET the JWK Set, read up to MAX_JWKS_BYTES + 1 bytes (a larger set is refused, not buffered)."""
        seconds = self.params.fetch_timeout_seconds
        http = self.http or httpx.Client(timeout=seconds, follow_redirects=False)
        request = http.build_request("GET", url, headers={"Accept": "application/json"})
        try:  # the whole exchange within the fetch timeout, its body inflated a bounded piece at a time (ehr.wire)
            with Exchange(http, request, header_seconds=seconds, until=time.monotonic() + seconds) as exchange:
                if exchange.reply.status_code != 200:
                    raise CdsAuthError(f"the issuer's JWK Set could not be fetched ({exchange.reply.status_code})",
                                       client_fault=False)
                body = bytearray()
                for piece in exchange.pieces():
                    body += piece
                    if len(body) > MAX_JWKS_BYTES:
                        break
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, ValueError):
            raise CdsAuthError("the issuer's JWK Set could not be fetched", client_fault=False) from None
        finally:
            if http is not self.http:
                http.close()
        return _key_set(bytes(body))


def _key_set(raw: bytes) -> dict[str, dict[str, Any]]:
    """A JWK Set's keys by kid (keys without a kid cannot be named by a token and are left out)."""
    if len(raw) > MAX_JWKS_BYTES:
        raise CdsAuthError("the issuer's JWK Set is larger than 1 MB", client_fault=False)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise CdsAuthError("the issuer's JWK Set is not JSON", client_fault=False) from None
    keys = data.get("keys") if isinstance(data, Mapping) else None
    if not isinstance(keys, list):
        raise CdsAuthError("the issuer's JWK Set has no keys list", client_fault=False)
    return {str(k["kid"]): dict(k) for k in keys if isinstance(k, Mapping) and isinstance(k.get("kid"), str)}


class ClientVerifier:
    """Checks a CDS client's bearer JWT against the trusted issuers (see the module doc)."""

    def __init__(self, params: CdsParams, keys: KeySets | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.params, self.clock = params, clock
        self.issuers = {found.iss: found for found in map(params.issuer, params.issuers)}
        self.keys = keys or KeySets(params)
        self.replays = ReplayCache()

    def verify(self, authorization: str | None, audiences: Sequence[str]) -> CdsCaller:
        """The caller of the endpoint at one of `audiences` (its URLs), or a CdsAuthError naming the failed
        check."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise CdsAuthError("the request needs Authorization: Bearer <JWT> signed by a trusted CDS client")
        token = token.strip()
        header, claims = _unverified(token)
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            raise CdsAuthError(f"the JWT's alg must be one of {', '.join(ALGORITHMS)}")
        if str(header.get("typ", "")).upper() != "JWT":
            raise CdsAuthError("the JWT's header must have typ JWT")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise CdsAuthError("the JWT's header has no kid")
        iss = claims.get("iss")
        issuer = self.issuers.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            raise CdsAuthError("the JWT's iss is not a trusted CDS client ([cds.issuers])")
        try:
            return self._signed(token, header, str(algorithm), issuer, kid, audiences)
        except CdsAuthError as exc:
            exc.credential = named("cds", issuer.name, kid)
            raise

    def _signed(self, token: str, header: Mapping[str, Any], algorithm: str, issuer: TrustedIssuer, kid: str,
                audiences: Sequence[str]) -> CdsCaller:
        """The checks after the issuer is known: jku, the key, the signature and claims, the jti."""
        jku = header.get("jku")
        if jku is not None and (not issuer.jwks_url or jku != issuer.jwks_url):
            raise CdsAuthError("the JWT's jku is not the issuer's configured jwks_url (an issuer with a jwks_file "
                               "takes none)")
        jwk = self.keys.key(issuer, kid)
        if jwk is None:
            raise CdsAuthError("the JWT's kid names no key of the issuer's JWK Set")
        payload = self._decode(token, _public_key(jwk, algorithm), algorithm, issuer, audiences)
        return CdsCaller(issuer, self._fresh(payload, issuer))

    def _decode(self, token: str, key: Any, algorithm: str, issuer: TrustedIssuer,
                audiences: Sequence[str]) -> dict[str, Any]:
        try:
            return jwt.decode(token, key, algorithms=[algorithm], audience=list(audiences), issuer=issuer.iss,
                              leeway=self.params.clock_skew_seconds,
                              options={"require": ["iss", "aud", "exp", "iat", "jti"]})
        except jwt.ExpiredSignatureError:
            raise CdsAuthError("the JWT has expired") from None
        except jwt.InvalidAudienceError:
            raise CdsAuthError("the JWT's aud is not the URL of the endpoint called") from None
        except jwt.ImmatureSignatureError:
            raise CdsAuthError("the JWT was issued in the future (iat or nbf)") from None
        except jwt.InvalidSignatureError:
            raise CdsAuthError("the JWT's signature does not verify with the issuer's key") from None
        except jwt.MissingRequiredClaimError as exc:
            raise CdsAuthError(f"the JWT has no {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            raise CdsAuthError(f"the JWT is not valid ({type(exc).__name__})") from None

    def _fresh(self, payload: Mapping[str, Any], issuer: TrustedIssuer) -> str:
        """The token's jti, once: its exp at most MAX_LIFETIME ahead, its id never seen before."""
        now = self.clock()
        expires = payload["exp"]
        if not isinstance(expires, (int, float)) or expires > now + MAX_LIFETIME + self.params.clock_skew_seconds:
            raise CdsAuthError("the JWT's exp is more than 5 minutes ahead")
        jti = payload["jti"]
        if not isinstance(jti, str) or not 1 <= len(jti) <= 256:
            raise CdsAuthError("the JWT's jti must be a string of 1 to 256 characters")
        if not self.replays.first_use(issuer.iss, jti, float(expires) + self.params.clock_skew_seconds, now):
            raise CdsAuthError("the JWT's jti was used before (a replayed token)")
        return jti


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise CdsAuthError("the bearer token is not a JWT") from None
    return dict(header), dict(claims)


def _public_key(jwk: Mapping[str, Any], algorithm: str) -> Any:
    """The JWK as a key for `algorithm`, when it is one: its kty and curve fit, its own alg (if any) agrees."""
    if jwk.get("kty") != _KEY_TYPES[algorithm[:2]] or ("alg" in jwk and jwk["alg"] != algorithm):
        raise CdsAuthError("the issuer's key for this kid is not a key for the JWT's alg")
    if algorithm in _CURVES and jwk.get("crv") != _CURVES[algorithm]:
        raise CdsAuthError("the issuer's key for this kid is not on the curve of the JWT's alg")
    if jwk.get("use", "sig") != "sig" or "d" in jwk:
        raise CdsAuthError("the issuer's key for this kid is not a public signing key")
    try:
        return jwt.PyJWK(dict(jwk), algorithm=algorithm).key
    except jwt.PyJWTError:
        raise CdsAuthError("the issuer's key for this kid cannot be read") from None
