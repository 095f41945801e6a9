"""The service traced end to end: real requests through a real uvicorn, a real store and an engine whose model is
an OpenAI-compatible server on 127.0.0.1. A chart whose patient id, name, fragment ids and texts carry a planted
marker is stored, asked about (the question, the headers and the model's prompts carry it too), packed, looked up
where it does not exist, sent a bad body, erased; then the span tree is checked, and the marker searched for in
every exported span (name, context, attributes, events, links, status, resource) and in /metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.store.patients import SQLiteStore
from tests.answer.test_engine_llm import clinician
from tests.fake_openai import FakeOpenAI
from tests.fake_openai import serve as serve_model
from tests.observe.conftest import Telemetry, dumped
from tests.serve.conftest import demo_engine, running

pytestmark = pytest.mark.model

MARKER = "MARKER7f3a"
PID = f"{MARKER}-p1"
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
RECORD = {"patient_id": PID, "fragments": [
    {"id": f"demographics-{MARKER}", "text": f"Jane {MARKER} Doe, MRN {MARKER}-0042, born 1950-01-01.",
     "section": "Demographics", "timestamp": "2026-03-01T09:00:00Z"},
    {"id": "allergy", "text": f"Anaphylaxis to penicillin in 2014 ({MARKER}), throat swelling, adrenaline given.",
     "section": "Allergies", "timestamp": "2026-03-01T09:00:00Z"},
    {"id": "labs", "text": "Creatinine 2.8 mg/dL, up from 1.1 mg/dL.", "section": "Labs",
     "timestamp": "2026-03-14T08:00:00Z"},
    {"id": "note", "text": f"Wound red and warm since yesterday, {MARKER} febrile at 38.6 C.",
     "section": "Progress note", "timestamp": "2026-03-14T09:00:00Z"}]}
STAGES = ["gate", "retrieval", "packing", "answer", "grounding"]


def requests(url: str, key: str, admin: str) -> dict[str, int]:
    """Each request of the scenario -> its status."""
    caller = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": f"ehr={MARKER}",
              "baggage": f"patient={MARKER}", "X-Request-ID": MARKER, "User-Agent": MARKER}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        return {
            "put": http.put(f"/v1/patients/{PID}", json=RECORD).status_code,
            "ask": http.post(f"/v1/patients/{PID}/ask?note={MARKER}", headers=caller, json={
                "question": f"Which antibiotic is safe for {MARKER}'s wound infection?", "window": 6000}).status_code,
            "stream": http.post(f"/v1/patients/{PID}/ask", headers={"Accept": "text/event-stream"}, json={
                "question": f"Is {MARKER} allergic to anything?", "window": 6000}).status_code,
            "pack": http.post(f"/v1/patients/{PID}/pack", json={"query": f"Kidney function of {MARKER}?",
                                                                 "window": 256}).status_code,
            "missing": http.get(f"/v1/patients/{MARKER}-nobody/fragments").status_code,
            "invalid": http.post(f"/v1/patients/{PID}/ask", json={"question": MARKER, "window": MARKER}).status_code,
            "erase": http.delete(f"/v1/patients/{PID}", headers={"Authorization": f"Bearer {admin}"}).status_code,
            "unrouted": http.get(f"/{MARKER}/x").status_code,
            "unkeyed": httpx.get(f"{url}/v1/patients/{PID}/fragments").status_code,
        }


def finished(telemetry: Telemetry, servers: int) -> list[ReadableSpan]:
    """The spans once `servers` request spans have ended (a span ends just after its response is sent)."""
    deadline = time.monotonic() + 10
    while sum(s.kind is SpanKind.SERVER for s in telemetry.finished()) < servers and time.monotonic() < deadline:
        time.sleep(0.02)
    return telemetry.finished()


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id),
                  key=lambda s: s.start_time or 0)


def server(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.kind is SpanKind.SERVER and s.name == name]


def attribute(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def test_the_request_span_holds_the_stage_and_model_spans_and_no_patient_data(
        telemetry: Telemetry, tmp_path: Path, resources: Any, context_packer: Any, demo_voter: Any) -> None:
    model = FakeOpenAI(clinician())
    with serve_model(model) as model_url:
        engine, built_from = demo_engine(resources, context_packer, demo_voter,
                                         OpenAIChatClient(model_url, "tiny", max_retries=0))
        with running(SQLiteStore(tmp_path / "store.sqlite"), engine, built_from) as live:
            statuses = requests(live.url, live.key("t", "service"), live.key("t", "admin"))
            spans = finished(telemetry, servers=len(statuses))
            metrics = httpx.get(f"{live.url}/metrics").text
    assert statuses == {"put": 200, "ask": 200, "stream": 200, "pack": 200, "missing": 404, "invalid": 422,
                        "erase": 200, "unrouted": 404, "unkeyed": 401}

    # Every request is one SERVER span named by its method and route template, never its path.
    names = {(s.name, attribute(s, "http.response.status_code")) for s in spans if s.kind is SpanKind.SERVER}
    assert names == {("PUT /v1/patients/{pid}", 200), ("POST /v1/patients/{pid}/ask", 200),
                     ("POST /v1/patients/{pid}/pack", 200), ("GET /v1/patients/{pid}/fragments", 404),
                     ("POST /v1/patients/{pid}/ask", 422), ("DELETE /v1/patients/{pid}", 200), ("GET", 404),
                     ("GET /v1/patients/{pid}/fragments", 401)}

    # The ask: a child of the caller's span, in the caller's trace, its stages below it, the model calls below the
    # answer stage, the packer below packing; every span of the request in that one trace.
    ask, streamed = sorted((s for s in server(spans, "POST /v1/patients/{pid}/ask")
                            if attribute(s, "http.response.status_code") == 200), key=lambda s: s.start_time or 0)
    assert f"{ask.context.trace_id:032x}" == TRACE_ID and ask.parent is not None
    assert f"{ask.parent.span_id:016x}" == PARENT_ID and attribute(ask, "http.route") == "/v1/patients/{pid}/ask"
    stages = {s.name: s for s in children(spans, ask)}
    assert [s.name for s in children(spans, ask)] == STAGES
    assert all(attribute(stages[name], "ebmrag.stage") == name for name in STAGES)
    calls = children(spans, stages["answer"])
    assert len(calls) >= 3 and len([s for s in spans if s.name == "chat tiny"]) == len(model.requests), \
        "one span per model call (the answer's stages)"
    assert {s.name for s in calls} == {"chat tiny"} and all(s.kind is SpanKind.CLIENT for s in calls)
    assert all(attribute(s, "gen_ai.usage.input_tokens") == 11 and attribute(s, "gen_ai.usage.output_tokens") == 3
               for s in calls)
    assert [s.name for s in children(spans, stages["packing"])] == ["pack"]
    assert "search" in {s.name for s in children(spans, stages["retrieval"])}
    in_trace = [s for s in spans if s.context.trace_id == ask.context.trace_id]
    assert len(in_trace) >= 1 + len(STAGES) + len(calls) + 1 + 1
    assert {s.name for s in spans if s.kind is SpanKind.SERVER and s is not ask and s.context.trace_id
            == ask.context.trace_id} == set(), "the other requests start traces of their own"

    assert [s.name for s in children(spans, streamed)] == STAGES, "server-sent events: the same tree"
    assert streamed.context.trace_id != ask.context.trace_id and streamed.parent is None
    pack = server(spans, "POST /v1/patients/{pid}/pack")[0]
    assert [s.name for s in children(spans, pack)] == ["pack"], "the /pack route's packer, on a scheduler thread"

    # No planted marker anywhere a collector or Prometheus would receive; it was there to leak (the model's prompts
    # hold it), and no library under the service made spans of its own (FastAPI's native telemetry is off).
    assert MARKER in json.dumps(model.requests)
    assert MARKER.lower() not in dumped(spans).lower()
    assert {s.instrumentation_scope.name for s in telemetry.everything.get_finished_spans()
            if s.instrumentation_scope is not None} == {"ebmrag"}
    assert MARKER.lower() not in metrics.lower()
    for line in ('ebmrag_requests_total{route="/v1/patients/{pid}/ask",status="200"} 2',
                 'ebmrag_request_duration_seconds_count{route="/v1/patients/{pid}/ask"} 3',
                 'ebmrag_stage_duration_seconds_bucket{stage="gate",le="+Inf"}', 'ebmrag_queue_depth{queue="engine"} 0',
                 'ebmrag_model_tokens_total{provider="openai",model="tiny",type="input"}',
                 'ebmrag_engine_work{state="waiting"} 0'):
        assert line in metrics, line
