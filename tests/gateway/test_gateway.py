"""The results gateway against a real Redis: the machine's (127.0.0.1:6379, EBMRAG_TEST_REDIS_URL), or
a private `redis-server` on a free port when a test must kill and restart it. Every test uses its own
stream names, so tests never see each other's entries."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from ebmrag.gateway.consumer import ResultConsumer
from ebmrag.gateway.publish import publish
from ebmrag.store import results
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore, PostgresStore, SQLiteStore
from ebmrag.store.results import MessageError, ResultMessage, messages_from_hl7, parse_message
from tests.serve.conftest import POSTGRES_URL, free_port

REDIS_URL = os.environ.get("EBMRAG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
HL7 = ("MSH|^~\\&|LAB|HOSP|EBM|EBM|202603140800||ORU^R01|MSG001|P|2.5\r"
       "PID|1||MRN123^^^HOSP||DOE^JOHN||19500101|M\r"
       "OBR|1||LAB42|80048^Basic metabolic panel|||202603140745\r"
       "OBX|1|NM|2160-0^Creatinine^LN||2.8|mg/dL|0.7-1.3|H|||F\r"
       "OBX|2|NM|2823-3^Potassium^LN||5.1|mmol/L|3.5-5.1|N|||F\r")


def message(n: int, tenant: str = "t", **changes: Any) -> ResultMessage:
    base = {"tenant": tenant, "patient_id": "p1", "result_id": f"r{n}", "kind": "pathology",
            "producer": "slide-model 2.1", "produced_at": datetime(2026, 3, 14, 8, tzinfo=UTC),
            "text": f"Slide {n}: moderately differentiated adenocarcinoma."}
    return ResultMessage.model_validate({**base, **changes})


@pytest.fixture
def stream() -> Iterator[str]:
    name = f"test:{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(name, f"{name}:dead")


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    backend = SQLiteStore(tmp_path / "store.sqlite")
    create_key(backend, "t", "service")  # the tenant exists once a key names it
    return backend


def drain(consumer: ResultConsumer, rounds: int = 20) -> None:
    for _ in range(rounds):
        if consumer.step() == 0:
            break


def test_results_are_stored_once_and_acknowledged(store: SQLiteStore, stream: str) -> None:
    publish(REDIS_URL, [message(n) for n in range(5)] + [message(2)], stream)  # r2 twice: a redelivery
    consumer = ResultConsumer(store, REDIS_URL, stream, block_ms=100)
    drain(consumer)
    record = store.record("t", "p1")
    assert record is not None and [f.id for f in record.fragments] == [f"result:slide-model 2.1:r{n}" for n in range(5)]
    assert record.fragments[0].section == "Pathology report" and "adenocarcinoma" in record.fragments[0].text
    assert redis.Redis.from_url(REDIS_URL).xpending(stream, "ebmrag")["pending"] == 0


def test_poison_and_unknown_tenants_go_to_the_dead_letter_stream_and_are_never_stored(store: SQLiteStore,
                                                                                     stream: str) -> None:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.xadd(stream, {"message": "{not json"})
    publish(REDIS_URL, [message(1, tenant="nobody"), message(2)], stream)
    consumer = ResultConsumer(store, REDIS_URL, stream, block_ms=100)
    drain(consumer)
    dead = client.xrange(f"{stream}:dead")
    assert len(dead) == 2 and "invalid result message" in dead[0][1]["reason"]
    assert "tenant 'nobody' is not known" in dead[1][1]["reason"]
    assert store.record("nobody", "p1") is None
    record = store.record("t", "p1")
    assert record is not None and [f.id for f in record.fragments] == ["result:slide-model 2.1:r2"]


def test_a_crashed_consumers_entries_are_reclaimed(store: SQLiteStore, stream: str) -> None:
    publish(REDIS_URL, [message(n) for n in range(3)], stream)
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.xgroup_create(stream, "ebmrag", id="0", mkstream=True)
    client.xreadgroup("ebmrag", "dead-consumer", {stream: ">"}, count=3)  # read, never acknowledged
    time.sleep(0.2)
    consumer = ResultConsumer(store, REDIS_URL, stream, claim_idle_ms=100, block_ms=100)
    drain(consumer)
    assert consumer.stats.claimed == 3 and len(store.record("t", "p1").fragments) == 3  # type: ignore[union-attr]


def test_messages_are_validated_and_hl7_lab_results_are_read() -> None:
    with pytest.raises(MessageError, match="produced_at"):
        parse_message({**message(1).model_dump(mode="json"), "produced_at": "2026-03-14T08:00:00"})
    with pytest.raises(MessageError, match="text, values or a FHIR resource"):
        parse_message({**message(1).model_dump(mode="json"), "text": ""})
    (lab,) = messages_from_hl7(HL7, "t")
    assert lab.patient_id == "MRN123" and lab.result_id == "MSG001-1" and lab.title == "Basic metabolic panel"
    assert lab.fragment().text == ("Basic metabolic panel: Creatinine 2.8 mg/dL (reference 0.7-1.3; flag H); "
                                   "Potassium 5.1 mmol/L (reference 3.5-5.1).")
    with pytest.raises(MessageError, match="ORU"):
        messages_from_hl7(HL7.replace("ORU^R01", "ADT^A01"), "t")


def test_killing_a_consumer_mid_batch_loses_and_duplicates_nothing(store: SQLiteStore, stream: str,
                                                                  tmp_path: Path) -> None:
    """kill -9 a consumer process in the middle of 3,000 messages, start another: exactly 3,000 fragments. (With
    1,000 the first consumer sometimes finished all of them between the poll that saw 100 and the kill.)"""
    total = 3000
    publish(REDIS_URL, [message(n) for n in range(total)], stream)
    command = [sys.executable, "-m", "ebmrag.cli", "gateway", "run", "--data-dir", str(tmp_path), "--broker",
               REDIS_URL, "--stream", stream, "--claim-idle-ms", "500"]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(fragments(store)) < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    assert len(fragments(store)) < total, "the first consumer was killed mid-batch"
    second = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while len(fragments(store)) < total and time.monotonic() < deadline + 60:
            time.sleep(0.1)
        time.sleep(1.0)  # let it redeliver anything left pending
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=15) == 0, "SIGTERM ends the consumer cleanly"
    ids = fragments(store)
    assert len(ids) == total and len(set(ids)) == total


def fragments(store: PatientStore) -> list[str]:
    record = store.record("t", "p1")
    return [f.id for f in record.fragments] if record else []


def test_consumption_resumes_after_redis_restarts(store: SQLiteStore, tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary, "the gateway's restart test needs redis-server (apt-get install redis-server)"
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "yes", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                return process
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    server = start()
    consumer = ResultConsumer(store, url, "results", block_ms=100, claim_idle_ms=200)
    worker = threading.Thread(target=consumer.run, kwargs={"handle_signals": False}, daemon=True)
    worker.start()
    try:
        publish(url, [message(n) for n in range(10)], "results")
        wait_for(lambda: len(fragments(store)) == 10)
        server.terminate()
        server.wait(timeout=10)
        time.sleep(0.5)
        server = start()
        publish(url, [message(n) for n in range(10, 20)], "results")
        wait_for(lambda: len(fragments(store)) == 20)
        assert consumer.stats.reconnects >= 1
    finally:
        consumer.stop()
        worker.join(timeout=10)
        server.terminate()
        server.wait(timeout=10)


def wait_for(condition: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def test_a_fhir_resource_can_be_the_result() -> None:
    observation = {"resourceType": "Observation", "status": "final", "code": {"text": "Troponin T"},
                   "valueQuantity": {"value": 48, "unit": "ng/L"}, "interpretation": [{"text": "High"}]}
    result = message(7, kind="lab", text="", resource=observation)
    assert result.fragment().text == "Troponin T: 48 ng/L (flag High)."
    with pytest.raises(MessageError, match="Patient is not a result"):
        parse_message({**message(1).model_dump(mode="json"), "resource": {"resourceType": "Patient"}})


def test_a_store_failure_leaves_the_entry_pending_until_it_can_be_stored(store: SQLiteStore, stream: str) -> None:
    publish(REDIS_URL, [message(1)], stream)
    consumer = ResultConsumer(store, REDIS_URL, stream, block_ms=50, claim_idle_ms=100)
    real = store.upsert_fragments
    calls = []

    def failing_once(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk full")
        return real(*args)

    store.upsert_fragments = failing_once  # type: ignore[method-assign]
    consumer.run(until=lambda: len(fragments(store)) == 1 or len(calls) > 5, handle_signals=False)
    assert consumer.stats.failures == 1 and fragments(store) == ["result:slide-model 2.1:r1"]


# ------------------------------------------------------------------ issue 32: no entry blocks the stream


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[PostgresStore]:
    backend = PostgresStore(POSTGRES_URL, schema=f"test_{uuid.uuid4().hex[:12]}", audit_key_file=tmp_path / "audit.key")
    create_key(backend, "t", "service")
    try:
        yield backend
    finally:
        PostgresStore(POSTGRES_URL, schema=backend.schema, audit_key_file=tmp_path / "audit.key").drop()


def broken_resources() -> list[dict[str, Any]]:
    """Result resources of the wrong JSON shape somewhere: a message the store must never see."""
    code = {"text": "Potassium"}
    return [{"resourceType": "Observation", "code": code, "valueQuantity": "x"},
            {"resourceType": "Observation", "code": code, "component": "x"},
            {"resourceType": "ImagingStudy", "series": 5},
            {"resourceType": "Observation", "code": [], "valueString": "6.9"},
            {"resourceType": "DiagnosticReport", "code": code, "conclusion": 5},
            {"resourceType": "Observation", "code": {"coding": [{"code": 2823}]}, "valueQuantity": {"value": 6.9}},
            {"resourceType": "Procedure", "code": code, "performedPeriod": "2026"}]


def raw_message(n: int, **changes: Any) -> str:
    return json.dumps({**message(n).model_dump(mode="json"), **changes})


def test_any_message_that_cannot_become_a_fragment_is_dead_lettered_and_blocks_nothing(
        store: SQLiteStore, stream: str, caplog: pytest.LogCaptureFixture) -> None:
    """A renderer's input of the wrong shape, an id with NUL, bytes that are not UTF-8 (which failed every read of
    the stream before), JSON nested 100,000 deep: each dead-lettered with its reason, never its text in a log."""
    client = redis.Redis.from_url(REDIS_URL)
    secret = "Jane Roe, born 1950-01-01"
    poison = [raw_message(100 + i, kind="lab", text=secret, resource=r) for i, r in enumerate(broken_resources())]
    poison += [raw_message(200, result_id="r\u0000200"), raw_message(201, producer="lab\u001b"),
               raw_message(202, encounter="Encounter/\u0000")]
    for n, payload in enumerate(poison):
        publish(REDIS_URL, [message(n)], stream)
        client.xadd(stream, {"message": payload.encode()})
    client.xadd(stream, {"message": raw_message(203, title=secret).replace("Roe", "Ro\xeb").encode("latin-1")})
    client.xadd(stream, {"message": b"[" * 100_000 + b"]" * 100_000})
    publish(REDIS_URL, [message(99)], stream)
    consumer = ResultConsumer(store, REDIS_URL, stream, block_ms=50, batch=7)
    with caplog.at_level(logging.INFO):
        drain(consumer)
    assert fragments(store) == [f"result:slide-model 2.1:r{n}" for n in [*range(len(poison)), 99]]
    reasons = [fields[b"reason"].decode() for _, fields in client.xrange(f"{stream}:dead")]
    assert len(reasons) == len(poison) + 2 and consumer.stats.dead == len(reasons)
    assert reasons[:3] == [
        "invalid result message: message: Value error, resource: Observation.valueQuantity must be a Quantity (an "
        "object), got a string",
        "invalid result message: message: Value error, resource: Observation.component must be a list of objects, "
        "got a string",
        "invalid result message: message: Value error, resource: ImagingStudy.series must be a list of objects, got "
        "a number"]
    assert "Observation.code must be a CodeableConcept" in reasons[3] and "conclusion must be a string" in reasons[4]
    assert "coding[0].code must be a string" in reasons[5] and "performedPeriod must be a Period" in reasons[6]
    assert all("control character" in r for r in reasons[7:10]), reasons[7:10]
    assert "result_id" in reasons[7] and "producer" in reasons[8] and "encounter" in reasons[9]
    assert "not UTF-8" in reasons[10] and "nested 100000 levels deep" in reasons[11]
    assert client.xpending(stream, "ebmrag")["pending"] == 0
    assert "Jane Roe" not in caplog.text and "1950" not in caplog.text, "reasons, never the payload, are logged"


def test_a_renderer_that_fails_in_any_way_dead_letters_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a renderer raises is the message's fault (a MessageError naming the resource type), not an error
    the consumer would take for a store outage."""
    def crash(*_: Any) -> Any:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(results, "observation", crash)
    resource = {"resourceType": "Observation", "code": {"text": "K"}, "valueQuantity": {"value": 6.9}}
    with pytest.raises(MessageError, match=r"the Observation could not be read \(AttributeError\)"):
        parse_message(raw_message(1, resource=resource))


