"""Spans as ebmrag makes them: the attribute allow-list, failures without messages, detail spans only inside a trace,
a caller's traceparent (and nothing else of its headers), context carried onto the scheduler's threads, model calls
in the GenAI conventions against a real OpenAI-compatible server, the gateway's spans against a real Redis, and the
OTLP exporter posting to a real HTTP collector."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import redis
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanKind, StatusCode

from ebmrag.errors import LLMError
from ebmrag.gateway.consumer import ResultConsumer
from ebmrag.gateway.publish import publish
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.observe.instruments import MODEL_TOKENS, stage
from ebmrag.observe.params import ObserveParams
from ebmrag.observe.setup import configure
from ebmrag.observe.tracing import MAX_TEXT, remote_parent, span
from ebmrag.protocols import ChatMessage
from ebmrag.serve.scheduler import FairScheduler
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from ebmrag.store.results import ResultMessage
from tests.fake_openai import FakeOpenAI
from tests.fake_openai import serve as serve_model
from tests.observe.conftest import REDIS_URL, Telemetry, dumped

MARKER = "MARKER7f3a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def test_only_listed_attributes_with_plain_values_reach_a_span(telemetry: Telemetry) -> None:
    with span("work", {"http.route": "/v1/patients/{pid}", "url.path": f"/v1/patients/{MARKER}",
                       "ebmrag.stage": "x" * 500, "ebmrag.pack.window": ["not", "plain"]}):  # type: ignore[dict-item]
        pass
    (made,) = telemetry.finished()
    assert dict(made.attributes or {}) == {"http.route": "/v1/patients/{pid}", "ebmrag.stage": "x" * MAX_TEXT}


def test_only_ebmrags_own_spans_are_exported(telemetry: Telemetry) -> None:
    """Another library's spans (FastAPI's native ones put url.path in theirs) go through the same provider, and are
    dropped at the exporter (observe.export.OwnSpans)."""
    with trace.get_tracer("some.library").start_as_current_span(f"GET /v1/patients/{MARKER}"), span("work"):
        pass
    assert [s.name for s in telemetry.finished()] == ["work"]
    assert len(telemetry.everything.get_finished_spans()) == 2


def test_a_failure_is_its_type_and_a_fixed_description(telemetry: Telemetry) -> None:
    with pytest.raises(LLMError), span("chat tiny"):
        raise LLMError(f"the model quoted the chart: {MARKER}")
    with pytest.raises(asyncio.CancelledError), span("stopped"):
        raise asyncio.CancelledError(MARKER)
    failed, stopped = telemetry.finished()
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "failed"
    assert failed.attributes == {"error.type": "LLMError"} and not failed.events, "no exception event (its message)"
    assert stopped.status.description == "stopped" and stopped.attributes == {"error.type": "CancelledError"}
    assert MARKER not in dumped(telemetry.finished())


def test_detail_spans_need_a_trace_and_trace_stages(telemetry: Telemetry) -> None:
    with stage("gate"):
        pass
    assert telemetry.finished() == [], "a stage outside any trace (a background job) starts no trace of its own"
    with span("request"), stage("gate"):
        pass
    gate, request = telemetry.finished()
    assert gate.name == "gate" and gate.parent is not None and gate.parent.span_id == request.context.span_id
    telemetry.spans.clear()
    configure(ObserveParams(trace_stages=False))
    with span("request"), stage("gate"):
        pass
    assert [s.name for s in telemetry.finished()] == ["request"]


def test_a_callers_traceparent_is_followed_and_nothing_else_of_its_headers(telemetry: Telemetry) -> None:
    parent = remote_parent(f"00-{TRACE_ID}-{PARENT_ID}-01")
    with span("POST /v1/patients/{pid}/ask", kind=SpanKind.SERVER, parent=parent):
        pass
    (server,) = telemetry.finished()
    assert f"{server.context.trace_id:032x}" == TRACE_ID and server.parent is not None
    assert f"{server.parent.span_id:016x}" == PARENT_ID and server.parent.is_remote
    assert len(server.context.trace_state) == 0, "tracestate is never read"
    assert remote_parent(f"00-{MARKER}-{PARENT_ID}-01") is None and remote_parent(None) is None


def test_engine_work_on_a_scheduler_thread_is_a_child_of_the_request(telemetry: Telemetry) -> None:
    """A pool thread does not inherit the caller's context; the scheduler carries it (observe.tracing.bind)."""
    scheduler = FairScheduler(slots=1, tenant_slots=1, tenant_queue=4, queue_limit=8)

    def work() -> str:
        with stage("packing"):
            return threading.current_thread().name

    async def request() -> str:
        with span("POST /v1/patients/{pid}/pack", kind=SpanKind.SERVER):
            return await scheduler.run("t", work, 10)

    assert asyncio.run(request()).startswith("ebmrag-engine")
    packing, server = telemetry.finished()
    assert packing.parent is not None and packing.parent.span_id == server.context.span_id
    assert packing.context.trace_id == server.context.trace_id


