"""The service end to end over HTTP, on SQLite and PostgreSQL: access, isolation, records, answers, errors."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ebmrag.answer.params import AnswerParams
from tests.serve.conftest import Live

pytestmark = pytest.mark.model

ALLERGY_TEXT = "Anaphylaxis to penicillin in 2014, throat swelling, adrenaline given."
RECORD = {"patient_id": "anything", "fragments": [
    {"id": "allergy", "text": ALLERGY_TEXT, "section": "Allergies", "timestamp": "2026-03-01T09:00:00Z"},
    {"id": "labs", "text": "Creatinine 2.8 mg/dL, up from 1.1 mg/dL.", "section": "Labs",
     "timestamp": "2026-03-14T08:00:00Z"},
    {"id": "note", "text": "Wound red and warm since yesterday, temperature 38.6 C.", "section": "Progress note",
     "timestamp": "2026-03-14T09:00:00Z"}]}
BUNDLE = {"resourceType": "Bundle", "type": "collection", "entry": [
    {"fullUrl": "urn:uuid:p1", "resource": {"resourceType": "Patient", "id": "p1", "gender": "female",
                                            "birthDate": "1950-01-01"}},
    {"resource": {"resourceType": "Observation", "id": "o1", "status": "final", "subject": {"reference": "urn:uuid:p1"},
                  "category": [{"coding": [{"code": "laboratory"}]}], "code": {"text": "Creatinine"},
                  "valueQuantity": {"value": 2.8, "unit": "mg/dL"}, "effectiveDateTime": "2026-01-02T10:00:00Z"}}]}


def problem(response: Any, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"].endswith("/" + kind) and body["status"] == status and "Traceback" not in response.text
    return body


def test_health_ready_metrics_and_openapi(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json()["store"] == live.store.backend
        paths = http.get("/openapi.json").json()["paths"]
        assert {"/v1/patients/{pid}", "/v1/patients/{pid}/ask", "/v1/search"} <= set(paths)
        problem(http.get("/v1/patients/p1/fragments"), 401, "unauthorized")
        metrics = http.get("/metrics").text
    assert 'ebmrag_requests_total{route="/v1/patients/{pid}/fragments",status="401"} 1' in metrics


def test_keys_roles_and_tenants_never_see_each_other(serve: Callable[..., Live]) -> None:
    live = serve()
    feed_a, feed_b = live.key("hospital-a", "service"), live.key("hospital-b", "service")
    with live.client(feed_a) as a, live.client(feed_b) as b:
        assert a.put("/v1/patients/p1", json=RECORD).json()["fragments"] == 3
        assert b.put("/v1/patients/p1", json=dict(RECORD, fragments=RECORD["fragments"][1:])).status_code == 200
        mine = a.get("/v1/patients/p1/fragments").json()["fragments"]
        theirs = b.get("/v1/patients/p1/fragments").json()["fragments"]
    assert {f["id"] for f in mine} == {"allergy", "labs", "note"} and {f["id"] for f in theirs} == {"labs", "note"}
    assert next(f for f in mine if f["id"] == "allergy")["must_keep"]
    with live.client(live.key("hospital-b", "admin")) as admin_b:
        problem(admin_b.get("/v1/patients/p2/fragments"), 404, "not-found")
    with live.client(live.key("hospital-a", "clinician", "p2")) as limited:
        assert problem(limited.get("/v1/patients/p1/fragments"), 404, "not-found")["detail"] == "no such patient"
        problem(limited.put("/v1/patients/p2", json=RECORD), 403, "forbidden")
    with live.client("ebm_0123456789ab_" + "x" * 40) as forged:
        problem(forged.get("/v1/patients/p1/fragments"), 401, "unauthorized")
    revoked = live.key("hospital-a", "clinician")
    live.store.revoke(revoked.split("_")[1])
    with live.client(revoked) as old:
        assert "revoked" in problem(old.get("/v1/patients/p1/fragments"), 401, "unauthorized")["detail"]


def test_fhir_bundles_pack_and_ask(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as http:
        stored = http.put("/v1/patients/p9", content=json.dumps(BUNDLE),
                          headers={"Content-Type": "application/fhir+json"}).json()
        assert stored["fragments"] >= 2
        packed = http.post("/v1/patients/p9/pack", json={"query": "Kidney function?", "window": 128}).json()
        assert "creatinine 2.8 mg/dl" in packed["context"].lower() and packed["question_type"] == "general"
        http.put("/v1/patients/p1", json=RECORD)
        answer = http.post("/v1/patients/p1/ask", json={"question": "Which antibiotic is safe for his wound "
                                                                    "infection?", "window": 2048}).json()
    assert set(answer) == {"decision", "answer", "citations", "unsupported", "trace"}
    assert "anaphylaxis to penicillin" in answer["answer"].lower()
    assert answer["decision"]["question_type"] == "drug_choice" and answer["trace"]["retrieval"]["performed"]


def test_ccda_and_ndjson_charts_are_stored_as_records(serve: Callable[..., Live], shared_data: Path) -> None:
    """Issue 29: a C-CDA document (XML) and one patient's Bulk Data NDJSON are charts the service reads."""
    ccda = (shared_data / "fhir_charts" / "ccda_progress_note_adam_everyman.xml").read_bytes()
    ndjson = "\n".join(json.dumps(r) for r in (
        {"resourceType": "Patient", "id": "x", "gender": "male", "birthDate": "1950-01-01"},
        {"resourceType": "AllergyIntolerance", "id": "a", "patient": {"reference": "Patient/x"},
         "code": {"text": "Penicillin"}, "criticality": "high"}))
    two = ndjson + "\n" + json.dumps({"resourceType": "Patient", "id": "y"})
    live = serve()
    with live.client(live.key("t", "service")) as http:
        assert http.put("/v1/patients/c1", content=ccda, headers={"Content-Type": "application/xml"}).json()[
            "fragments"] >= 10
        texts = " ".join(f["text"] for f in http.get("/v1/patients/c1/fragments").json()["fragments"])
        assert "atenolol" in texts.lower() and "penicillin" in texts.lower()
        http.put("/v1/patients/n1", content=ndjson, headers={"Content-Type": "application/fhir+ndjson"})
        texts = " ".join(f["text"] for f in http.get("/v1/patients/n1/fragments").json()["fragments"])
        assert "Penicillin" in texts
        problem(http.put("/v1/patients/n2", content=two, headers={"Content-Type": "application/fhir+ndjson"}),
                422, "not-one-patient")
        problem(http.put("/v1/patients/c2", content=b"<html/>", headers={"Content-Type": "application/xml"}),
                422, "invalid-record")


