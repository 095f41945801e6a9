"""`ebmrag serve`: the HTTP service (FastAPI) over the patient store and one shared answer engine.

Every route under /v1 needs a bearer key (serve.access); the key's tenant scopes every store call, and
a patient the key may not see is answered 404 exactly like one that does not exist. Every access is
audited (serve.audit) with the fragment ids it disclosed and no record text. Errors are RFC 9457
problem+json with a stable `type`; nothing returns a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi import Path as PathParameter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ebmrag.agent.engine import Engine
from ebmrag.config import Settings
from ebmrag.errors import EbmragError
from ebmrag.evidence.fhir import record_from_fhir_bundle
from ebmrag.evidence.fragment import Fragment, PatientRecord
from ebmrag.evidence.loaders import record_from_json
from ebmrag.generate.staged import StageTrace
from ebmrag.index.kb import KnowledgeBase, knowledge_base_stats
from ebmrag.index.search import HybridRetriever
from ebmrag.ingest.documents import Document, normalize_text
from ebmrag.packing.packer import STRATEGIES, ContextPacker
from ebmrag.serve import audit
from ebmrag.serve.access import (
    ERASE,
    KB_ADMIN,
    NAME_PATTERN,
    READ,
    SEARCH,
    WRITE,
    AccessError,
    authenticate,
    require,
    valid_name,
)
from ebmrag.serve.limits import Metrics, RateLimiter
from ebmrag.serve.models import AskBody, PackBody, SearchBody, UploadBody
from ebmrag.serve.results import MessageError, apply_message, parse_message
from ebmrag.serve.store import ApiKey, PatientStore, StoreError
from ebmrag.serve.ui import install_ui

log = logging.getLogger(__name__)
PROBLEM = "https://ebmrag.dev/problems/"
JSON_TYPES = ("application/json", "application/fhir+json")


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


PatientId = Annotated[str, PathParameter(pattern=NAME_PATTERN, description="the patient's id within the key's tenant")]
_ACCESS_KINDS = {401: "unauthorized", 403: "forbidden", 404: "not-found"}
PROBLEM_SCHEMA = {"type": "object", "required": ["type", "title", "status", "detail"],
                  "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                 "status": {"type": "integer"}, "detail": {"type": "string"},
                                 "instance": {"type": "string"}}}
_PROBLEMS = {"400": "malformed JSON", "401": "no or bad key", "403": "the key's role may not", "404":
             "no such patient (or not this key's)", "413": "body too large", "415": "not JSON", "422": "invalid "
             "request or record", "429": "rate limited", "500": "internal error", "503": "store unavailable",
             "504": "took too long"}
_FRAGMENT = {"type": "object", "required": ["id", "text"],
             "properties": {"id": {"type": "string", "minLength": 1}, "text": {"type": "string", "minLength": 1},
                            "section": {"type": "string"}, "timestamp": {"type": "string", "format": "date-time"},
                            "source": {"type": "string"}, "encounter": {"type": "string"}}}
RECORD_BODY = {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "required": ["patient_id", "fragments"], "properties": {
        "patient_id": {"type": "string", "minLength": 1},
        "fragments": {"type": "array", "minItems": 1, "items": _FRAGMENT}}}},
    "application/fhir+json": {"schema": {"type": "object", "required": ["resourceType"],
                                         "description": "a FHIR R4 Bundle of one patient"}}}}


class Service:
    """What the routes share: the store, one engine (built on first use), packers by strategy, limits."""

    def __init__(self, store: PatientStore, settings: Settings, engine: Engine | None = None) -> None:
        self.store, self.settings = store, settings
        self._engine = engine
        self._engines: dict[str, Engine] = {}
        self._packers: dict[str, ContextPacker] = {}
        self._lock = threading.Lock()  # the engine's caches and the knowledge base reader are not thread-safe
        self.limiter = RateLimiter(settings.serve.rate_per_second, settings.serve.rate_burst)
        self.metrics = Metrics()

    def engine(self, retrieval: str | None = None) -> Engine:
        if self._engine is None:
            self._engine = Engine.from_config(self.settings)
        if retrieval is None or retrieval == self._engine.settings.retrieval:
            return self._engine
        if retrieval not in ("auto", "always", "never"):
            raise ProblemError(422, "invalid-request", f"retrieval must be auto, always or never, got {retrieval!r}")
        base = self._engine
        if retrieval not in self._engines:
            self._engines[retrieval] = Engine(base.packer, base.voter, base.client, base.gate,
                                              replace(base.settings, retrieval=retrieval))
        return self._engines[retrieval]

    def packer(self, strategy: str | None) -> ContextPacker:
        engine = self.engine()
        if strategy is None or strategy == engine.packer.strategy:
            return engine.packer
        if strategy not in STRATEGIES:
            raise ProblemError(422, "invalid-request",
                               f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if strategy not in self._packers:
            data = dict(engine.packer.to_dict(), strategy=strategy)
            self._packers[strategy] = ContextPacker.from_dict(data, engine.packer.embedder)
        return self._packers[strategy]

    def locked(self, work: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with self._lock:
                return work()
        return run

    async def run(self, work: Callable[[], Any]) -> Any:
        """Blocking work in a worker thread, bounded by [serve] request_seconds."""
        try:
            return await asyncio.wait_for(run_in_threadpool(self.locked(work)), self.settings.serve.request_seconds)
        except TimeoutError:
            seconds = self.settings.serve.request_seconds
            raise ProblemError(504, "timeout", f"the request took longer than {seconds:g} s; it may still finish "
                                               "in the background") from None

    def audit(self, key: ApiKey, patient: str, action: str, request: Request, fragments: tuple[str, ...] = ()) -> None:
        audit.append(self.store, audit.AuditEntry(key.key_id, key.tenant, patient, action,
                                                  request.state.request_id, fragments))


def create_app(store: PatientStore, settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    settings = settings or Settings()
    service = Service(store, settings, engine)
    app = FastAPI(title="ebmrag", version="1", description="Evidence-graded context for clinical assistants.")
    app.state.service = service
    _install_openapi(app)
    _install_errors(app)
    _install_middleware(app, service)
    _install_health(app, service)
    _install_patients(app, service)
    _install_answers(app, service)
    _install_kb(app, service)
    install_ui(app, service, stored)
    return app


def _install_openapi(app: FastAPI) -> None:
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


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def on_problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, exc.kind, exc.detail, request, exc.headers)

    @app.exception_handler(AccessError)
    async def on_access(request: Request, exc: AccessError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return problem_response(exc.status, _ACCESS_KINDS[exc.status], exc.detail, request, headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5])
        return problem_response(422, "invalid-request", where, request)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(exc.status_code, kind, str(exc.detail), request)

    @app.exception_handler(StoreError)
    async def on_store(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error on %s: %s", request.url.path, type(exc).__name__)
        return problem_response(503, "store-unavailable", "the patient store is not reachable", request)

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


def _install_middleware(app: FastAPI, service: Service) -> None:
    limit = int(service.settings.serve.max_body_mb * 2**20)

    @app.middleware("http")
    async def frame(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        request.state.request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        length = request.headers.get("content-length")
        started = asyncio.get_running_loop().time()
        if length and length.isdigit() and int(length) > limit:
            response: Response = problem_response(413, "payload-too-large",
                                                  f"the body is larger than {service.settings.serve.max_body_mb:g} MB",
                                                  request)
        else:
            try:
                response = await call_next(request)
            except Exception:  # the handlers above answer almost everything; this is the last net
                log.error("unhandled error on %s", request.url.path)
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
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")


async def caller(request: Request, service: Service) -> ApiKey:
    key = await run_in_threadpool(authenticate, service.store, request.headers.get("authorization"))
    wait = service.limiter.take(key.key_id)
    if wait > 0:
        raise ProblemError(429, "rate-limited", f"more than {service.settings.serve.rate_per_second:g} requests per "
                                           "second for this key", {"Retry-After": str(max(1, round(wait)))})
    return key


async def read_record(request: Request, patient: str) -> PatientRecord:
    """The body as a record of `patient`: ebmrag JSON (application/json) or a FHIR R4 Bundle
    (application/fhir+json, or any JSON whose resourceType is Bundle)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in JSON_TYPES:
        raise ProblemError(415, "unsupported-media-type",
                           f"send {' or '.join(JSON_TYPES)}, not {content_type or 'nothing'}")
    raw = await request.body()
    if len(raw) > request.app.state.service.settings.serve.max_body_mb * 2**20:
        raise ProblemError(413, "payload-too-large", "the body is too large")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProblemError(400, "malformed-json", f"the body is not valid JSON: {exc}") from None
    origin = f"request body for {patient}"
    if content_type == "application/fhir+json" or (isinstance(data, dict) and data.get("resourceType") == "Bundle"):
        record = record_from_fhir_bundle(data, origin)
    else:
        record = record_from_json(data, origin)
    fragments = tuple(replace(f, patient_id=patient) for f in record.fragments)
    return PatientRecord(patient, fragments, origin, record.skipped, record.identifiers)


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
        record = await read_record(request, pid)
        count = await run_in_threadpool(store.put_record, key.tenant, pid, record)
        service.audit(key, pid, "put", request, tuple(f.id for f in record.fragments))
        return {"patient": pid, "fragments": count, "record_skipped": list(record.skipped)}

    @app.post("/v1/patients/{pid}/fragments", tags=["patients"], openapi_extra={"requestBody": RECORD_BODY})
    async def add_fragments(pid: PatientId, request: Request) -> dict[str, Any]:
        key, pid = await visible(request, pid, WRITE)
        record = await read_record(request, pid)
        idem = request.headers.get("idempotency-key")

        def respond(added: int, replaced: int) -> dict[str, Any]:
            return {"patient": pid, "added": added, "replaced": replaced, "record_skipped": list(record.skipped)}

        if idem:
            result = await run_in_threadpool(store.upsert_idempotent, key.tenant, pid, idem[:200], record, respond)
        else:
            result = respond(*await run_in_threadpool(store.upsert_fragments, key.tenant, pid, record))
        service.audit(key, pid, "append", request, tuple(f.id for f in record.fragments))
        return result

    @app.get("/v1/patients/{pid}/fragments", tags=["patients"])
    async def list_fragments(pid: PatientId, request: Request) -> dict[str, Any]:
        key, pid = await visible(request, pid, READ)
        record = await stored(service, key, pid)
        classified = await service.run(lambda: service.engine().packer.classify(record))
        service.audit(key, pid, "read", request, tuple(f.id for f in classified.fragments))
        return {"patient": pid, "record_skipped": list(record.skipped), "fragments": [
            {"id": f.id, "text": f.text, "section": f.section,
             "timestamp": f.timestamp.isoformat() if f.timestamp else None, "encounter": f.encounter,
             "tier": f.tier.value, "rule": f.decision.rule_id if f.decision else "",
             "must_keep": bool(f.decision and f.decision.must_keep)} for f in classified.fragments]}

    @app.delete("/v1/patients/{pid}", tags=["patients"])
    async def erase_patient(pid: PatientId, request: Request) -> dict[str, Any]:
        key, pid = await visible(request, pid, ERASE)
        erased = await run_in_threadpool(store.delete_patient, key.tenant, pid)
        if erased is None:
            raise AccessError(404, "no such patient")
        forgotten = await service.run(lambda: forget_fragments(service.engine(), erased))
        service.audit(key, pid, "erase", request, tuple(f.id for f in erased))
        return {"patient": pid, "erased_fragments": len(erased), "cache_entries_forgotten": forgotten}