def refuse(database: Path, fragment_id: str) -> None:
    """The store itself refuses one row, every time (a trigger): what no validation can foresee."""
    with sqlite3.connect(database) as db:
        db.execute(f"CREATE TRIGGER refuse_{abs(hash(fragment_id))} BEFORE INSERT ON fragments "
                   f"WHEN NEW.fragment_id = '{fragment_id}' BEGIN SELECT RAISE(ABORT, 'refused'); END")


def test_an_entry_the_store_keeps_refusing_blocks_nothing_and_is_dead_lettered_at_the_cap(
        store: SQLiteStore, stream: str, tmp_path: Path) -> None:
    """A consumer read 200 entries and died; the store refuses the 41st every time. Before, a reclaimed batch
    stopped at its first failure, so the 59 behind it were never stored and the poison was redelivered forever.
    Now each entry is handled alone, and the poison is dead-lettered after `max_deliveries`; a refused entry
    among new ones (not claimed) costs only itself too."""
    refuse(tmp_path / "store.sqlite", "result:slide-model 2.1:r40")
    refuse(tmp_path / "store.sqlite", "result:slide-model 2.1:r230")
    publish(REDIS_URL, [message(n) for n in range(200)], stream)
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.xgroup_create(stream, "ebmrag", id="0", mkstream=True)
    client.xreadgroup("ebmrag", "crashed-consumer", {stream: ">"}, count=200)  # read, never acknowledged
    publish(REDIS_URL, [message(n) for n in range(200, 260)], stream)
    time.sleep(0.15)
    consumer = ResultConsumer(store, REDIS_URL, stream, claim_idle_ms=100, block_ms=50, max_deliveries=3)
    deadline = time.monotonic() + 30
    consumer.run(until=lambda: consumer.stats.dead == 2 or time.monotonic() > deadline, handle_signals=False)
    ids = fragments(store)
    assert len(ids) == 258 and "result:slide-model 2.1:r40" not in ids and "result:slide-model 2.1:r41" in ids
    dead = client.xrange(f"{stream}:dead")
    assert [fields["reason"] for _, fields in dead] == [
        "delivered 3 times without being stored (last: IntegrityError)"] * 2
    assert {json.loads(fields["message"])["result_id"] for _, fields in dead} == {"r40", "r230"}
    # r40 was tried twice (the crashed consumer's read was its first delivery), r230 three times
    assert consumer.stats.failures == 5 and consumer.stats.outages == 0 and consumer.stats.capped == 2
    assert client.xpending(stream, "ebmrag")["pending"] == 0