def test_appending_is_idempotent_and_upserts_by_id(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as http:
        http.put("/v1/patients/p1", json=RECORD)
        extra = {"patient_id": "p1", "fragments": [{"id": "culture", "text": "Wound swab grew MRSA."}]}
        first = http.post("/v1/patients/p1/fragments", json=extra, headers={"Idempotency-Key": "k1"}).json()
        again = http.post("/v1/patients/p1/fragments", json=extra, headers={"Idempotency-Key": "k1"}).json()
        assert first["added"] == 1 and again.get("replayed") and again["added"] == 1
        changed = {"patient_id": "p1", "fragments": [{"id": "labs", "text": "Creatinine 3.1 mg/dL."}]}
        assert http.post("/v1/patients/p1/fragments", json=changed).json() == {
            "patient": "p1", "added": 0, "replaced": 1, "record_skipped": []}
        fragments = http.get("/v1/patients/p1/fragments").json()["fragments"]
    assert [f["id"] for f in fragments] == ["allergy", "labs", "note", "culture"]
    assert fragments[1]["text"] == "Creatinine 3.1 mg/dL."


def test_erasure_removes_the_record_and_what_the_caches_hold_of_it(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as feed:
        feed.put("/v1/patients/p1", json=RECORD)
        feed.post("/v1/patients/p1/pack", json={"query": "allergies?", "window": 256})
        problem(feed.delete("/v1/patients/p1"), 403, "forbidden")
    embedder = live.app.state.service.engine().packer.embedder
    assert embedder._key(ALLERGY_TEXT) in embedder._memory
    with live.client(live.key("t", "admin")) as admin:
        erased = admin.delete("/v1/patients/p1").json()
        assert erased["erased_fragments"] == 3
        problem(admin.get("/v1/patients/p1/fragments"), 404, "not-found")
        problem(admin.delete("/v1/patients/p1"), 404, "not-found")
    assert embedder._key(ALLERGY_TEXT) not in embedder._memory


@pytest.mark.parametrize(("body", "content_type", "status", "kind"), [
    (b"{not json", "application/json", 400, "malformed-json"),
    (json.dumps(RECORD).encode(), "text/plain", 415, "unsupported-media-type"),
    (json.dumps({"patient_id": "x", "fragments": []}).encode(), "application/json", 422, "invalid-record"),
    (json.dumps({"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": {"resourceType": "Patient", "id": "a"}},
        {"resource": {"resourceType": "Patient", "id": "a", "name": [{"family": "Other"}]}},
        {"resource": {"resourceType": "AllergyIntolerance", "id": "x", "patient": {"reference": "Patient/a"},
                      "code": {"text": "Penicillin"}}}]}).encode(), "application/fhir+json", 422, "invalid-record"),
])
def test_bad_input_is_a_problem_and_stores_nothing(serve: Callable[..., Live], body: bytes, content_type: str,
                                                   status: int, kind: str) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as http:
        problem(http.put("/v1/patients/p1", content=body, headers={"Content-Type": content_type}), status, kind)
        problem(http.get("/v1/patients/p1/fragments"), 404, "not-found")
        problem(http.put("/v1/patients/../etc", json=RECORD), 404, "not-found")
        problem(http.post("/v1/patients/p1/pack", json={"query": "x", "window": 0}), 422, "invalid-request")
        problem(http.post("/v1/patients/p1/ask", json={"question": "x", "bogus": 1}), 422, "invalid-request")


