"""The results gateway against a real Redis: the machine's (127.0.0.1:6379, EBMRAG_TEST_REDIS_URL), or
a private `redis-server` on a free port when a test must kill and restart it. Every test uses its own
stream names, so tests never see each other's entries."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from ebmrag.gateway.consumer import ResultConsumer
from ebmrag.gateway.publish import publish
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from ebmrag.store.results import MessageError, ResultMessage, messages_from_hl7, parse_message
from tests.serve.conftest import free_port

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


def fragments(store: SQLiteStore) -> list[str]:
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
