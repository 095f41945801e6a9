"""kill -9 during a large Bundle upload: after a restart the patient holds the whole Bundle or the previous
record, never part of one (a real `ebmrag serve` process, SQLite store)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from tests.serve.conftest import free_port

OBSERVATIONS = 6000


def big_bundle() -> bytes:
    entries = [{"fullUrl": "urn:uuid:p", "resource": {"resourceType": "Patient", "id": "p"}}]
    entries += [{"resource": {"resourceType": "Observation", "id": f"o{i}", "status": "final",
                              "subject": {"reference": "urn:uuid:p"}, "code": {"text": f"Analyte {i}"},
                              "valueQuantity": {"value": i, "unit": "mg/dL"},
                              "effectiveDateTime": "2026-01-02T10:00:00Z"}} for i in range(OBSERVATIONS)]
    return json.dumps({"resourceType": "Bundle", "type": "collection", "entry": entries}).encode()


def start(data_dir: Path, port: int, workers: int = 1) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", "ebmrag.cli", "serve", "--data-dir", str(data_dir),
                                "--port", str(port), "--workers", str(workers)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("ebmrag serve did not start")


@pytest.mark.parametrize("delay", [0.3, 0.8, 1.1, 1.5])
def test_a_killed_upload_leaves_the_old_record_or_the_whole_new_one(tmp_path: Path, delay: float) -> None:
    key = create_key(SQLiteStore(tmp_path / "store.sqlite"), "t", "service")[0]
    headers = {"Authorization": f"Bearer {key}"}
    port = free_port()
    server = start(tmp_path, port)
    url = f"http://127.0.0.1:{port}/v1/patients/p1"
    old = {"patient_id": "p1", "fragments": [{"id": f"f{i}", "text": f"Old note {i}."} for i in range(3)]}
    assert httpx.put(url, json=old, headers=headers, timeout=30).status_code == 200
    body = big_bundle()
    upload = threading.Thread(target=lambda: _quietly_put(url, body, headers), daemon=True)
    upload.start()
    time.sleep(delay)
    os.kill(server.pid, signal.SIGKILL)
    server.wait(timeout=10)
    server = start(tmp_path, port)
    try:
        response = httpx.get(url + "/fragments", headers=headers, timeout=60)
        ids = [f["id"] for f in response.json()["fragments"]]
    finally:
        server.kill()
        server.wait(timeout=10)
    assert ids == ["f0", "f1", "f2"] or len([i for i in ids if i.startswith("Observation/")]) == OBSERVATIONS


def _quietly_put(url: str, body: bytes, headers: dict[str, str]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server is killed under it
        httpx.put(url, content=body, headers={**headers, "Content-Type": "application/fhir+json"}, timeout=60)


def test_worker_processes_share_the_store_and_one_unbroken_audit_chain(tmp_path: Path) -> None:
    """`serve --workers 2`: concurrent writes through both processes, then `audit verify` on the chain."""
    from concurrent.futures import ThreadPoolExecutor

    from ebmrag.store.audit import verify

    store = SQLiteStore(tmp_path / "store.sqlite")
    key = create_key(store, "t", "service")[0]
    port = free_port()
    server = start(tmp_path, port, workers=2)
    headers = {"Authorization": f"Bearer {key}"}

    def write(n: int) -> int:
        record = {"patient_id": f"p{n}", "fragments": [{"id": "a", "text": f"Note {n}."}]}
        return httpx.put(f"http://127.0.0.1:{port}/v1/patients/p{n % 5}", json=record, headers=headers,
                         timeout=60).status_code

    try:
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(write, range(60)))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert statuses == [200] * 60
    rows = store.audit_rows()
    assert len(rows) == 60 and verify(store).intact  # both workers used the one audit key they raced to make
