"""The outermost layer of the service: no body is read for a caller without a valid key, and no body grows
past the limit while it streams.

FastAPI parses a JSON body into its pydantic model before the handler (and so the key check) runs, and a
chunked upload carries no Content-Length: a request without a key could make the server buffer hundreds of
megabytes before it answered 401 or 422. This ASGI middleware sits in front of everything:

- on /v1/ routes, the Authorization header is checked before a byte of the body is read; a missing or bad key
  is answered 401 at once (the handler still checks roles and patients);
- on every route, the body is counted as it arrives; past [serve] max_body_mb the request is answered 413 and
  the application sees the client gone, so nothing more is buffered;
- a client address that keeps sending bad keys is answered 429 without its key being tried
  (FAILED_KEYS_BURST at once, then FAILED_KEYS_PER_SECOND), so keys cannot be guessed at network speed.
Every request this layer refuses is reported to `refused` (the service audits and counts it) before it is
answered, so the audit row exists when the client reads the answer.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool

from ebmrag.serve.problems import ACCESS_KINDS, PROBLEM
from ebmrag.store.access import AccessError, authenticate
from ebmrag.store.patients import PatientStore

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
KEYED_PREFIX = "/v1/"


Refused = Callable[[Scope, int], Awaitable[None]]  # told of each request this layer answers itself
FAILED_KEYS_BURST = 20
FAILED_KEYS_PER_SECOND = 0.5


class FailedKeys:
    """Bad-key attempts per client address: a bucket of FAILED_KEYS_BURST that refills slowly."""

    def __init__(self, burst: float = FAILED_KEYS_BURST, rate: float = FAILED_KEYS_PER_SECOND) -> None:
        self.burst, self.rate = burst, rate
        self._left: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _tokens(self, client: str, moment: float) -> float:
        tokens, last = self._left.get(client, (self.burst, moment))
        return min(self.burst, tokens + (moment - last) * self.rate)

    def wait(self, client: str) -> float:
        """Seconds until this client may try a key again (0: now)."""
        with self._lock:
            tokens = self._tokens(client, time.monotonic())
            return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def failed(self, client: str) -> None:
        with self._lock:
            moment = time.monotonic()
            self._left[client] = (max(0.0, self._tokens(client, moment) - 1), moment)
            if len(self._left) > 100_000:  # bounded memory under a spoofed-address flood: forget the oldest half
                for stale in sorted(self._left, key=lambda c: self._left[c][1])[:50_000]:
                    del self._left[stale]


class BodyGuard:
    def __init__(self, app: ASGIApp, store: PatientStore, max_bytes: int, refused: Refused | None = None,
                 failed_keys: FailedKeys | None = None, keyed_prefix: str = KEYED_PREFIX, id_prefix: str = "") -> None:
        """`failed_keys`: shared with the other ways in (the /ui sign-in), so a guesser gains nothing by
        switching between them. `keyed_prefix`: the paths that need a key ("/" for MCP's HTTP transport).
        `id_prefix`: put before every request id this layer makes ("mcp-")."""
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app, self.store, self.max_bytes, self.keyed_prefix = app, store, max_bytes, keyed_prefix
        self.id_prefix = id_prefix
        self.refused = refused or _ignore
        self.failed_keys = failed_keys if failed_keys is not None else FailedKeys()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        # made here, so a request this layer refuses carries the id its audit row has (request.state.request_id)
        scope.setdefault("state", {})["request_id"] = request_id(headers.get("x-request-id"), self.id_prefix)
        if str(scope.get("path", "")).startswith(self.keyed_prefix) and not await self._key_ok(scope, headers, send):
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            await self.refused(scope, 413)
            await _problem(send, scope, 413, "payload-too-large", self._too_large())
            return
        await self._counted(scope, receive, send)

    async def _key_ok(self, scope: Scope, headers: dict[str, str], send: Send) -> bool:
        client = str((scope.get("client") or ("unknown",))[0])
        wait = self.failed_keys.wait(client)
        if wait > 0:
            await self.refused(scope, 429)
            await _problem(send, scope, 429, "rate-limited", "too many bad keys from this address",
                           {"retry-after": str(max(1, round(wait)))})
            return False
        try:
            key = await run_in_threadpool(authenticate, self.store, headers.get("authorization"))
        except AccessError as exc:
            self.failed_keys.failed(client)
            if exc.key is not None:  # a revoked or expired key: `refused` audits under it (request.state.key)
                scope.setdefault("state", {})["key"] = exc.key
            await self.refused(scope, exc.status)
            await _problem(send, scope, exc.status, ACCESS_KINDS[exc.status], exc.detail,
                           {"www-authenticate": "Bearer"})
            return False
        scope.setdefault("state", {})["key"] = key  # a later refusal (413) is audited under it
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


_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id(sent: str | None, prefix: str = "") -> str:
    """Server-made and unique: a client's id is kept as a prefix only when it is short and plain (no names,
    dates of birth or 20 KB strings reach the audit or the logs), and never alone, so ids cannot repeat."""
    made = uuid.uuid4().hex
    return f"{prefix}{sent}.{made[:12]}" if sent and _CLIENT_ID.fullmatch(sent) else f"{prefix}{made}"


def scope_request_id(scope: Scope) -> str:
    """The id this layer gave the request (one is made when the layer did not see it: a test calling an app)."""
    return str(scope.get("state", {}).get("request_id") or uuid.uuid4().hex)


async def _ignore(scope: Scope, status: int) -> None:
    return None