def test_model_calls_follow_the_genai_conventions(telemetry: Telemetry, tmp_path: Path) -> None:
    """Span `chat <model>`, provider, models, temperature, max tokens and usage; a cache hit has no usage; a refusal
    is its error type. The prompt and the reply (both with the marker) appear nowhere."""
    before = tokens_of("tiny")
    fake = FakeOpenAI(("text", f"reply about {MARKER}"))
    fake.script = [("text", f"reply about {MARKER}"), ("reject", f"bad prompt {MARKER}")]
    messages = [ChatMessage("user", f"Is {MARKER} allergic to penicillin?")]
    with serve_model(fake) as url:
        client = OpenAIChatClient(url, "tiny", max_retries=0, cache_dir=tmp_path)
        client.complete(messages, temperature=0.2, max_tokens=64)
        client.complete(messages, temperature=0.2, max_tokens=64)  # the same request: from the reply cache
        with pytest.raises(LLMError):
            client.complete([ChatMessage("user", f"other {MARKER}")], max_tokens=8)
    port = int(url.split(":")[2].split("/")[0])
    called, cached, refused = telemetry.finished()
    assert called.name == "chat tiny" and called.kind is SpanKind.CLIENT
    assert dict(called.attributes or {}) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
        "gen_ai.request.model": "tiny", "gen_ai.response.model": "tiny", "gen_ai.request.temperature": 0.2,
        "gen_ai.request.max_tokens": 64, "gen_ai.usage.input_tokens": 11, "gen_ai.usage.output_tokens": 3,
        "server.address": "127.0.0.1", "server.port": port, "ebmrag.cache_hit": False}
    assert cached.attributes is not None and cached.attributes["ebmrag.cache_hit"] is True
    assert "gen_ai.usage.input_tokens" not in cached.attributes
    assert refused.status.status_code is StatusCode.ERROR and refused.attributes is not None
    assert refused.attributes["error.type"] == "RequestRejectedError"
    assert MARKER not in dumped(telemetry.finished())
    assert tokens_of("tiny") == (before[0] + 11, before[1] + 3), "the call counted once, the cache hit not at all"


def tokens_of(model: str) -> tuple[float, float]:
    """(input, output) tokens counted for `model` so far, read from the Prometheus text."""
    lines = MODEL_TOKENS.render()
    found = [next((float(line.split()[-1]) for line in lines if line.startswith(
        f'ebmrag_model_tokens_total{{provider="openai",model="{model}",type="{kind}"}}')), 0.0)
        for kind in ("input", "output")]
    return found[0], found[1]


@pytest.fixture
def stream() -> Iterator[str]:
    name = f"test:{uuid.uuid4().hex[:10]}"
    yield name
    redis.Redis.from_url(REDIS_URL).delete(name, f"{name}:dead")


def test_each_gateway_message_is_a_consumer_span_with_its_kind_outcome_and_lag(telemetry: Telemetry, stream: str,
                                                                               tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    create_key(store, "t", "service")
    good = ResultMessage.model_validate({
        "tenant": "t", "patient_id": f"{MARKER}-p1", "result_id": f"r-{MARKER}", "kind": "lab",
        "producer": f"lab {MARKER}", "produced_at": datetime(2026, 3, 14, 8, tzinfo=UTC),
        "text": f"Creatinine 2.8 mg/dL for {MARKER}."})
    publish(REDIS_URL, [good], stream)
    redis.Redis.from_url(REDIS_URL).xadd(stream, {"message": f'{{"tenant": "{MARKER}"'})  # not JSON: dead-lettered
    consumer = ResultConsumer(store, REDIS_URL, stream, block_ms=100)
    while consumer.step():
        pass
    stored, dead = telemetry.finished()
    assert stored.name == f"process {stream}" and stored.kind is SpanKind.CONSUMER
    assert stored.attributes is not None and dead.attributes is not None
    assert (stored.attributes["ebmrag.message.kind"], stored.attributes["ebmrag.message.outcome"]) == ("lab", "stored")
    assert 0 <= float(stored.attributes["ebmrag.message.lag_seconds"]) < 60  # type: ignore[arg-type]
    assert (dead.attributes["ebmrag.message.kind"], dead.attributes["ebmrag.message.outcome"]) == ("unknown", "dead")
    assert MARKER not in dumped(telemetry.finished())


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector: keeps each POST's path and body."""

    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        Collector.received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def test_traces_and_metrics_reach_an_otlp_collector(tmp_path: Path) -> None:
    """In a process of its own (the providers are set once per process): [observe] otlp_endpoint installs the SDK,
    and the service name, spans and metrics arrive over OTLP/HTTP as protobuf."""
    Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    program = textwrap.dedent(f"""
        from ebmrag.observe.instruments import model_call, stage
        from ebmrag.observe.params import ObserveParams
        from ebmrag.observe.setup import configure, shutdown
        from ebmrag.observe.tracing import span
        assert configure(ObserveParams(otlp_endpoint="http://127.0.0.1:{server.server_address[1]}",
                                       service_name="ebmrag-test"))
        with span("POST /v1/patients/{{pid}}/ask", {{"http.route": "/v1/patients/{{pid}}/ask"}}), stage("gate"):
            with model_call("openai", "tiny", temperature=0.0, max_tokens=8) as call:
                call.replied(11, 3)
        shutdown()
    """)
    try:
        subprocess.run([sys.executable, "-c", program], check=True, timeout=60, env={**os.environ,
                                                                                    "PYTHONPATH": "src"})
    finally:
        server.shutdown()
    paths = {path for path, _ in Collector.received}
    assert paths == {"/v1/traces", "/v1/metrics"}, paths
    names = {s.name for body in (b for p, b in Collector.received if p == "/v1/traces")
             for resource in ExportTraceServiceRequest.FromString(body).resource_spans
             for scope in resource.scope_spans for s in scope.spans}
    assert names == {"POST /v1/patients/{pid}/ask", "gate", "chat tiny"}
    assert b"ebmrag-test" in Collector.received[0][1] and b"gen_ai.client.operation.duration" in b"".join(
        b for p, b in Collector.received if p == "/v1/metrics")
