"""Errors as RFC 9457 problem+json: one exception type, the handlers, and their place in the OpenAPI.

Every error any route returns has a stable `type` (…/problems/not-found, rate-limited, …) and no
traceback; the OpenAPI documents each status a /v1 route can answer with the Problem schema, so a
client (and schemathesis) can rely on the shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ebmrag.errors import EbmragError
from ebmrag.store.access import AccessError
from ebmrag.store.charts import IdempotencyConflictError
from ebmrag.store.database import StoreError

log = logging.getLogger(__name__)
PROBLEM = "https://ebmrag.dev/problems/"


class ProblemError(Exception):
    def __init__(self, status: int, kind: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.kind, self.detail, self.headers = status, kind, detail, headers or {}


def problem_response(status: int, kind: str, detail: str, request: Request | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"type": PROBLEM + kind, "title": kind.replace("-", " "), "status": status, "detail": detail}
    if request is not None:
        body["instance"] = request.url.path
    return JSONResponse(body, status, headers=headers, media_type="application/problem+json")


ACCESS_KINDS = {401: "unauthorized", 403: "forbidden", 404: "not-found"}
REFUSED = (413, 429)
PROBLEM_SCHEMA = {"type": "object", "required": ["type", "title", "status", "detail"],
                  "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                 "status": {"type": "integer"}, "detail": {"type": "string"},
                                 "instance": {"type": "string"}}}
_PROBLEMS = {"400": "malformed JSON, or an X-Request-ID or Idempotency-Key over 200 characters",
             "401": "no or bad key", "403": "the key's role may not",
             "404": "no such patient (or not this key's)", "409": "Idempotency-Key reused with another body",
             "413": "body too large", "415": "not JSON", "422": "invalid request or record", "429": "rate limited",
             "500": "internal error", "503": "store unavailable", "504": "took too long"}

def install_openapi(app: FastAPI) -> None:
    """Every error any route can return is documented as application/problem+json (FastAPI documents only
    its own 422, as application/json, which the handlers below never send)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
        problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                codes = _PROBLEMS if path.startswith("/v1/") else {"500": _PROBLEMS["500"], "503": _PROBLEMS["503"]}
                for code, description in codes.items():
                    operation.setdefault("responses", {})[code] = {"description": description, "content": problem}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


async def _audit_refused(request: Request, status: int) -> None:
    """Every refused attempt leaves an audit row: under the key when the guard knew it, at the route template
    when one matched (an unmatched path is recorded as "unmatched", never as the path the caller sent)."""
    service = getattr(request.app.state, "service", None)
    if service is None:
        return
    route = getattr(request.scope.get("route"), "path", "unmatched")
    patient = request.path_params.get("pid", "")
    await run_in_threadpool(service.audit_refused, getattr(request.state, "key", None), status, route,
                            getattr(request.state, "request_id", ""), patient, client_address(request))


def client_address(request: Request) -> str:
    """The address serve.guard found for the request (forwarded headers read only from trusted proxies), else the
    peer's."""
    found = getattr(request.state, "client_address", "")
    return str(found) if found else (request.client.host if request.client else "unknown")


def install_errors(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def on_problem(request: Request, exc: ProblemError) -> JSONResponse:
        if exc.status in REFUSED:  # a body too large, a rate or queue limit: refused attempts, audited
            await _audit_refused(request, exc.status)
        return problem_response(exc.status, exc.kind, exc.detail, request, exc.headers)

    @app.exception_handler(AccessError)
    async def on_access(request: Request, exc: AccessError) -> JSONResponse:
        await _audit_refused(request, exc.status)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return problem_response(exc.status, ACCESS_KINDS[exc.status], exc.detail, request, headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5])
        return problem_response(422, "invalid-request", where, request)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {400: "malformed-body", 404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        if exc.status_code == 404 and request.url.path.startswith(("/v1/", "/ui/")):
            await _audit_refused(request, 404)  # an id trick that reaches no route is a refused attempt too
        return problem_response(exc.status_code, kind, str(exc.detail), request)

    @app.exception_handler(StoreError)
    async def on_store(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error on %s: %s", request.url.path, type(exc).__name__)
        return problem_response(503, "store-unavailable", "the patient store is not reachable", request)

    @app.exception_handler(IdempotencyConflictError)
    async def on_conflict(request: Request, exc: IdempotencyConflictError) -> JSONResponse:
        return problem_response(409, "idempotency-conflict", str(exc), request)

    @app.exception_handler(EbmragError)
    async def on_ebmrag(request: Request, exc: EbmragError) -> JSONResponse:
        return problem_response(422, "invalid-record", str(exc), request)

    @app.exception_handler(ValueError)
    async def on_value(request: Request, exc: ValueError) -> JSONResponse:
        return problem_response(422, "invalid-request", str(exc), request)

    @app.exception_handler(Exception)
    async def on_anything(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected %s on %s", type(exc).__name__, request.url.path)  # no message: it may hold PHI
        return problem_response(500, "internal", "an internal error; the request id is in X-Request-ID", request)
