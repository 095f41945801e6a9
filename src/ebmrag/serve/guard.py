"""The outermost layer of the service: no body is read for a caller without a valid key, and no body grows
past the limit while it streams.

FastAPI parses a JSON body into its pydantic model before the handler (and so the key check) runs, and a
chunked upload carries no Content-Length: a request without a key could make the server buffer hundreds of
megabytes before it answered 401 or 422. This ASGI middleware sits in front of everything:

- every request gets its id here (an `X-Request-ID` over MAX_ID_CHARS is refused 400, never cut short) and its
  client address (serve.clients: forwarded headers are read only from [serve] trusted_proxies);
- on /v1/ routes, the Authorization header is checked before a byte of the body is read; a missing or bad key
  is answered 401 at once (the handler still checks roles and patients);
- on every route, the body is counted as it arrives; past [serve] max_body_mb the request is answered 413 and
  the application sees the client gone, so nothing more is buffered;
- failed keys are counted per address and per key id (serve.throttle): past the allowance a failure is answered
  429 instead of 401. The key is always checked first, so a valid key passes whatever its address sent before.
Every request this layer refuses is reported to `refused` (the service audits and counts it) before it is
answered, so the audit row exists when the client reads the answer. When the server stops, `on_shutdown` runs
(the service writes what it still holds for the audit).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool

from ebmrag.serve.clients import ClientAddresses
from ebmrag.serve.problems import ACCESS_KINDS, PROBLEM
from ebmrag.serve.throttle import FailedCredentials, key_credential
from ebmrag.store.access import AccessError, authenticate
from ebmrag.store.patients import PatientStore

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
KEYED_PREFIX = "/v1/"


Refused = Callable[[Scope, int], Awaitable[None]]  # told of each request this layer answers itself
MAX_ID_CHARS = 200  # an X-Request-ID, a JSON-RPC id or an Idempotency-Key longer than this is refused, never cut


class BodyGuard:
    def __init__(self, app: ASGIApp, store: PatientStore, max_bytes: int, refused: Refused | None = None,
                 failed_keys: FailedCredentials | None = None, keyed_prefix: str = KEYED_PREFIX, id_prefix: str = "",
                 clients: ClientAddresses | None = None, on_shutdown: Callable[[], None] | None = None) -> None:
        """`failed_keys`: shared with the other ways in (the /ui sign-in, CDS Hooks), so a guesser gains nothing by
        switching between them. `keyed_prefix`: the paths that need a key ("/" for MCP's HTTP transport).
        `id_prefix`: put before every request id this layer makes ("mcp-"). `clients`: how the client's address is
        read ([serve] trusted_proxies; default: the peer's). `on_shutdown`: run when the server stops."""
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app, self.store, self.max_bytes, self.keyed_prefix = app, store, max_bytes, keyed_prefix
        self.id_prefix = id_prefix
        self.refused = refused or _ignore
        self.failed_keys = failed_keys if failed_keys is not None else FailedCredentials()
        self.clients = clients or ClientAddresses()
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" and self.on_shutdown is not None:
            await self.app(scope, receive, self._after_shutdown(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        state = scope.setdefault("state", {})
        # made here, so a request this layer refuses carries the id its audit row has (request.state.request_id)
        sent = headers.get("x-request-id")
        state["request_id"] = request_id(sent if sent is None or len(sent) <= MAX_ID_CHARS else None, self.id_prefix)
        state["client_address"] = self.clients.of(scope)
        if sent is not None and len(sent) > MAX_ID_CHARS:
            await _problem(send, scope, 400, "invalid-request-id", too_long("X-Request-ID header", sent))
            return
        if str(scope.get("path", "")).startswith(self.keyed_prefix) and not await self._key_ok(scope, headers, send):
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            await self.refused(scope, 413)
            await _problem(send, scope, 413, "payload-too-large", self._too_large())
            return
        await self._counted(scope, receive, send)

    def _after_shutdown(self, send: Send) -> Send:
        """`send` for the lifespan protocol: `on_shutdown` runs before the server is told the application stopped."""
        async def sending(message: Message) -> None:
            if message.get("type") in ("lifespan.shutdown.complete", "lifespan.shutdown.failed") and self.on_shutdown:
                await run_in_threadpool(self.on_shutdown)
            await send(message)

        return sending

    async def _key_ok(self, scope: Scope, headers: dict[str, str], send: Send) -> bool:
        """The key, checked first; a failure is counted against the address and the key id it named, and answered
        429 once either has failed too often (a valid key is never refused for that)."""
        authorization = headers.get("authorization")
        state = scope.setdefault("state", {})
        try:
            key = await run_in_threadpool(authenticate, self.store, authorization)
        except AccessError as exc:
            if exc.key is not None:  # a revoked or expired key: `refused` audits under it (request.state.key)
                state["key"] = exc.key
            wait = self.failed_keys.failed(client_of(scope), key_credential(authorization))
            if wait > 0:
                await self.refused(scope, 429)
                await _problem(send, scope, 429, "rate-limited", "too many failed keys from this address or for "
                                                                 "this key; a valid key is still accepted",
                               {"retry-after": str(max(1, round(wait))), "www-authenticate": "Bearer"})
                return False
            await self.refused(scope, exc.status)
            await _problem(send, scope, exc.status, ACCESS_KINDS[exc.status], exc.detail,
                           {"www-authenticate": "Bearer"})
            return False
        state["key"] = key  # a later refusal (413) is audited under it
        return True

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the application with a receive that counts the body and a send that is silenced once this
        layer has answered 413 itself."""
        state = {"size": 0, "refused": False}

        async def counting_receive() -> Message:
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["size"] += len(message.get("body", b""))
                if state["size"] > self.max_bytes:
                    state["refused"] = True
                    await self.refused(scope, 413)
                    await _problem(send, scope, 413, "payload-too-large", self._too_large())
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not state["refused"]:
                await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not state["refused"]:
                raise  # a refused body ends as a client disconnect inside the application: already answered

    def _too_large(self) -> str:
        return f"the body is larger than {self.max_bytes / 2**20:g} MB"


async def _problem(send: Send, scope: Scope, status: int, kind: str, detail: str,
                   extra: dict[str, str] | None = None) -> None:
    body = json.dumps({"type": PROBLEM + kind, "title": kind.replace("-", " "), "status": status, "detail": detail,
                       "instance": str(scope.get("path", ""))}).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"x-request-id", str(scope.get("state", {}).get("request_id", "")).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_CLIENT_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_ID_CHARS}}}")


def request_id(sent: str | None, prefix: str = "") -> str:
    """Server-made and unique: a client's id is kept as a prefix only when it is plain (no names, dates of birth
    or markup reach the audit or the logs; the guard refuses one over MAX_ID_CHARS), and never alone, so ids
    cannot repeat."""
    made = uuid.uuid4().hex
    return f"{prefix}{sent}.{made[:12]}" if sent and _CLIENT_ID.fullmatch(sent) else f"{prefix}{made}"


def too_long(what: str, value: str) -> str:
    """The refusal of an id over MAX_ID_CHARS: named, never cut short (two ids equal in their first characters
    would become one)."""
    return f"the {what} is {len(value):,} characters long; at most {MAX_ID_CHARS} are accepted"


def scope_request_id(scope: Scope) -> str:
    """The id this layer gave the request (one is made when the layer did not see it: a test calling an app)."""
    return str(scope.get("state", {}).get("request_id") or uuid.uuid4().hex)


def client_of(scope: Scope) -> str:
    """The client address this layer found for the request (the peer's when the layer did not see it)."""
    found = scope.get("state", {}).get("client_address")
    return str(found) if found else ClientAddresses().of(scope)


async def _ignore(scope: Scope, status: int) -> None:
    return None