def test_an_entry_delivered_too_often_is_dead_lettered_without_another_try(store: SQLiteStore, stream: str) -> None:
    """An entry that kills every consumer that takes it (it never fails: its consumer dies) is counted by Redis's
    own delivery count and dead-lettered once past the cap, untried."""
    publish(REDIS_URL, [message(1), message(2)], stream)
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.xgroup_create(stream, "ebmrag", id="0", mkstream=True)
    (_, [(first, _), _]), = client.xreadgroup("ebmrag", "died-1", {stream: ">"}, count=2)
    for n in range(2, 6):  # four more consumers took the first entry and died with it
        client.xclaim(stream, "ebmrag", f"died-{n}", 0, [first])
    time.sleep(0.15)
    consumer = ResultConsumer(store, REDIS_URL, stream, claim_idle_ms=100, block_ms=50, max_deliveries=5)
    drain(consumer)
    assert fragments(store) == ["result:slide-model 2.1:r2"]
    (_, fields), = client.xrange(f"{stream}:dead")
    assert fields["reason"] == "delivered 5 times without being stored" and fields["entry"] == first
    with pytest.raises(ValueError, match="max_deliveries"):
        ResultConsumer(store, REDIS_URL, stream, max_deliveries=0)


def test_nul_in_a_result_id_on_postgresql_is_dead_lettered_not_retried(postgres: PostgresStore, stream: str) -> None:
    """PostgreSQL refuses NUL in text: the message was taken for a store outage and redelivered forever."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    client.xadd(stream, {"message": raw_message(1, result_id="r\u00001")})
    publish(REDIS_URL, [message(2)], stream)
    consumer = ResultConsumer(postgres, REDIS_URL, stream, block_ms=50)
    drain(consumer)
    assert fragments(postgres) == ["result:slide-model 2.1:r2"]
    (_, fields), = client.xrange(f"{stream}:dead")
    assert "result_id" in fields["reason"] and "U+0000" in fields["reason"]


def test_a_store_outage_loses_nothing_and_uses_up_no_deliveries(postgres: PostgresStore, stream: str,
                                                              tmp_path: Path) -> None:
    """The store's connection is cut: the entries stay pending, nothing is claimed while the store does not
    answer (so the delivery cap is not reached however long it lasts), and all are stored once it is back."""
    publish(REDIS_URL, [message(n) for n in range(5)], stream)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (postgres._db.info.backend_pid,))
    consumer = ResultConsumer(postgres, REDIS_URL, stream, claim_idle_ms=100, block_ms=50, max_deliveries=2)
    away = time.monotonic() + 2.0  # 20 claim intervals
    consumer.run(until=lambda: time.monotonic() > away, handle_signals=False)
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    waiting = client.xpending_range(stream, "ebmrag", min="-", max="+", count=10)
    assert len(waiting) == 5 and max(w["times_delivered"] for w in waiting) == 1
    assert consumer.stats.outages == 1 and consumer.stats.dead == 0 and consumer.stats.stored == 0
    consumer.store = PostgresStore(POSTGRES_URL, schema=postgres.schema, audit_key_file=tmp_path / "audit.key")
    deadline = time.monotonic() + 30
    consumer.run(until=lambda: consumer.stats.stored == 5 or time.monotonic() > deadline, handle_signals=False)
    assert fragments(consumer.store) == [f"result:slide-model 2.1:r{n}" for n in range(5)]
    assert consumer.stats.dead == 0 and client.xpending(stream, "ebmrag")["pending"] == 0
