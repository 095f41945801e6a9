"""The service's observability (docs/observability.md): a server span per request, the queue-depth gauges, and the
text of `/metrics`.

`RequestTracing` is the outermost ASGI layer, so a request the key guard refuses has its span too. The span is
named by the method and the route TEMPLATE (`POST /v1/patients/{pid}/ask`), never the path, which holds patient
ids; its attributes are the method, the template, the status code and the scheme. A caller's W3C `traceparent`
makes it a child of the caller's trace (observe.tracing.remote_parent reads nothing else of the headers). Engine
work carries the span onto the scheduler's threads (observe.tracing.bind), so the stage and model spans hang
below it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import FastAPI
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.routing import Match, Router

from ebmrag import __version__
from ebmrag.observe.metrics import REGISTRY, Family
from ebmrag.observe.setup import configure
from ebmrag.observe.tracing import FAILED, annotate, remote_parent, span
from ebmrag.serve.guard import ASGIApp, Message, Receive, Scope, Send
from ebmrag.serve.outbound import render_lanes
from ebmrag.serve.service import Service

UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
QUEUE_DEPTH = Family("ebmrag_queue_depth", "Work waiting: requests for an engine slot (engine), charts for their "
                     "background preparation (prepare).", ("queue",), "ebmrag.queue.depth", "{item}",
                     ("ebmrag.queue",))


def native_telemetry_off() -> dict[str, Any]:
    """FastAPI(...) options that turn FastAPI's own OpenTelemetry off (newer FastAPI has it on by default): its
    request spans carry `url.path` and `url.query`, patient ids, and its logs exception messages; environment
    variables could even make it export on its own. Older FastAPI has none: no option."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False,
                          "auto_configure": False}}


def install_telemetry(app: FastAPI, service: Service) -> None:
    """Export as [observe] says (once per process), the queue gauges, and the request spans: call it after every
    other middleware is added, so that its layer is the outermost."""
    configure(service.settings.observe, version=__version__)
    service.metrics.registry.gauge(QUEUE_DEPTH, partial(_queue_depths, service))
    app.add_middleware(RequestTracing, routes=partial(route_template, app.router))


def render_metrics(service: Service) -> str:
    """`/metrics`: this service's requests and queues, the scheduler's work, and the process's stages, model calls
    and gateway messages (observe.instruments)."""
    return (service.metrics.render() + service.scheduler.render()
            + render_lanes((service.ehr_calls, service.cds_fetches)) + REGISTRY.render())


def route_template(router: Router, scope: Scope) -> str:
    """The route a request reached (or would have reached, when the guard answered first), as its template."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in router.routes if r.matches(scope)[0] is Match.FULL), None)
    return str(getattr(route, "path", UNMATCHED)) if route is not None else UNMATCHED


def _queue_depths(service: Service) -> dict[tuple[str, ...], float]:
    return {("engine",): service.scheduler.state()["waiting"],
            ("prepare",): service.preparer.pending() if service.preparer is not None else 0}


class RequestTracing:
    """A SERVER span around each HTTP request (module doc); 5xx answers mark it failed."""

    def __init__(self, app: ASGIApp, routes: Callable[[Scope], str]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "") if scope.get("method") in METHODS else "_OTHER"
        status = 500  # the app raised before it answered

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with span(method, {"http.request.method": method, "url.scheme": str(scope.get("scheme", "http"))},
                  kind=SpanKind.SERVER, parent=remote_parent(_header(scope, b"traceparent"))) as current:
            try:
                await self.app(scope, receive, sending)
            finally:
                _finish(current, method, self.routes(scope), status)


def _finish(current: Any, method: str, route: str, status: int) -> None:
    if not current.is_recording():
        return
    if route != UNMATCHED:
        current.update_name(f"{method} {route}")
        annotate(current, {"http.route": route})
    annotate(current, {"http.response.status_code": status})
    if status >= 500:
        current.set_attribute("error.type", str(status))
        current.set_status(Status(StatusCode.ERROR, FAILED))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None
