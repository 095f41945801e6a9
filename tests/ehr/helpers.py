"""What the pull tests share: a registered SMART client with a real key, quick [ehr] settings, the real charts, and
the chart a FHIR server can hand over of a file (its resources the server can associate with the patient)."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ebmrag.ehr.compartment import compartment
from ebmrag.ehr.keys import generate, public_jwk, write_private_key
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.ehr.pull import references_in
from ebmrag.records.fhir.bundle import ADMINISTRATIVE, record_from_fhir_bundle
from ebmrag.records.fhir.index import ChartIndex, bundle_entries
from ebmrag.records.fragment import PatientRecord
from ebmrag.store.patients import PatientStore, PostgresStore, SQLiteStore
from tests.ehr.fhir_server import FhirServer

CHARTS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fhir_charts"
CHARTS = sorted(p.name for p in CHARTS_DIR.glob("*.json")) if CHARTS_DIR.is_dir() else []
POSTGRES_URL = os.environ.get("EBMRAG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TENANT = "acme"
# Quick settings for tests: the waits a server asks for are honoured, the backoffs kept short.
QUICK = EhrParams(page_size=50, max_backoff_seconds=0.2, since_skew_seconds=0.0, timeout_seconds=20)


def chart(name: str) -> Path:
    if not CHARTS_DIR.is_dir():
        pytest.fail(f"the shared charts are missing: {CHARTS_DIR}", pytrace=False)
    return CHARTS_DIR / name


def register(fhir: FhirServer, folder: Path, algorithm: str = "ES384", *, scope: str = "system/*.rs",
             registered: str = "system/*.rs", tenant: str = TENANT, name: str = "ehr") -> EhrConnection:
    """A new key pair of `algorithm` (the private half in `folder`, 0600), its public JWKS registered with the
    server for `registered` scopes, and a connection that asks for `scope`."""
    key = generate(algorithm)
    path = folder / f"{name}-{algorithm}-{uuid.uuid4().hex[:6]}.pem"
    write_private_key(key, path)
    client_id = f"ebmrag-{uuid.uuid4().hex[:8]}"
    fhir.register_client(client_id, {"keys": [public_jwk(key, algorithm)]}, registered)
    return EhrConnection(name, tenant, fhir.base, client_id, str(path), "", algorithm, scope, allow_http=True)


def quick(**changes: Any) -> EhrParams:
    return replace(QUICK, **changes)


def fragments_of(name: str) -> int:
    """How many fragments the reader makes of a shared chart read from its file: a pull of the same chart from the
    test server makes as many (the renderers decide the number; the pull must neither add nor lose one)."""
    return len(record_from_fhir_bundle(json.loads(chart(name).read_text("utf-8")), name).fragments)


def load_one(fhir: FhirServer, name: str) -> str:
    patients = fhir.load(chart(name))
    assert len(patients) == 1, f"{name} holds {len(patients)} patients"
    return patients[0]


def reachable_bundle(bundle: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The file without the clinical resources no FHIR server can hand over as this patient's: they name no
    patient and no other resource refers to them (the fhirconv DocumentReferences without subject, an id-less
    eCR Observation, au_missing's Composition with a data-absent subject), or they name the patient only by an
    absolute URL on another server (ips_nl's `http://fhircore:4080/Patient/<id>` where the file's Patient is a
    urn:uuid). A file reader reads them as the one patient's; a server cannot know the first are, and on a server
    the second are another server's patient's (ehr.compartment). Returns (the bundle without them, their types)."""
    entries = bundle_entries(bundle, "file", [])
    index = ChartIndex()
    for entry in entries:
        index.add(entry)
    patient = next(e.resource for e in entries if e.resource.get("resourceType") == "Patient")
    linked: set[int] = set()
    for entry in entries:
        for reference in references_in(entry.resource):
            target = index.resolve({"reference": reference}, entry.resource)
            if target is patient:
                linked.add(id(entry.resource))
            elif target is not None and target is not entry.resource:
                linked.add(id(target))
    orphans = {id(e.resource) for e in entries if e.resource.get("resourceType") not in ADMINISTRATIVE | {"Patient"}
               and id(e.resource) not in linked}
    orphans |= {id(e.resource) for e in entries if _elsewhere(e.resource)}
    kept = [e for e in bundle["entry"] if id(e.get("resource")) not in orphans]
    gone = [str(e["resource"]["resourceType"]) for e in bundle["entry"] if id(e.get("resource")) in orphans]
    return {**bundle, "entry": kept}, gone


