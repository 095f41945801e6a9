"""What the service's routes share: the store, the resources and the engine the composition root built, limits,
and the helpers that turn a request into a key, a record, or an erasure that reaches the caches."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from ebmrag.answer.engine import Engine
from ebmrag.compose import Resources, ServiceParts, build_retriever
from ebmrag.config import Settings
from ebmrag.ehr.spool import sweep_stale
from ebmrag.generate.staged import StageTrace
from ebmrag.index.backend import KnowledgeStore
from ebmrag.index.types import IngestReport
from ebmrag.ingest.documents import Document
from ebmrag.packing.packer import STRATEGIES, ContextPacker
from ebmrag.packing.types import PackResult
from ebmrag.protocols import WorkCancelled, checkpoints
from ebmrag.records.fhir.bulk import records_from_ndjson_text
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.records.loaders import record_from_json, records_from_xml
from ebmrag.records.params import ChartParams
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.serve.bodies import parse_json
from ebmrag.serve.clients import ClientAddresses
from ebmrag.serve.limits import Metrics, RateLimiter
from ebmrag.serve.models import AskBody
from ebmrag.serve.outbound import ERASED, EngineSteps, OutboundCall, OutboundLane
from ebmrag.serve.prepare import ChartPreparer, Running
from ebmrag.serve.problems import PROBLEM, ProblemError
from ebmrag.serve.scheduler import Deadline, FairScheduler, Job
from ebmrag.serve.throttle import FailedCredentials, ThrottledAudit
from ebmrag.store import audit
from ebmrag.store.access import NAME_PATTERN, AccessError, authenticate
from ebmrag.store.keys import ApiKey
from ebmrag.store.patients import PatientStore

log = logging.getLogger(__name__)
_NAME = re.compile(NAME_PATTERN)
T = TypeVar("T")
JSON_TYPES = ("application/json", "application/fhir+json")
XML_TYPES = ("application/xml", "text/xml", "application/cda+xml", "application/hl7-cda+xml", "application/hl7-v3+xml",
             "application/fhir+xml")
NDJSON_TYPES = ("application/fhir+ndjson", "application/x-ndjson", "application/ndjson")
BACKGROUND_DEADLINES = 10  # a background job may wait, paused behind requests, this many request deadlines
ERASE_GRACE = 30.0  # seconds an erasure waits, beyond a request's deadline, for work on the record to reach its end
NO_OPERATOR_KB = ("no knowledge base is configured for changes: this server answers from the bundled demo knowledge "
                  "base, which is read-only; start serve with --kb DIR ([serve] kb)")


class Service:
    """What the routes share: the store, the resources and the engine (the composition root's: `parts`), variants
    of the engine's parts by retrieval mode and packing strategy, limits."""

    def __init__(self, store: PatientStore, settings: Settings, parts: ServiceParts) -> None:
        """`parts`: the resources and the engine, which the composition root builds (`compose.ServiceParts`, on
        first use); the service builds neither."""
        self.store, self.settings, self.parts = store, settings, parts
        self._engines: dict[str, Engine] = {}
        self._packers: dict[str, ContextPacker] = {}
        self._retrievers: dict[str, HybridRetriever] = {}
        # Engine work runs on the scheduler's slots, tenants in turn (serve/scheduler.py); the shared parts are
        # safe for concurrent use (a lock per cache and per model), so there is no lock around a whole request.
        self.scheduler = FairScheduler.for_service(settings.serve)
        # Outbound EHR calls wait on the network on threads of their own, bounded per tenant; their CPU-bound
        # steps come back to the scheduler as the tenant's engine work (serve/outbound.py). CDS fetches have a lane
        # of their own, so a tenant's long pulls never refuse its clinicians' hook calls.
        self.ehr_calls = OutboundLane(settings.serve.ehr_calls, settings.serve.tenant_ehr_calls, "ehr")
        self.cds_fetches = OutboundLane(settings.serve.ehr_calls, settings.serve.tenant_ehr_calls, "cds")
        sweep_stale()  # the Bulk Data spools of an export killed before this start: patient data nobody would erase
        self._building = threading.RLock()  # one engine, packer and retriever per variant, each derived once
        self._kb_writes = threading.Lock()  # the knowledge base has one writer at a time (its lock is per process)
        self._in_use: Counter[tuple[str, str]] = Counter()  # work reading a record, by (tenant, patient): erasure
        self._in_use_changed = threading.Condition()  # ... waits for it to end before forgetting what it cached
        self.limiter = RateLimiter(settings.serve.rate_per_second, settings.serve.rate_burst)
        # failed credentials per address and per credential, one count for /v1, MCP, the /ui sign-in and CDS Hooks
        self.failed_keys = FailedCredentials()
        self.clients = ClientAddresses(settings.serve.trusted_proxies, settings.serve.forwarded_header)
        self.throttled = ThrottledAudit(lambda entry: audit.append(self.store, entry))  # 429s audited by the burst
        self.metrics = Metrics()
        serve = settings.serve
        self.preparer = ChartPreparer(store, self.resources, self.engine, self._background, self._hold,
                                      queue_limit=serve.prepare_queue,
                                      max_fragments=serve.max_chart_fragments) if serve.prepare_charts else None

    def prepare(self, tenant: str, patient: str) -> None:
        """After a write: the chart is prepared in the background (serve/prepare.py), so its asks find it warm."""
        if self.preparer is not None:
            self.preparer.enqueue(tenant, patient)

    def _background(self, tenant: str, patient: str, work: Callable[[], None]) -> Running:
        """The preparer's host: `work` in the scheduler's background lane, counted as reading the record."""
        job = self._admit(work, tenant, patient, background=True)
        return Running(job.future, lambda: self.scheduler.cancel(job))

    def resources(self) -> Resources:
        return self.parts.resources()

    @property
    def kb_changeable(self) -> bool:
        """Whether uploads may change the knowledge base: the operator's ([serve] kb, or one an embedding
        application built the resources over), never the bundled demo one, a cache (`demo.ensure_demo_kb`)."""
        built = self.parts.opened
        return not built.demo_kb if built is not None else bool(self.settings.serve.kb)

    def engine(self, retrieval: str | None = None) -> Engine:
        """The engine (the root builds it on first use, from a worker thread), or a variant of it with another
        retrieval mode that shares all its parts (the query rewriter too)."""
        engine = self.parts.engine()
        with self._building:
            if retrieval is None or retrieval == engine.settings.retrieval:
                return engine
            if retrieval not in ("auto", "always", "never"):
                raise ProblemError(422, "invalid-request", f"retrieval must be auto, always or never, got "
                                                           f"{retrieval!r}")
            if retrieval not in self._engines:
                self._engines[retrieval] = engine.with_retrieval(retrieval)
            return self._engines[retrieval]

    def packer(self, strategy: str | None) -> ContextPacker:
        engine = self.engine()
        if strategy is None or strategy == engine.packer.strategy:
            return engine.packer
        if strategy not in STRATEGIES:
            raise ProblemError(422, "invalid-request",
                               f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        with self._building:
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
        with self._building:
            if params.mode not in self._retrievers:
                self._retrievers[params.mode] = build_retriever(self.resources(), self.knowledge_base(), params)
            return self._retrievers[params.mode]

    def classify(self, record: PatientRecord) -> PatientRecord:
        """The record's fragments with their tier decisions and findings (the engine's tiering step)."""
        return self.engine().tiering.run(record)

    def pack(self, record: PatientRecord, query: str, window: int | None, strategy: str | None) -> PackResult:
        """The record tiered (`classify`), then packed by the packer of `strategy` (None: the engine's)."""
        return self.packer(strategy).run(self.classify(record), query, window)

    def prepared(self, record: PatientRecord) -> int:
        """How many of the record's fragments are prepared: their text has a vector (serve/prepare.py)."""
        return sum(self.resources().prepared(record.fragments))

    def forget(self, fragments: list[Fragment], tenant: str = "", patient: str = "") -> int:
        """Erasure reaches the caches (`Resources.forget`). Work that read the record before the store deleted it
        may still be running and caching its text: the caches are forgotten again once it has ended (it ends by its
        deadline at the latest). Never stopped halfway, even when the response times out."""
        if tenant and self.preparer is not None:
            self.preparer.discard(tenant, patient)  # a queued preparation would write the caches again
        if tenant:
            self.ehr_calls.stop_patient(tenant, patient)  # a pull of it stores nothing now (nor could it: the store)
        with checkpoints(_never_stop):
            forgotten = self.resources().forget(fragments)
            if tenant and self._await_unused(tenant, patient):
                forgotten += self.resources().forget(fragments)
            return forgotten

    def _hold(self, tenant: str, patient: str) -> Callable[[], None]:
        """Count work on (tenant, patient)'s record from now; returns its release (once only)."""
        if not patient:
            return lambda: None
        with self._in_use_changed:
            self._in_use[(tenant, patient)] += 1
        released = threading.Event()

        def release() -> None:
            with self._in_use_changed:
                if released.is_set():
                    return
                released.set()
                self._in_use[(tenant, patient)] -= 1
                if not self._in_use[(tenant, patient)]:
                    del self._in_use[(tenant, patient)]
                self._in_use_changed.notify_all()
        return release

    def _await_unused(self, tenant: str, patient: str) -> bool:
        """Wait until no work reads (tenant, patient)'s record; whether any was running. Such work ends at its
        deadline, request_seconds from its start, once its thread reaches the next checkpoint: on a loaded machine
        that checkpoint may come seconds later (a forward pass), so the wait allows `ERASE_GRACE` beyond."""
        with self._in_use_changed:
            busy = bool(self._in_use[(tenant, patient)])
            self._in_use_changed.wait_for(lambda: not self._in_use[(tenant, patient)], timeout=self.erase_wait())
        return busy

    def erase_wait(self) -> float:
        """How long an erasure waits for work reading the record to end: that work's own deadline, plus the grace."""
        return self.settings.serve.request_seconds + ERASE_GRACE

    def erase_seconds(self) -> float:
        """An erasure's own bound: the wait above and the forgetting after it. The erasure is committed before
        either, so a 504 only ever meant "erased, caches still being forgotten"; bounded by the request time alone,
        it answered that whenever an ask on the record ran to its own deadline first."""
        return self.erase_wait() + ERASE_GRACE

    def change_knowledge_base(self, documents: Sequence[Document], delete_ids: Sequence[str] = ()) -> IngestReport:
        """Upsert and delete knowledge-base documents, one write at a time (searches go on meanwhile)."""
        if not self.kb_changeable:
            raise ProblemError(409, "no-knowledge-base", NO_OPERATOR_KB)
        with self._kb_writes:
            return self.knowledge_base().apply(documents, delete_ids)

    def check_chart(self, record: PatientRecord) -> PatientRecord:
        """The record, if one request may work on it: a chart over [serve] max_chart_fragments is refused (422)
        before any work, instead of holding a slot until its deadline."""
        limit = self.settings.serve.max_chart_fragments
        if len(record.fragments) > limit:
            raise ProblemError(422, "chart-too-large", f"this chart holds {len(record.fragments):,} fragments; "
                                                       f"ask and pack work on at most {limit:,} "
                                                       "([serve] max_chart_fragments)")
        return record

    async def run(self, work: Callable[[], T], *, tenant: str, patient: str = "", engine: bool = True,
                  seconds: float | None = None) -> T:
        """Blocking work on a worker thread, bounded by [serve] request_seconds (504 after it, and the work stops
        at its next checkpoint). Engine work waits for a slot of the fair scheduler in `tenant`'s turn (429/503
        when the queues are full); `engine=False` is work that needs no engine slot (tiering a chart to list
        it, reading the knowledge base's statistics): it starts at once and is only stopped at the deadline.
        `patient`: the record the work reads, which an erasure waits for. `seconds`: another bound (an erasure's)."""
        seconds = seconds or self.settings.serve.request_seconds
        try:
            if engine:
                job = self._admit(work, tenant, patient)
                return await self.scheduler.wait(job, seconds)  # type: ignore[no-any-return]
            deadline, release = Deadline(seconds), self._hold(tenant, patient)
            try:
                return await asyncio.wait_for(run_in_threadpool(deadline.run, work), seconds)
            except BaseException:
                deadline.cancelled = True  # timed out or the client went away: stop at the next checkpoint
                raise
            finally:
                release()  # the thread has ended: a worker thread's cancellation waits for it
        except (TimeoutError, WorkCancelled):  # the thread's own deadline may stop the work before the loop's timer
            raise _timeout(seconds) from None

    async def call_ehr(self, work: Callable[[OutboundCall], T], *, tenant: str, patient: str = "",
                       lane: OutboundLane | None = None) -> T:
        """Outbound EHR work (a pull, an export; a CDS fetch in `lane`) on a thread of its lane, bounded per tenant
        (429/503), under [serve] request_seconds (504 once it has stopped). `patient`: the store patient it writes,
        whose erasure stops it (409 `patient-erased`). `work` gets its call: `call.http(...)` is the HTTP client
        to send with, `self.engine_steps(call)` runs its CPU-bound steps as the tenant's engine work."""
        seconds = self.settings.serve.request_seconds
        lane = lane or self.ehr_calls
        call = lane.admit(tenant, patient, seconds)
        try:
            return await lane.run(call, work)
        except (TimeoutError, WorkCancelled):
            if call.stopped == ERASED:
                raise ProblemError(409, "patient-erased", "the patient was erased while this pull ran; nothing it "
                                                          "fetched was stored") from None
            raise _timeout(seconds) from None

    def engine_steps(self, call: OutboundCall) -> EngineSteps:
        """A call's CPU-bound steps on the fair scheduler, as its tenant's engine work reading its patient."""
        return EngineSteps(call, lambda step, seconds: self._admit(step, call.tenant, call.patient, seconds=seconds),
                           self.scheduler.cancel)

    def call(self, work: Callable[[], T], *, tenant: str, patient: str = "", engine: bool = True) -> T:
        """`run` for a caller on a thread of its own (the MCP tools)."""
        seconds = self.settings.serve.request_seconds
        try:
            if not engine:
                release = self._hold(tenant, patient)
                try:
                    return Deadline(seconds).run(work)
                finally:
                    release()
            job = self._admit(work, tenant, patient)
            try:
                return job.future.result(timeout=seconds)  # type: ignore[no-any-return]
            except BaseException:
                self.scheduler.cancel(job)
                raise
        except (TimeoutError, WorkCancelled):
            raise _timeout(seconds) from None

    def _admit(self, work: Callable[[], Any], tenant: str, patient: str, background: bool = False,
               seconds: float | None = None) -> Job:
        """`work` in its tenant's queue (`background`: the lane below every request, with a longer deadline;
        `seconds`: a shorter one, what is left of the request's), counted as reading the patient's record until its
        thread has ended (not until its 504: the thread stops at its next checkpoint after that)."""
        release = self._hold(tenant, patient)
        if seconds is None:
            seconds = self.settings.serve.request_seconds * (BACKGROUND_DEADLINES if background else 1)
        try:
            job = self.scheduler.submit(tenant, work, seconds, background)
        except BaseException:
            release()
            raise
        job.future.add_done_callback(lambda _: release())
        return job

    def audit_refused(self, key: ApiKey | None, status: int, route: str, request_id: str, patient: str = "",
                      client: str = "") -> None:
        """A refused attempt is audited too: no key ("-") or the key that was refused, and where it knocked. The
        patient is kept only when it is a valid id: a caller's path text (a name, a date of birth) is never stored.
        A 429 is audited by the burst (serve.throttle.ThrottledAudit), counted by the key, else by `client` (the
        address): its first row as here, the rest as one summary row."""
        patient = patient if _NAME.match(patient) else ""
        entry = audit.AuditEntry(key.key_id if key else "-", key.tenant if key else "-", patient,
                                 f"refused {status} {route}", request_id)
        if status == 429:
            self.throttled.refused(entry, f"key {key.key_id}" if key else f"address {client or 'unknown'}")
        else:
            audit.append(self.store, entry)

    def audit(self, key: ApiKey, patient: str, action: str, request: Request, fragments: tuple[str, ...] = ()) -> None:
        audit.append(self.store, audit.AuditEntry(key.key_id, key.tenant, patient, action,
                                                  request.state.request_id, fragments))


async def encoded(data: Any) -> Response:
    """A JSON answer serialised on a worker thread. FastAPI's encoder walks a returned dict on the event loop: a
    10,000-fragment chart's pack trace took ~0.4 s there, and every other tenant's request waited behind it."""
    return json_response(await run_in_threadpool(dumps, data))


def json_response(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _never_stop() -> None:
    """A checkpoint hook that lets the work run to its end."""


def _timeout(seconds: float) -> ProblemError:
    return ProblemError(504, "timeout", f"the request took longer than {seconds:g} s; its work was stopped")


async def caller(request: Request, service: Service) -> ApiKey:
    key: ApiKey | None = getattr(request.state, "key", None)  # the guard (serve.guard) checked it
    if key is None:  # an app without the guard
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
                                                  stale_after=params.stale_after, today=params.today()))
        return _as_patient(_one(records), patient)
    data = await run_in_threadpool(parse_json, raw)  # depth-bounded: a deep body is a 400, never a RecursionError
    if content_type == "application/fhir+json" or (isinstance(data, dict) and data.get("resourceType") == "Bundle"):
        record = await run_in_threadpool(partial(record_from_fhir_bundle, data, origin, stale_after=params.stale_after,
                                                 today=params.today()))
    else:
        record = record_from_json(data, origin).flagged_at(params.today())  # dates after now flagged (records.dates)
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
    return await run_in_threadpool(stored_record, service, key, pid)


def stored_record(service: Service, key: ApiKey, pid: str) -> PatientRecord:
    """The key's tenant's record of `pid`; 404 when there is none."""
    record = service.store.record(key.tenant, pid)
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
                                                                on_stage=heard), tenant=key.tenant, patient=pid))
    try:
        while not (task.done() and events.empty()):
            waiter = asyncio.ensure_future(events.get())
            await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                yield _event(*waiter.result())
            else:
                waiter.cancel()
    finally:
        if not task.done():
            task.cancel()  # the client went away: its work stops at the next checkpoint, its slot is freed
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
    yield await run_in_threadpool(lambda: _event("result", result.to_json()))  # large: off the event loop