def test_limits_body_size_and_rate(serve: Callable[..., Live]) -> None:
    live = serve(max_body_mb=0.001, rate_per_second=0.5, rate_burst=3)
    with live.client(live.key("t", "service")) as http:
        problem(http.put("/v1/patients/p1", content=b"x" * 5000, headers={"Content-Type": "application/json"}),
                413, "payload-too-large")
        for _ in range(3):  # the burst (the refused upload never reached the key check)
            problem(http.get("/v1/patients/p1/fragments"), 404, "not-found")
        limited = http.get("/v1/patients/p1/fragments")
        problem(limited, 429, "rate-limited")
        assert int(limited.headers["Retry-After"]) >= 1


def test_postgresql_row_security_hides_other_tenants_rows_even_without_a_where_clause(tmp_path: Any) -> None:
    """Isolation where data is read: a tenant-scoped transaction that forgets its WHERE still sees one tenant."""
    from ebmrag.records.loaders import record_from_json
    from ebmrag.store.patients import PostgresStore
    from tests.serve.conftest import POSTGRES_URL

    store = PostgresStore(POSTGRES_URL, schema=f"rls_{uuid.uuid4().hex[:10]}")
    try:
        assert store.row_security
        store.put_record("ta", "p1", record_from_json(dict(RECORD, patient_id="p1"), "a"))
        store.put_record("tb", "p1", record_from_json(dict(RECORD, patient_id="p1",
                                                           fragments=RECORD["fragments"][:1]), "b"))
        with store.transaction("ta") as cur:
            cur.execute("SELECT tenant, count(*) FROM fragments GROUP BY tenant")
            assert cur.fetchall() == [("ta", 3)]
        with store.transaction("tb") as cur:
            cur.execute("SELECT count(*) FROM fragments")
            assert cur.fetchone()[0] == 1
            with pytest.raises(Exception, match="row-level security"):
                cur.execute("INSERT INTO fragments VALUES ('ta', 'p9', 'x', 0, '{}')")
    finally:
        store.drop()


def test_the_shared_knowledge_base_changes_only_through_its_admin_tenant(tmp_path: Any, store: Any, resources: Any,
                                                                       context_packer: Any, embedder: Any) -> None:
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.retrieve.vote import DocumentVoter
    from tests.engines import engine_from_parts, over_knowledge_base, rrf_retriever
    from tests.serve.conftest import running

    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    voter = DocumentVoter(rrf_retriever(kb))
    engine = engine_from_parts(resources, AnswerParams(retrieval="never"), packer=context_packer, voter=voter)
    with running(store, engine, over_knowledge_base(resources, kb)) as live:
        docs = {"documents": [
            {"doc_id": "g1", "title": "Penicillin allergy", "authority": "guideline",
             "text": "After anaphylaxis to penicillin avoid all penicillins; a cephalosporin with a dissimilar "
                     "side chain may be used with monitoring."},
            {"doc_id": "g2", "title": "Renal dosing", "text": "Reduce aminoglycoside doses when creatinine rises."}]}
        with live.client(live.key("hospital-a", "admin")) as other_admin:
            problem(other_admin.post("/v1/kb/documents", json=docs), 403, "forbidden")
        with live.client(live.key("ebmrag", "admin")) as admin:
            assert admin.post("/v1/kb/documents", json=docs).json()["added"] == ["g1", "g2"]
            assert admin.get("/v1/kb/stats").json()["documents"] == 2
            hits = admin.post("/v1/search", json={"query": "penicillin anaphylaxis", "k": 3, "mode": "bm25"}).json()
            assert hits[0]["doc_id"] == "g1"
            assert admin.delete("/v1/kb/documents/g2").json() == {"deleted": ["g2"]}
            problem(admin.delete("/v1/kb/documents/g2"), 404, "not-found")
        with live.client(live.key("ebmrag", "clinician")) as clinician:
            problem(clinician.get("/v1/kb/stats"), 403, "forbidden")


