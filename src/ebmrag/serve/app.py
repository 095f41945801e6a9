"""`ebmrag serve`: the HTTP service (FastAPI) over the patient store and one shared answer engine.

Every route under /v1 needs a bearer key (store.access); the key's tenant scopes every store call, and
a patient the key may not see is answered 404 exactly like one that does not exist. Every access is
audited (serve.audit) with the fragment ids it disclosed and no record text. Errors are RFC 9457
problem+json with a stable `type`; nothing returns a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi import Path as PathParameter
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match

from ebmrag.answer.engine import Engine
from ebmrag.compose import Resources, ServiceParts
from ebmrag.config import Settings
from ebmrag.serve.bodies import parse_json
from ebmrag.serve.cds_routes import install_cds
from ebmrag.serve.ehr_routes import install_ehr
from ebmrag.serve.guard import MAX_ID_CHARS, BodyGuard, client_of, request_id, scope_request_id, too_long
from ebmrag.serve.kb_routes import install_kb
from ebmrag.serve.models import AskBody, PackBody, SearchBody
from ebmrag.serve.problems import ProblemError, install_errors, install_openapi, problem_response
from ebmrag.serve.service import (
    Service,
    bounded_body,
    caller,
    dumps,
    encoded,
    json_response,
    read_record,
    stored,
    stored_record,
    stream_ask,
    wait_for_results,
)
from ebmrag.serve.telemetry import install_telemetry, native_telemetry_off, render_metrics
from ebmrag.serve.ui import install_ui
from ebmrag.store.access import (
    ERASE,
    NAME_PATTERN,
    READ,
    SEARCH,
    WRITE,
    AccessError,
    require,
    valid_name,
)
from ebmrag.store.keys import ApiKey
from ebmrag.store.patients import PatientStore
from ebmrag.store.results import MessageError, apply_message, parse_message

log = logging.getLogger(__name__)


PatientId = Annotated[str, PathParameter(pattern=NAME_PATTERN, description="the patient's id within the key's tenant")]
_FRAGMENT = {"type": "object", "required": ["id", "text"],
             "properties": {"id": {"type": "string", "minLength": 1}, "text": {"type": "string", "minLength": 1},
                            "section": {"type": "string"}, "timestamp": {"type": "string", "format": "date-time"},
                            "source": {"type": "string"}, "encounter": {"type": "string"}}}
RECORD_BODY = {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "required": ["patient_id", "fragments"], "properties": {
        "patient_id": {"type": "string", "minLength": 1},
        "fragments": {"type": "array", "minItems": 1, "items": _FRAGMENT}}}},
    "application/fhir+json": {"schema": {"type": "object", "required": ["resourceType"],
                                         "description": "a FHIR R4 Bundle of one patient"}},
    "application/xml": {"schema": {"type": "string", "description": "a C-CDA R2.1 document or a FHIR XML Bundle "
                                                                    "(also text/xml, application/cda+xml, "
                                                                    "application/fhir+xml)"}},
    "application/fhir+ndjson": {"schema": {"type": "string", "description": "one patient's FHIR Bulk Data NDJSON"}}}}


def create_app(store: PatientStore, settings: Settings | None = None, engine: Engine | None = None,
               resources: Resources | None = None) -> FastAPI:
    """`engine` and `resources`: built already (with the resources the engine was built from); without them, the
    composition root builds both on first use (`compose.ServiceParts`)."""
    settings = settings or Settings()
    service = Service(store, settings, ServiceParts(settings, resources, engine))
    app = FastAPI(title="ebmrag", version="1", description="Evidence-graded context for clinical assistants.",
                  **native_telemetry_off())  # its spans hold paths: ours (serve.telemetry) hold route templates
    app.state.service = service
    install_openapi(app)
    install_errors(app)
    _install_middleware(app, service)
    _install_health(app, service)
    _install_patients(app, service)
    _install_answers(app, service)
    install_kb(app, service)
    install_ehr(app, service)
    install_cds(app, service)
    install_ui(app, service, stored)
    async def refused(scope: Any, status: int) -> None:
        route = _route_of(app, scope)
        service.metrics.observe(route, status, 0.0)
        await run_in_threadpool(service.audit_refused, scope.get("state", {}).get("key"), status, route,
                                scope_request_id(scope), "", client_of(scope))  # the key when known: a revoked one

    app.add_middleware(BodyGuard, store=store, max_bytes=int(settings.serve.max_body_mb * 2**20),  # outermost
                       refused=refused, failed_keys=service.failed_keys, clients=service.clients,
                       on_shutdown=service.throttled.close)  # the bursts of 429s still counted are audited
    install_telemetry(app, service)  # the request spans around everything, the guard too
    return app


def _route_of(app: FastAPI, scope: Any) -> str:
    """The route template a request would reach ("/v1/patients/{pid}/ask"), for the metrics of requests the
    guard answers before routing."""
    for route in app.router.routes:
        if route.matches(scope)[0] is Match.FULL:
            return str(getattr(route, "path", "unmatched"))
    return "unmatched"


def _install_middleware(app: FastAPI, service: Service) -> None:
    limit = int(service.settings.serve.max_body_mb * 2**20)

    @app.middleware("http")
    async def frame(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if not getattr(request.state, "request_id", ""):  # the guard made it (and refused one too long); else here
            sent = request.headers.get("x-request-id")
            request.state.request_id = request_id(sent if sent and len(sent) <= MAX_ID_CHARS else None)
        length = request.headers.get("content-length")
        started = asyncio.get_running_loop().time()
        if length and length.isdigit() and int(length) > limit:
            response: Response = problem_response(413, "payload-too-large",
                                                  f"the body is larger than {service.settings.serve.max_body_mb:g} MB",
                                                  request)
        else:
            try:
                response = await call_next(request)
            except Exception as exc:  # the handlers above answer almost everything; this is the last net
                # the route's template, never the path: /v1/patients/<id>/... names a patient; the exception's type,
                # never its message, which may quote a chart
                log.error("unhandled error on %s (%s)", getattr(request.scope.get("route"), "path",
                                                               "an unmatched route"), type(exc).__qualname__)
                response = problem_response(500, "internal", "an internal error", request)
        response.headers["X-Request-ID"] = request.state.request_id
        route = request.scope.get("route")
        service.metrics.observe(getattr(route, "path", "unmatched"), response.status_code,
                                asyncio.get_running_loop().time() - started)
        return response


def _install_health(app: FastAPI, service: Service) -> None:
    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        try:
            await run_in_threadpool(service.store.ping)
        except Exception:
            return problem_response(503, "store-unavailable", "the patient store is not reachable")
        return JSONResponse({"status": "ready", "store": service.store.backend,
                             "row_security": bool(getattr(service.store, "row_security", False))})

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(service),
                                 media_type="text/plain; version=0.0.4")


def _install_patients(app: FastAPI, service: Service) -> None:
    store = service.store

    async def visible(request: Request, pid: str, action: str) -> tuple[ApiKey, str]:
        key = await caller(request, service)
        valid_name(pid, "patient id")
        require(key, action, pid)
        return key, pid

    @app.put("/v1/patients/{pid}", tags=["patients"], openapi_extra={"requestBody": RECORD_BODY})
    async def put_patient(pid: PatientId, request: Request) -> dict[str, Any]:
        key, pid = await visible(request, pid, WRITE)
        record = await read_record(request, pid, service.settings.chart)
        count = await run_in_threadpool(store.put_record, key.tenant, pid, record)
        service.prepare(key.tenant, pid)  # in the background: the response does not wait for it
        service.audit(key, pid, "put", request, tuple(f.id for f in record.fragments))
        return {"patient": pid, "fragments": count, "record_skipped": list(record.skipped)}

    @app.post("/v1/patients/{pid}/fragments", tags=["patients"], openapi_extra={"requestBody": RECORD_BODY})
    async def add_fragments(pid: PatientId, request: Request) -> dict[str, Any]:
        key, pid = await visible(request, pid, WRITE)
        idem = request.headers.get("idempotency-key")
        if idem and len(idem) > MAX_ID_CHARS:  # refused before the body is read; the store compares whole keys
            raise ProblemError(400, "invalid-idempotency-key", too_long("Idempotency-Key header", idem))
        record = await read_record(request, pid, service.settings.chart)

        def respond(added: int, replaced: int) -> dict[str, Any]:
            return {"patient": pid, "added": added, "replaced": replaced, "record_skipped": list(record.skipped)}

        if idem:
            result = await run_in_threadpool(store.upsert_idempotent, key.tenant, pid, idem, record, respond)
        else:
            result = respond(*await run_in_threadpool(store.upsert_fragments, key.tenant, pid, record))
        service.prepare(key.tenant, pid)  # only what is new is computed
        service.audit(key, pid, "append", request, tuple(f.id for f in record.fragments))
        return result

    @app.get("/v1/patients/{pid}/fragments", tags=["patients"])
    async def list_fragments(pid: PatientId, request: Request) -> Response:
        key, pid = await visible(request, pid, READ)
        record = await stored(service, key, pid)
        classified, prepared = await service.run(lambda: (service.classify(record), service.prepared(record)),
                                                 tenant=key.tenant, patient=pid, engine=False)
        service.audit(key, pid, "read", request, tuple(f.id for f in classified.fragments))
        return await encoded({
            "patient": pid, "record_skipped": list(record.skipped), "prepared_fragments": prepared, "fragments": [
                {"id": f.id, "text": f.text, "section": f.section,
                 "timestamp": f.timestamp.isoformat() if f.timestamp else None, "encounter": f.encounter,
                 "tier": f.tier.value, "rule": f.decision.rule_id if f.decision else "",
                 "must_keep": bool(f.decision and f.decision.must_keep)} for f in classified.fragments]})

    @app.delete("/v1/patients/{pid}", tags=["patients"])
    async def erase_patient(pid: PatientId, request: Request) -> dict[str, Any]:
        key, pid = await visible(request, pid, ERASE)
        erased = await run_in_threadpool(store.delete_patient, key.tenant, pid)
        if erased is None:
            raise AccessError(404, "no such patient")
        service.audit(key, pid, "erase", request, tuple(f.id for f in erased))  # committed: audited whatever follows
        forgotten = await service.run(lambda: service.forget(erased, key.tenant, pid), tenant=key.tenant,
                                      engine=False, seconds=service.erase_seconds())
        return {"patient": pid, "erased_fragments": len(erased), "cache_entries_forgotten": forgotten}


def _install_answers(app: FastAPI, service: Service) -> None:
    @app.post("/v1/patients/{pid}/ask", tags=["answers"], response_model=None,
              responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                               "description": "the ask JSON; with Accept: text/event-stream, stage events, the "
                                              "answer text, then the same JSON as a `result` event"}})
    async def ask(pid: PatientId, body: AskBody, request: Request) -> Response:
        key = await caller(request, service)
        valid_name(pid, "patient id")
        require(key, READ, pid)
        waited = await wait_for_results(service, key, pid, body.wait_ms)
        pending = await run_in_threadpool(service.store.pending, key.tenant, pid)
        engine = await run_in_threadpool(service.engine, body.retrieval)  # the first call loads the model
        if "text/event-stream" in request.headers.get("accept", ""):
            record = service.check_chart(await stored(service, key, pid))
            return StreamingResponse(stream_ask(service, engine, key, pid, body, record, request),
                                     media_type="text/event-stream")

        def answer() -> tuple[tuple[str, ...], bytes]:
            """Reading the chart, answering and writing the JSON in one engine job: the scheduler's turns and
            checkpoints govern all of a large chart's work, not only the answer."""
            record = service.check_chart(stored_record(service, key, pid))
            result = engine.ask(body.question, record, body.window)
            data = result.to_json()
            data["trace"]["pending_results"] = pending  # announced, not arrived: the answer could not use them
            data["trace"]["waited_ms"] = waited
            return tuple(i.id for i in result.items), dumps(data)

        items, answered = await service.run(answer, tenant=key.tenant, patient=pid)
        service.audit(key, pid, "ask", request, items)
        return json_response(answered)

    @app.post("/v1/results", tags=["results"])
    async def post_results(request: Request) -> dict[str, Any]:
        """The gateway without a broker: the same messages and the same store logic as `ebmrag gateway run`,
        for one machine. A message for another tenant, or a patient the key may not see, is refused."""
        key = await caller(request, service)
        require(key, WRITE)
        raw = parse_json(await bounded_body(request))  # bounded (serve.bodies): a bad body is a 400 naming why
        outcomes: Counter[str] = Counter()
        rejected = []
        for index, item in enumerate(raw if isinstance(raw, list) else [raw]):
            try:
                message = parse_message(item if isinstance(item, dict) else json.dumps(item))
                if message.tenant != key.tenant or not key.may_see(message.patient_id):
                    raise MessageError("the message names a tenant or patient this key may not write")
                outcome = await run_in_threadpool(apply_message, service.store, message)
                outcomes[outcome] += 1
                if outcome == "stored":
                    service.prepare(message.tenant, message.patient_id)
                service.audit(key, message.patient_id, "result", request, (message.fragment_id,))
            except MessageError as exc:
                rejected.append({"index": index, "reason": str(exc)})
        return {"stored": outcomes["stored"], "pending": outcomes["pending"], "rejected": rejected}

    @app.post("/v1/patients/{pid}/pack", tags=["answers"])
    async def pack(pid: PatientId, body: PackBody, request: Request) -> Response:
        key = await caller(request, service)
        valid_name(pid, "patient id")
        require(key, READ, pid)
        record = service.check_chart(await stored(service, key, pid))
        result = await service.run(lambda: service.pack(record, body.query, body.window, body.strategy),
                                   tenant=key.tenant, patient=pid)
        service.audit(key, pid, "pack", request, tuple(p.fragment_id for p in result.packed))
        return await encoded(dict(await run_in_threadpool(result.to_json), context=result.context))

    @app.post("/v1/search", tags=["answers"])
    async def search(body: SearchBody, request: Request) -> list[dict[str, Any]]:
        key = await caller(request, service)
        require(key, SEARCH)

        def run() -> list[dict[str, Any]]:
            hits = service.retriever(body.mode or None).run(body.query, body.k)
            return [h.to_json() for h in hits]

        hits: list[dict[str, Any]] = await service.run(run, tenant=key.tenant)
        service.audit(key, "", "search", request)
        return hits


def app_from_environment() -> FastAPI:
    """The app of one worker process of `ebmrag serve --workers N` (uvicorn imports it by name)."""
    from ebmrag.config import load_settings, with_overrides

    config = os.environ.get("EBMRAG_SERVE_CONFIG") or None
    settings = with_overrides(load_settings(config), serve={"kb": os.environ.get("EBMRAG_SERVE_KB") or None})
    return serve_app(Path(os.environ["EBMRAG_SERVE_DATA_DIR"]), settings, os.environ.get("EBMRAG_STORE_URL", ""))


def serve_app(data_dir: Path, settings: Settings, store_url: str = "") -> FastAPI:
    """The app a server process runs. It sets the process's thread switch interval ([serve] switch_interval_ms):
    engine work is mostly Python under one interpreter lock, and a shorter interval lets the event loop and a small
    request's thread take the lock back sooner from a large request's."""
    from ebmrag.store.patients import open_store

    sys.setswitchinterval(settings.serve.switch_interval_ms / 1000)
    return create_app(open_store(data_dir, store_url or settings.serve.store_url, settings.serve.audit_key_file),
                      settings)