async def wait_for_results(service: Service, key: ApiKey, pid: str, wait_ms: int) -> int:
    """Wait up to `wait_ms` for the patient's announced results to arrive (the paper's "pack at question time
    with what has arrived"); returns the milliseconds waited."""
    started = asyncio.get_running_loop().time()
    deadline = started + wait_ms / 1000
    while wait_ms:
        waiting: list[dict[str, str]] = await run_in_threadpool(service.store.pending, key.tenant, pid)
        if not waiting or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.05)
    return round((asyncio.get_running_loop().time() - started) * 1000)


async def stored(service: Service, key: ApiKey, pid: str) -> PatientRecord:
    record = await run_in_threadpool(service.store.record, key.tenant, pid)
    if record is None or not record.fragments:
        raise AccessError(404, "no such patient")
    return record


def forget_fragments(engine: Engine, fragments: list[Fragment]) -> int:
    """Erasure reaches the caches: the vectors of the texts and of their compressed states, their tier
    decisions and compressed states, and any cached model reply that quotes one of them."""
    packer, texts = engine.packer, [f.text for f in fragments]
    states = [c.text for c in packer.builder.compressor.compress_many(texts) if c.text]
    forgotten = packer.embedder.forget(texts + states)
    forgotten += packer.classifier.forget([(f.text, f.section) for f in fragments])
    forgotten += packer.builder.compressor.forget(texts)
    cache = getattr(engine.client, "cache", None)
    if cache is not None:
        forgotten += cache.forget_quoting(texts)
    return forgotten