def test_ask_streams_stage_events_then_the_answer(store: Any, resources: Any, context_packer: Any,
                                                  demo_voter: Any) -> None:
    """Accept: text/event-stream on the model path: one event per stage as it ends, then the answer text,
    then the ask JSON (a real fake model server on 127.0.0.1)."""
    from ebmrag.llm.openai import OpenAIChatClient
    from tests.answer.test_engine_llm import clinician
    from tests.fake_openai import FakeOpenAI
    from tests.fake_openai import serve as serve_model
    from tests.serve.conftest import demo_engine, running

    with serve_model(FakeOpenAI(clinician())) as url:
        engine, built_from = demo_engine(resources, context_packer, demo_voter,
                                         OpenAIChatClient(url, "tiny", max_retries=0))
        with running(store, engine, built_from) as live, live.client(live.key("t", "service")) as http:
            http.put("/v1/patients/p1", json=RECORD)
            with http.stream("POST", "/v1/patients/p1/ask", json={"question": "Which antibiotic is safe?",
                                                                  "window": 6000},
                             headers={"Accept": "text/event-stream"}) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                raw = "".join(response.iter_text())
    events = [(block.split("\n")[0].removeprefix("event: "), json.loads(block.split("\n")[1].removeprefix("data: ")))
              for block in raw.strip().split("\n\n")]
    names = [name for name, _ in events]
    assert names[:2] == ["stage", "stage"] and names[-2:] == ["answer", "result"]
    assert [data["stage"] for name, data in events if name == "stage"][:2] == ["evidence_evaluator",
                                                                               "answer_generator"]
    assert "anaphylaxis to penicillin" in events[-2][1]["text"] and events[-1][1]["answer"] == events[-2][1]["text"]


def test_results_without_a_broker_and_asking_while_one_is_pending(serve: Callable[..., Live]) -> None:
    """POST /v1/results runs the gateway's logic; an announced result shows in the ask trace, and
    wait_ms waits for it (here it arrives during the wait)."""
    live = serve()
    announced = {"tenant": "t", "patient_id": "p1", "result_id": "s7", "kind": "pathology",
                 "producer": "slide-model 2.1", "produced_at": "2026-03-14T09:00:00Z", "status": "pending"}
    final = dict(announced, status="final", text="Slide s7: adenocarcinoma, margins clear.")
    with live.client(live.key("t", "service")) as http:
        http.put("/v1/patients/p1", json=RECORD)
        assert http.post("/v1/results", json=[announced, dict(announced, tenant="other"), {"bad": 1}]).json() == {
            "stored": 0, "pending": 1, "rejected": [
                {"index": 1, "reason": "the message names a tenant or patient this key may not write"},
                {"index": 2, "reason": "invalid result message: tenant: Field required"}]}
        waiting = http.post("/v1/patients/p1/ask", json={"question": "What did the biopsy show?"}).json()
        assert [p["id"] for p in waiting["trace"]["pending_results"]] == ["result:slide-model 2.1:s7"]
        timer = threading.Timer(0.5, lambda: http.post("/v1/results", json=final))
        timer.start()
        with live.client(live.key("t", "clinician")) as reader:
            arrived = reader.post("/v1/patients/p1/ask", json={"question": "What did the biopsy show?",
                                                               "wait_ms": 10_000}).json()
        timer.join()
    assert arrived["trace"]["pending_results"] == [] and 400 <= arrived["trace"]["waited_ms"] < 10_000
    assert "margins clear" in arrived["answer"]


def test_a_chunked_upload_without_a_length_is_bounded_too(serve: Callable[..., Live]) -> None:
    live = serve(max_body_mb=0.001)
    with live.client(live.key("t", "service")) as http:
        def chunks() -> Any:
            for _ in range(10):
                yield b" " * 500
        response = http.put("/v1/patients/p1", content=chunks(), headers={"Content-Type": "application/json"})
        problem(response, 413, "payload-too-large")
        problem(http.post("/v1/results", content=chunks(), headers={"Content-Type": "application/json"}), 413,
                "payload-too-large")
