"""What the service's routes share: the store, one engine (built on first use), limits, and the helpers
that turn a request into a key, a record, or an erasure that reaches the caches."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ebmrag.answer.engine import Engine
from ebmrag.compose import Resources, build_engine_from, build_retriever, open_resources
from ebmrag.config import Settings
from ebmrag.generate.staged import StageTrace
from ebmrag.index.backend import KnowledgeStore
from ebmrag.packing.packer import STRATEGIES, ContextPacker
from ebmrag.records.fhir.bulk import records_from_ndjson_text
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.records.loaders import record_from_json, records_from_xml
from ebmrag.records.params import ChartParams
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.serve.limits import Metrics, RateLimiter
from ebmrag.serve.models import AskBody
from ebmrag.serve.problems import PROBLEM, ProblemError
from ebmrag.store import audit
from ebmrag.store.access import AccessError, authenticate
from ebmrag.store.patients import ApiKey, PatientStore

log = logging.getLogger(__name__)
JSON_TYPES = ("application/json", "application/fhir+json")
XML_TYPES = ("application/xml", "text/xml", "application/cda+xml", "application/hl7-cda+xml", "application/hl7-v3+xml",
             "application/fhir+xml")
NDJSON_TYPES = ("application/fhir+ndjson", "application/x-ndjson", "application/ndjson")


class Service:
    """What the routes share: the store, the resources and one engine (built on first use through the
    composition root), packers by strategy, limits."""

    def __init__(self, store: PatientStore, settings: Settings, engine: Engine | None = None,
                 resources: Resources | None = None) -> None:
        """`engine` and `resources`: built already (tests, embedding applications); an engine comes with the
        resources it was built from, so erasure reaches the caches it fills."""
        if engine is not None and resources is None:
            raise ValueError("a service given an engine needs the resources it was built from")
        self.store, self.settings = store, settings
        self._engine, self._resources = engine, resources
        self._engines: dict[str, Engine] = {}
        self._packers: dict[str, ContextPacker] = {}
        self._retrievers: dict[str, HybridRetriever] = {}
        self._lock = threading.Lock()  # the engine's caches and the knowledge base reader are not thread-safe
        self._building = threading.Lock()  # one engine, however many first requests arrive together
        self.limiter = RateLimiter(settings.serve.rate_per_second, settings.serve.rate_burst)
        self.metrics = Metrics()

    def resources(self) -> Resources:
        with self._building:
            return self._resources_unlocked()

    def _resources_unlocked(self) -> Resources:
        if self._resources is None:
            self._resources = open_resources(self.settings, retrieval=self.settings.answer.retrieval != "never")
        return self._resources

    def engine(self, retrieval: str | None = None) -> Engine:
        """The engine (built on first use, from a worker thread: it loads the model), or a variant of it with
        another retrieval mode that shares all its parts (the query rewriter too)."""
        with self._building:
            if self._engine is None:
                self._engine = build_engine_from(self._resources_unlocked())
            if retrieval is None or retrieval == self._engine.settings.retrieval:
                return self._engine
            if retrieval not in ("auto", "always", "never"):
                raise ProblemError(422, "invalid-request", f"retrieval must be auto, always or never, got "
                                                           f"{retrieval!r}")
            if retrieval not in self._engines:
                self._engines[retrieval] = self._engine.with_retrieval(retrieval)
            return self._engines[retrieval]

    def packer(self, strategy: str | None) -> ContextPacker:
        engine = self.engine()
        if strategy is None or strategy == engine.packer.strategy:
            return engine.packer
        if strategy not in STRATEGIES:
            raise ProblemError(422, "invalid-request",
                               f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if strategy not in self._packers:
            params = replace(engine.packer.settings, strategy=strategy, objective="critical")
            self._packers[strategy] = engine.packer.with_params(params)
        return self._packers[strategy]

    def knowledge_base(self) -> KnowledgeStore:
        self.engine()  # the knowledge base opens with the engine
        kb = self.resources().knowledge_base
        if kb is None:
            raise ProblemError(409, "no-knowledge-base", "this server has no knowledge base")
        return kb

    def retriever(self, mode: str | None = None) -> HybridRetriever:
        """The configured retriever, or one searching by another mode (built once per mode)."""
        params = self.settings.retrieval if mode is None else replace(self.settings.retrieval, mode=mode)
        if params.mode not in self._retrievers:
            self._retrievers[params.mode] = build_retriever(self.resources(), self.knowledge_base(), params)
        return self._retrievers[params.mode]

    def classify(self, record: PatientRecord) -> PatientRecord:
        """The record's fragments with their tier decisions (the engine's tier rules and model)."""
        return self.packer(None).classify(record)

    def forget(self, fragments: list[Fragment]) -> int:
        """Erasure reaches the caches (`Resources.forget`)."""
        return self.resources().forget(fragments)

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

    def audit_refused(self, key: ApiKey | None, status: int, route: str, request_id: str, patient: str = "") -> None:
        """A refused attempt is audited too: no key ("-") or the key that was refused, and where it knocked."""
        audit.append(self.store, audit.AuditEntry(key.key_id if key else "-", key.tenant if key else "-", patient,
                                                  f"refused {status} {route}", request_id))

    def audit(self, key: ApiKey, patient: str, action: str, request: Request, fragments: tuple[str, ...] = ()) -> None:
        audit.append(self.store, audit.AuditEntry(key.key_id, key.tenant, patient, action,
                                                  request.state.request_id, fragments))


async def caller(request: Request, service: Service) -> ApiKey:
    key = await run_in_threadpool(authenticate, service.store, request.headers.get("authorization"))
    request.state.key = key  # a later refusal (403, 404) is audited under it
    wait = service.limiter.take(key.key_id)
    if wait > 0:
        raise ProblemError(429, "rate-limited", f"more than {service.settings.serve.rate_per_second:g} requests per "
                                           "second for this key", {"Retry-After": str(max(1, round(wait)))})
    return key


async def bounded_body(request: Request, limit: float | None = None) -> bytes:
    """The body, read in chunks and refused past `limit` bytes, by default [serve] max_body_mb (a chunked
    upload has no Content-Length for the middleware to check)."""
    limit = limit if limit is not None else request.app.state.service.settings.serve.max_body_mb * 2**20
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProblemError(413, "payload-too-large", "the body is too large")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_record(request: Request, patient: str, params: ChartParams) -> PatientRecord:
    """The body as a record of `patient`: ebmrag JSON (application/json), a FHIR R4 Bundle
    (application/fhir+json, or any JSON whose resourceType is Bundle), a C-CDA document (XML) or one
    patient's FHIR Bulk Data NDJSON."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in JSON_TYPES + XML_TYPES + NDJSON_TYPES:
        raise ProblemError(415, "unsupported-media-type",
                           f"send {', '.join(JSON_TYPES + XML_TYPES + NDJSON_TYPES)}, not {content_type or 'nothing'}")
    raw = await bounded_body(request)
    origin = f"request body for {patient}"
    if content_type in XML_TYPES:
        return _as_patient(_one(await run_in_threadpool(records_from_xml, raw, origin, params)), patient)
    if content_type in NDJSON_TYPES:
        text = _utf8(raw)
        records = await run_in_threadpool(partial(records_from_ndjson_text, text, origin,
                                                  stale_after=params.stale_after))
        return _as_patient(_one(records), patient)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProblemError(400, "malformed-json", f"the body is not valid JSON: {exc}") from None
    if content_type == "application/fhir+json" or (isinstance(data, dict) and data.get("resourceType") == "Bundle"):
        record = record_from_fhir_bundle(data, origin, stale_after=params.stale_after)
    else:
        record = record_from_json(data, origin)
    return _as_patient(record, patient)


def _as_patient(record: PatientRecord, patient: str) -> PatientRecord:
    fragments = tuple(replace(f, patient_id=patient) for f in record.fragments)
    return PatientRecord(patient, fragments, record.origin, record.skipped, record.identifiers)


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ProblemError(400, "malformed-body", "the body is not UTF-8 text") from None


def _one(records: list[PatientRecord]) -> PatientRecord:
    if len(records) != 1:
        raise ProblemError(422, "not-one-patient", f"the body holds {len(records)} patients; upload one patient's "
                                                   "chart per request")
    return records[0]


async def wait_for_results(service: Service, key: ApiKey, pid: str, wait_ms: int) -> int:
    """Wait up to `wait_ms`, and at most half of [serve] request_seconds, for the patient's announced results
    to arrive (the paper's "pack at question time with what has arrived"); returns the milliseconds waited."""
    started = asyncio.get_running_loop().time()
    wait_ms = min(wait_ms, int(service.settings.serve.request_seconds * 1000) // 2)  # half the request's time
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