def _elsewhere(resource: Mapping[str, Any]) -> bool:
    """A compartment resource whose subject (or patient) is an absolute http(s) URL: a server holding the file
    keeps it as a reference to another server's patient."""
    paths = compartment().types.get(str(resource.get("resourceType")), ())
    links = [resource.get(path.split(".")[0]) for path in paths]
    return any(isinstance(link, Mapping) and str(link.get("reference", "")).startswith(("http://", "https://"))
               for link in links)


def file_record(name: str) -> tuple[PatientRecord, list[str]]:
    bundle = json.loads(chart(name).read_text(encoding="utf-8"))
    reachable, gone = reachable_bundle(bundle)
    return record_from_fhir_bundle(reachable, name), gone


def texts(record: PatientRecord) -> list[str]:
    return [f.text for f in record.fragments]


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PatientStore]:
    """Both backends: PostgreSQL is the machine's (a schema per test, dropped after); unreachable fails the test."""
    if request.param == "sqlite":
        yield SQLiteStore(tmp_path / "store.sqlite")
        return
    backend = PostgresStore(POSTGRES_URL, schema=f"test_{uuid.uuid4().hex[:12]}", audit_key_file=tmp_path / "a.key")
    try:
        yield backend
    finally:
        backend.drop()


def snapshot(store: PatientStore, tenant: str, patient: str, source: str) -> tuple[Any, ...]:
    """Everything a pull writes for one patient: the record, the kept resources, the sync state."""
    record = store.record(tenant, patient)
    return (None if record is None else (record.fragments, record.skipped),
            store.pulled_resources(tenant, patient, source), store.pulled_state(tenant, patient, source))


class Bystander:
    """A second tiny HTTP server on 127.0.0.1 that records every request and answers each with `status` and
    `body`: where a misled client would send what it must not (a client assertion, a file request)."""

    def __init__(self, status: int = 404, body: bytes = b"", content_type: str = "application/json") -> None:
        self.status, self.body, self.content_type = status, body, content_type
        self.received: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                recorder.received.append((self.command, self.path, dict(self.headers)))
                self.send_response(recorder.status)
                self.send_header("Content-Type", recorder.content_type)
                self.send_header("Content-Length", str(len(recorder.body)))
                self.end_headers()
                self.wfile.write(recorder.body)

            do_GET = do_POST = do_DELETE = _answer  # noqa: N815 (http.server's names)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


STRANGER_IDS = ("by-identifier", "elsewhere", "nobodys", "two-patients")


def strangers(patient: str) -> list[dict[str, Any]]:
    """Resources a loose server hands over with the patient's (each refers to the patient somewhere, so the test
    server's $everything returns it) that are not the patient's: an Observation whose subject is an identifier
    and a display, one on another server with the same id, one naming nobody (the patient only performed it),
    and an allergy whose `patient` lists someone else too (security review finding 4)."""
    performed = {"performer": [{"reference": f"Patient/{patient}"}]}

    def observation(rid: str, **subject: Any) -> dict[str, Any]:
        return {"resourceType": "Observation", "id": rid, "status": "final", "code": {"text": f"marker {rid}"},
                "valueString": f"value of {rid}", "effectiveDateTime": "2024-05-01", **performed, **subject}

    return [observation("by-identifier", subject={"identifier": {"system": "urn:mrn", "value": patient},
                                                  "display": "Other Person"}),
            observation("elsewhere", subject={"reference": f"https://other.example/fhir/Patient/{patient}"}),
            observation("nobodys"),
            {"resourceType": "AllergyIntolerance", "id": "two-patients", "code": {"text": "marker penicillin"},
             "patient": [{"reference": "Patient/someone-else"}, {"reference": f"Patient/{patient}"}]}]
