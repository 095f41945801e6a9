"""Issue 43: pulls and exports are the calling tenant's scheduled work (CDS fetches take the same lane code, their
routes in test_cds_routes.py), and an erasure outlasts a pull.

Against a FHIR server of the test's own (`HeldFhir`, a stdlib http.server on 127.0.0.1) that holds each
`$everything` and export-status request until the test releases it, so an erasure lands mid-pull
deterministically: the pull then stores nothing (in-process the erasure stops it; from another process the store's
write refuses it), an export stores no patient erased after it began, the EHR lane is bounded per tenant and in all
(429 / 503 with Retry-After), and a pull stopped at its deadline is a 504 that closed its connection and freed its
place. Over SQLite and PostgreSQL. No timing assertions: the server's events say what happened.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from ebmrag.config import Settings
from ebmrag.ehr.params import EhrParams
from ebmrag.protocols import WorkCancelled, checkpoint
from ebmrag.serve.app import create_app
from ebmrag.serve.outbound import ERASED, EngineSteps, OutboundLane
from ebmrag.serve.problems import ProblemError
from ebmrag.serve.scheduler import FairScheduler
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore, PostgresStore, SQLiteStore
from tests.serve.conftest import POSTGRES_URL, serving

HOLD_LIMIT = 30.0  # seconds a held request waits for its release at most (a failing test must not hang)
PATIENTS = ("p1", "p2")


def chart(patient: str) -> list[dict[str, Any]]:
    return [{"resourceType": "Patient", "id": patient, "name": [{"family": "Doe", "given": [patient]}],
             "birthDate": "1960-04-02"},
            {"resourceType": "Condition", "id": f"{patient}-dm", "subject": {"reference": f"Patient/{patient}"},
             "clinicalStatus": {"coding": [{"code": "active"}]}, "code": {"text": "Type 2 diabetes mellitus"},
             "onsetDateTime": "2019-05-01"}]


class HeldFhir:
    """An open FHIR server whose `$everything` and export-status answers wait for `release()` (or `HOLD_LIMIT`).
    `arrived` is set when such a request comes in; `hung_up` when its client closes the connection meanwhile."""

    def __init__(self) -> None:
        self.gate, self.arrived, self.hung_up = threading.Event(), threading.Event(), threading.Event()
        held = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = self.path.split("?")[0].removeprefix("/fhir/")
                if path == "metadata":
                    self._json(200, {"resourceType": "CapabilityStatement", "rest": [{"resource": [
                        {"type": "Patient", "operation": [{"name": "everything"}]}]}]})
                elif path.startswith("Patient/") and path.endswith("/$everything"):
                    patient = path.split("/")[1]
                    if held.wait(self.connection):
                        self._json(200, {"resourceType": "Bundle", "type": "searchset",
                                         "entry": [{"resource": r} for r in chart(patient)]})
                elif path.startswith("Group/"):
                    self._answer(202, b"", {"Content-Location": f"{held.base}/export-status/1"})
                elif path == "export-status/1":
                    if held.wait(self.connection):
                        self._json(200, {"transactionTime": "2026-03-01T00:00:00Z", "requiresAccessToken": False,
                                         "output": [{"type": "Patient", "url": f"{held.base}/files/1.ndjson"}]})
                elif path == "files/1.ndjson":
                    lines = [json.dumps(r) for p in PATIENTS for r in chart(p)]
                    self._answer(200, "\n".join(lines).encode(), {"Content-Type": "application/fhir+ndjson"})
                else:
                    self._json(404, {"resourceType": "OperationOutcome", "issue": []})

            def do_DELETE(self) -> None:
                self._answer(202, b"", {})

            def _json(self, status: int, body: Any) -> None:
                self._answer(status, json.dumps(body).encode(), {"Content-Type": "application/fhir+json"})

            def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    for name, value in {**headers, "Content-Length": str(len(body))}.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client hung up
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}/fhir"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def wait(self, connection: socket.socket) -> bool:
        """Hold a request until released; False (nothing answered) when its client hung up first."""
        self.arrived.set()
        for _ in range(int(HOLD_LIMIT / 0.02)):
            if self.gate.wait(0.02):
                return True
            readable, _, _ = select.select([connection], [], [], 0)
            if readable and connection.recv(1, socket.MSG_PEEK) == b"":
                self.hung_up.set()
                return False
        return True

    def release(self) -> None:
        self.gate.set()

    def hold(self) -> None:
        self.gate.clear()
        self.arrived.clear()

    def close(self) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def held() -> Iterator[HeldFhir]:
    server = HeldFhir()
    yield server
    server.close()


def _settings(base: str, tenants: tuple[str, ...] = ("acme",), **serve: Any) -> Settings:
    settings = Settings()
    connections = {f"ehr-{t}": {"tenant": t, "fhir_base": base, "allow_http": True} for t in tenants}
    return replace(settings, serve=replace(settings.serve, prepare_charts=False, rate_per_second=1000,
                                           rate_burst=1000, **serve),
                   ehr=EhrParams(connections=connections, error_retries=0, max_backoff_seconds=0.2))


@contextmanager
def _service(store: PatientStore, settings: Settings) -> Iterator[tuple[str, Any]]:
    with serving(create_app(store, settings)) as (url, app):
        yield url, app.state.service


def _client(url: str, store: PatientStore, tenant: str = "acme", role: str = "admin") -> httpx.Client:
    key = create_key(store, tenant, role, ())[0]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _in_background(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, dict[str, httpx.Response]]:
    out: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: out.setdefault("response", call()), daemon=True)
    thread.start()
    return thread, out


def _problem(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"].endswith("/" + kind), body
    return str(body["detail"])


def _pull(client: httpx.Client, patient: str, tenant: str = "acme") -> httpx.Response:
    return client.post(f"/v1/patients/{patient}/pull", json={"connection": f"ehr-{tenant}"})


def _other_process(store: PatientStore, tmp_path: Path) -> PatientStore:
    """Another connection to the same database, as a second serve worker holds."""
    if isinstance(store, SQLiteStore):
        return SQLiteStore(store.path)
    assert isinstance(store, PostgresStore)
    return PostgresStore(POSTGRES_URL, schema=store.schema, audit_key_file=tmp_path / "audit.key")


def test_an_erasure_during_a_pull_stops_it_and_nothing_is_stored(held: HeldFhir, store: PatientStore) -> None:
    with _service(store, _settings(held.base)) as (url, service), _client(url, store) as admin:
        held.release()
        assert _pull(admin, "p1").status_code == 200
        held.hold()
        thread, out = _in_background(lambda: _pull(admin, "p1"))  # a refresh, held by the server
        assert held.arrived.wait(HOLD_LIMIT)
        erased = admin.delete("/v1/patients/p1")
        assert erased.status_code == 200 and erased.json()["erased_fragments"] > 0
        thread.join(HOLD_LIMIT)
        held.release()
        detail = _problem(out["response"], 409, "patient-erased")
        assert detail == "the patient was erased while this pull ran; nothing it fetched was stored"
        assert held.hung_up.wait(HOLD_LIMIT), "the erasure shut the pull's connection to the EHR"
        assert service.ehr_calls.state()["running"] == 0
    assert store.record("acme", "p1") is None and store.pulled_sources("acme", "p1") == []
    assert [row[5] for row in store.audit_rows() if row[4] == "p1"] == ["pull", "erase"], "no pull after the erase"


def test_an_erasure_in_another_process_outlasts_the_pull(held: HeldFhir, store: PatientStore,
                                                         tmp_path: Path) -> None:
    """The erasing worker cannot stop this one's pull; the store's write refuses it instead, even for a first pull
    of a patient the store does not hold yet."""
    other = _other_process(store, tmp_path)
    with _service(store, _settings(held.base)) as (url, _), _client(url, store) as admin:
        thread, out = _in_background(lambda: _pull(admin, "p1"))
        assert held.arrived.wait(HOLD_LIMIT)
        assert other.delete_patient("acme", "p1") is None  # nothing stored yet; the erasure is recorded all the same
        held.release()
        thread.join(HOLD_LIMIT)
        assert "erased while this pull ran" in _problem(out["response"], 409, "patient-erased")
        assert store.record("acme", "p1") is None and store.pulled_sources("acme", "p1") == []
        assert _pull(admin, "p1").status_code == 200, "a pull begun after the erasure stores the chart anew"
    assert store.record("acme", "p1") is not None


def test_an_export_stores_no_patient_erased_after_it_began(held: HeldFhir, store: PatientStore) -> None:
    with _service(store, _settings(held.base)) as (url, _), _client(url, store) as admin:
        held.release()
        first = admin.post("/v1/ehr/ehr-acme/export", json={"group": "ward"})
        assert sorted(p["patient"] for p in first.json()["patients"]) == list(PATIENTS), first.text
        held.hold()
        thread, out = _in_background(lambda: admin.post("/v1/ehr/ehr-acme/export", json={"group": "ward"}))
        assert held.arrived.wait(HOLD_LIMIT)
        assert admin.delete("/v1/patients/p1").status_code == 200
        held.release()
        thread.join(HOLD_LIMIT)
        report = out["response"].json()
    assert [p["patient"] for p in report["patients"]] == ["p2"], report
    assert report["not_stored"] == [{"patient": "p1", "reason": "patient-erased"}]
    assert "patient #1: erased after the export began; not stored" in report["problems"]
    assert store.record("acme", "p1") is None and store.record("acme", "p2") is not None


def test_the_ehr_lane_is_bounded_per_tenant_and_in_all(held: HeldFhir, tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.sqlite")
    settings = _settings(held.base, ("acme", "beta", "gamma"), ehr_calls=2, tenant_ehr_calls=1)
    with _service(store, settings) as (url, _), _client(url, store) as acme, \
            _client(url, store, "beta") as beta, _client(url, store, "gamma") as gamma:
        running = [_in_background(lambda: _pull(acme, "p1"))]
        assert held.arrived.wait(HOLD_LIMIT)
        busy = acme.post("/v1/patients/p2/pull", json={"connection": "ehr-acme"})
        assert "already has 1 EHR calls running" in _problem(busy, 429, "tenant-busy")
        assert 1 <= int(busy.headers["retry-after"]) <= settings.serve.request_seconds
        held.arrived.clear()
        running.append(_in_background(lambda: _pull(beta, "p1", "beta")))
        assert held.arrived.wait(HOLD_LIMIT)
        full = _pull(gamma, "p1", "gamma")
        assert "2 EHR calls are running" in _problem(full, 503, "server-busy")
        assert int(full.headers["retry-after"]) >= 1
        held.release()
        for thread, out in running:
            thread.join(HOLD_LIMIT)
            assert out["response"].status_code == 200, out["response"].text
        assert _pull(gamma, "p1", "gamma").status_code == 200, "the places are free again"
        metrics = httpx.get(f"{url}/metrics").text
    assert 'ebmrag_ehr_call_events_total{lane="ehr",event="refused_429"} 1' in metrics
    assert 'ebmrag_ehr_call_events_total{lane="ehr",event="refused_503"} 1' in metrics
    assert 'ebmrag_ehr_calls{lane="ehr",state="running"} 0' in metrics


def test_a_pull_past_its_deadline_is_a_504_that_closed_its_connection(held: HeldFhir, store: PatientStore) -> None:
    settings = _settings(held.base, request_seconds=1.0, tenant_ehr_calls=1)
    with _service(store, settings) as (url, service), _client(url, store) as admin:
        _problem(_pull(admin, "p1"), 504, "timeout")
        assert service.ehr_calls.state()["running"] == 0, "answered once its thread had ended"
        assert service.scheduler.state()["running"] == 0
        assert held.hung_up.wait(HOLD_LIMIT), "its connection to the EHR was shut, not left to the server"
        held.release()
        assert _pull(admin, "p1").status_code == 200, "the tenant's only place is free again"
    assert [row[5] for row in store.audit_rows() if row[4] == "p1"] == ["pull"]


def test_a_calls_cpu_steps_are_its_tenants_engine_work_and_stop_with_it() -> None:
    """EngineSteps on a real scheduler with one slot, held by another tenant: a step waits for it in the queue,
    runs on an engine thread once free, and a stopped call takes its queued step out without waiting."""
    scheduler = FairScheduler(1, 1, 4, 8, slice_seconds=60)
    lane = OutboundLane(2, 1)
    release = threading.Event()

    def other_tenants_work() -> None:
        while not release.wait(0.01):
            checkpoint()

    blocker = scheduler.submit("other", other_tenants_work, 60)
    call = lane.admit("acme", "p1", 60)
    steps = EngineSteps(call, lambda step, seconds: scheduler.submit(call.tenant, step, seconds), scheduler.cancel)
    outcome: dict[str, Any] = {}

    def stepping() -> None:
        try:
            outcome["ran"] = steps(lambda: threading.current_thread().name)
        except WorkCancelled:
            outcome["stopped"] = True

    thread = threading.Thread(target=stepping)
    thread.start()
    while not scheduler.state()["waiting"]:
        thread.join(0.01)
    call.stop(ERASED)
    thread.join(HOLD_LIMIT)
    assert outcome == {"stopped": True} and scheduler.state()["waiting"] == 0
    release.set()
    blocker.future.result(HOLD_LIMIT)
    again = lane.admit("beta", "p1", 60)
    ran = EngineSteps(again, lambda step, seconds: scheduler.submit(again.tenant, step, seconds),
                      scheduler.cancel)(lambda: threading.current_thread().name)
    assert ran.startswith("ebmrag-engine")


def test_a_full_lane_refuses_before_any_work() -> None:
    lane = OutboundLane(1, 1)
    lane.admit("acme", "", 30)
    with pytest.raises(ProblemError) as refused:
        lane.admit("beta", "", 30)
    assert refused.value.status == 503 and 1 <= int(refused.value.headers["Retry-After"]) <= 30
    assert lane.counts["refused_503"] == 1