def _install_answers(app: FastAPI, service: Service) -> None:
    @app.post("/v1/patients/{pid}/ask", tags=["answers"], response_model=None,
              responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                               "description": "the ask JSON; with Accept: text/event-stream, stage events, the "
                                              "answer text, then the same JSON as a `result` event"}})
    async def ask(pid: PatientId, body: AskBody, request: Request) -> dict[str, Any] | StreamingResponse:
        key = await caller(request, service)
        valid_name(pid, "patient id")
        require(key, READ, pid)
        waited = await wait_for_results(service, key, pid, body.wait_ms)
        record = await stored(service, key, pid)
        pending = await run_in_threadpool(service.store.pending, key.tenant, pid)
        engine = service.engine(body.retrieval)
        if "text/event-stream" in request.headers.get("accept", ""):
            return StreamingResponse(stream_ask(service, engine, key, pid, body, record, request),
                                     media_type="text/event-stream")
        result = await service.run(lambda: engine.ask(body.question, record, body.window))
        service.audit(key, pid, "ask", request, tuple(i.id for i in result.items))
        data: dict[str, Any] = result.to_json()
        data["trace"]["pending_results"] = pending  # announced, not arrived: the answer could not use them
        data["trace"]["waited_ms"] = waited
        return data

    @app.post("/v1/results", tags=["results"])
    async def post_results(request: Request) -> dict[str, Any]:
        """The gateway without a broker: the same messages and the same store logic as `ebmrag gateway run`,
        for one machine. A message for another tenant, or a patient the key may not see, is refused."""
        key = await caller(request, service)
        require(key, WRITE)
        try:
            raw = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProblemError(400, "malformed-json", f"the body is not valid JSON: {exc}") from None
        outcomes: Counter[str] = Counter()
        rejected = []
        for index, item in enumerate(raw if isinstance(raw, list) else [raw]):
            try:
                message = parse_message(item if isinstance(item, dict) else json.dumps(item))
                if message.tenant != key.tenant or not key.may_see(message.patient_id):
                    raise MessageError("the message names a tenant or patient this key may not write")
                outcomes[await run_in_threadpool(apply_message, service.store, message)] += 1
                service.audit(key, message.patient_id, "result", request, (message.fragment_id,))
            except MessageError as exc:
                rejected.append({"index": index, "reason": str(exc)})
        return {"stored": outcomes["stored"], "pending": outcomes["pending"], "rejected": rejected}

    @app.post("/v1/patients/{pid}/pack", tags=["answers"])
    async def pack(pid: PatientId, body: PackBody, request: Request) -> dict[str, Any]:
        key = await caller(request, service)
        valid_name(pid, "patient id")
        require(key, READ, pid)
        record = await stored(service, key, pid)
        result = await service.run(lambda: service.packer(body.strategy).run(record, body.query, body.window))
        service.audit(key, pid, "pack", request, tuple(p.fragment_id for p in result.packed))
        return dict(result.to_json(), context=result.context)

    @app.post("/v1/search", tags=["answers"])
    async def search(body: SearchBody, request: Request) -> list[dict[str, Any]]:
        key = await caller(request, service)
        require(key, SEARCH)

        def run() -> list[dict[str, Any]]:
            voter = service.engine().voter
            if voter is None:
                raise ProblemError(409, "no-knowledge-base", "this server has no knowledge base")
            retriever = voter.retriever
            if body.mode and body.mode != retriever.mode:
                retriever = HybridRetriever(retriever.kb, body.mode, retriever.fusion, retriever.weights,
                                            retriever.route_depth, retriever.rrf_k, retriever.reranker)
            hits = retriever.run(body.query, body.k)
            return [h.to_json() for h in hits]

        hits: list[dict[str, Any]] = await service.run(run)
        service.audit(key, "", "search", request)
        return hits


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def stream_ask(service: Service, engine: Engine, key: ApiKey, pid: str, body: AskBody, record: PatientRecord,
                     request: Request) -> AsyncIterator[str]:
    """Server-sent events: `stage` as each model stage ends (name, status, seconds), `answer` with the answer
    text, `result` with the whole ask JSON, or one `error` problem; the stream then ends."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def heard(trace: StageTrace) -> None:
        loop.call_soon_threadsafe(events.put_nowait, ("stage", {"stage": trace.name, "status": trace.status,
                                                                "seconds": round(trace.seconds, 3)}))

    task = asyncio.ensure_future(service.run(lambda: engine.ask(body.question, record, body.window,
                                                                on_stage=heard)))
    while not (task.done() and events.empty()):
        waiter = asyncio.ensure_future(events.get())
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            yield _event(*waiter.result())
        else:
            waiter.cancel()
    try:
        result = task.result()
    except ProblemError as exc:
        yield _event("error", {"type": PROBLEM + exc.kind, "status": exc.status, "detail": exc.detail})
        return
    except Exception as exc:  # the JSON route's handlers answer these; a stream reports them as an event
        log.error("ask stream failed: %s", type(exc).__name__)
        yield _event("error", {"type": PROBLEM + "internal", "status": 500, "detail": "the answer failed"})
        return
    service.audit(key, pid, "ask", request, tuple(i.id for i in result.items))
    yield _event("answer", {"text": result.answer})
    yield _event("result", result.to_json())


def _install_kb(app: FastAPI, service: Service) -> None:
    """The shared knowledge base: stats for any admin, changes only for the admins of [serve] kb_admin_tenant
    (one tenant's administrator must not rewrite every tenant's guidelines)."""

    def knowledge_base() -> KnowledgeBase:
        voter = service.engine().voter
        if voter is None:
            raise ProblemError(409, "no-knowledge-base", "this server has no knowledge base")
        return voter.retriever.kb

    async def kb_admin(request: Request, change: bool) -> ApiKey:
        key = await caller(request, service)
        require(key, KB_ADMIN)
        if change and key.tenant != service.settings.serve.kb_admin_tenant:
            raise AccessError(403, f"only admins of tenant {service.settings.serve.kb_admin_tenant!r} change the "
                                   "shared knowledge base")
        return key

    @app.get("/v1/kb/stats", tags=["knowledge base"])
    async def kb_stats(request: Request) -> dict[str, Any]:
        await kb_admin(request, change=False)
        return dict(asdict(await service.run(lambda: knowledge_base_stats(knowledge_base()))))

    @app.post("/v1/kb/documents", tags=["knowledge base"])
    async def kb_upload(body: UploadBody, request: Request) -> dict[str, Any]:
        key = await kb_admin(request, change=True)
        documents = [Document(d.doc_id, normalize_text(d.text), d.source, "upload", d.title, date=d.date,
                              authority=d.authority) for d in body.documents]
        report = await service.run(lambda: knowledge_base().apply(documents))
        service.audit(key, "", "kb_upload", request, tuple(d.doc_id for d in documents))
        return {"added": report.added, "updated": report.updated, "unchanged": report.unchanged}

    @app.delete("/v1/kb/documents/{doc_id}", tags=["knowledge base"])
    async def kb_delete(doc_id: str, request: Request) -> dict[str, Any]:
        key = await kb_admin(request, change=True)
        report = await service.run(lambda: knowledge_base().apply([], [doc_id]))
        if not report.deleted:
            raise ProblemError(404, "not-found", f"no document {doc_id!r} in the knowledge base")
        service.audit(key, "", "kb_delete", request, (doc_id,))
        return {"deleted": report.deleted}


def serve_app(data_dir: Path, settings: Settings, store_url: str = "") -> FastAPI:
    from ebmrag.serve.store import open_store

    return create_app(open_store(data_dir, store_url or settings.serve.store_url), settings)
