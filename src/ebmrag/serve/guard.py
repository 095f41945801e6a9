"""The outermost layer of the service: no body is read for a caller without a valid key, and no body grows
past the limit while it streams.

FastAPI parses a JSON body into its pydantic model before the handler (and so the key check) runs, and a
chunked upload carries no Content-Length: a request without a key could make the server buffer hundreds of
megabytes before it answered 401 or 422. This ASGI middleware sits in front of everything:

- on /v1/ routes, the Authorization header is checked before a byte of the body is read; a missing or bad key
  is answered 401 at once (the handler still checks roles and patients);
- on every route, the body is counted as it arrives; past [serve] max_body_mb the request is answered 413 and
  the application sees the client gone, so nothing more is buffered.
"""

from __future__ import annotations

import json
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


Refused = Callable[[Scope, int], None]  # told of each request this layer answers itself: (scope, status)


class BodyGuard:
    def __init__(self, app: ASGIApp, store: PatientStore, max_bytes: int, refused: Refused | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app, self.store, self.max_bytes = app, store, max_bytes
        self.refused = refused or (lambda scope, status: None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if str(scope.get("path", "")).startswith(KEYED_PREFIX):
            try:
                await run_in_threadpool(authenticate, self.store, headers.get("authorization"))
            except AccessError as exc:
                await _problem(send, scope, exc.status, ACCESS_KINDS[exc.status], exc.detail,
                               {"www-authenticate": "Bearer"})
                self.refused(scope, exc.status)
                return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            await _problem(send, scope, 413, "payload-too-large", self._too_large())
            self.refused(scope, 413)
            return
        await self._counted(scope, receive, send)

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
                    await _problem(send, scope, 413, "payload-too-large", self._too_large())
                    self.refused(scope, 413)
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
               (b"connection", b"close")]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items() if status == 401]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
