"""The service's pull routes over real HTTP, against the real test FHIR server: `POST /v1/patients/{pid}/pull`
and `POST /v1/ehr/{connection}/export` with keys of two tenants, audited writes, problems for every refusal,
and background preparation of only what a refresh changed."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from ebmrag.config import Settings
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore, SQLiteStore
from tests.ehr.conftest import fhir, fhir_server  # noqa: F401 (the test FHIR server's fixtures)
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import chart, fragments_of, load_one, register
from tests.serve.conftest import serving

NZ = "ips_nz_peter_jordan_labs_document.json"
EPIC = "ips_us_epic_document.json"


def _table(connection: EhrConnection) -> dict[str, Any]:
    return {"tenant": connection.tenant, "fhir_base": connection.fhir_base, "client_id": connection.client_id,
            "private_key_file": connection.private_key_file, "algorithm": connection.algorithm,
            "allow_http": connection.allow_http}


def _settings(*connections: EhrConnection, prepare: bool = False, **ehr: Any) -> Settings:
    settings = Settings()
    return replace(settings, serve=replace(settings.serve, prepare_charts=prepare, rate_per_second=1000,
                                           rate_burst=1000),
                   ehr=EhrParams(connections={c.name: _table(c) for c in connections}, since_skew_seconds=0.0,
                                 max_backoff_seconds=0.2, **ehr))


@contextmanager
def _service(store: PatientStore, settings: Settings, resources: Any = None) -> Iterator[tuple[str, Any]]:
    with serving(create_app(store, settings, resources=resources)) as (url, app):
        yield url, app.state.service


def _client(url: str, store: PatientStore, tenant: str, role: str, *patients: str) -> httpx.Client:
    key = create_key(store, tenant, role, patients)[0]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _problem(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"].endswith("/" + kind), body
    return str(body["detail"])


def test_a_pull_is_stored_audited_and_refreshed(fhir: FhirServer, tmp_path: Path,  # noqa: F811
                                                store: PatientStore) -> None:
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital")
    with _service(store, _settings(hospital)) as (url, _), _client(url, store, "acme", "service") as feed:
        first = feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"})
        assert first.status_code == 200, first.text
        pulled = first.json()
        assert pulled["fragments"] == pulled["added"] == fragments_of(NZ) and not pulled["incremental"]
        listed = feed.get(f"/v1/patients/{patient}/fragments").json()["fragments"]
        again = feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}).json()
        assert again["incremental"] and again["resources_fetched"] == 0 and again["unchanged"] == fragments_of(NZ)
        full = feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital", "full": True}).json()
        assert not full["incremental"] and full["resources_fetched"] == 108 and full["changed"] == 0
    assert len(listed) == fragments_of(NZ)
    pulls = [row for row in store.audit_rows() if row[5] == "pull"]
    assert len(pulls) == 3 and {row[4] for row in pulls} == {patient}
    assert json.loads(pulls[0][7]) == ["source:hospital", f"fhir:{patient}", *(f["id"] for f in listed)], \
        "where it came from and the fragment ids it stored, no text"


def test_a_connection_serves_its_own_tenant_only(fhir: FhirServer, tmp_path: Path) -> None:  # noqa: F811
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital", tenant="acme")
    clinic = register(fhir, tmp_path, name="clinic", tenant="other")
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital, clinic)) as (url, _), \
            _client(url, store, "other", "service") as other, _client(url, store, "acme", "service") as acme:
        detail = _problem(other.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}), 404,
                          "no-such-connection")
        assert detail == "no EHR connection 'hospital' for this key's tenant"
        _problem(other.post("/v1/ehr/hospital/export", json={"group": "g"}), 404, "no-such-connection")
        assert other.post(f"/v1/patients/{patient}/pull", json={"connection": "clinic"}).status_code == 200
        assert acme.get(f"/v1/patients/{patient}/fragments").status_code == 404, "stored for tenant other only"
    assert store.record("acme", patient) is None and store.record("other", patient) is not None


def test_who_may_pull_and_what_a_body_may_carry(fhir: FhirServer, tmp_path: Path) -> None:  # noqa: F811
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital)) as (url, _):
        with _client(url, store, "acme", "clinician") as clinician:
            _problem(clinician.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}), 403,
                     "forbidden")
        with _client(url, store, "acme", "service", "someone-else") as limited:
            _problem(limited.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}), 404,
                     "not-found")
            detail = _problem(limited.post("/v1/ehr/hospital/export", json={"group": "g"}), 403, "forbidden")
            assert "limited to listed patients may not export a group" in detail
        with _client(url, store, "acme", "service") as feed:
            smuggled = {"connection": "hospital", "private_key_file": "/etc/shadow"}
            assert "private_key_file" in _problem(feed.post(f"/v1/patients/{patient}/pull", json=smuggled), 422,
                                                  "invalid-request")
    assert store.record("acme", patient) is None


def test_what_the_ehr_refuses_is_a_502_naming_its_status(fhir: FhirServer, tmp_path: Path) -> None:  # noqa: F811
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital")
    nowhere = replace(register(fhir, tmp_path, name="nowhere"), fhir_base="http://127.0.0.1:9/fhir")
    broken = replace(register(fhir, tmp_path, name="broken"), private_key_file=str(tmp_path / "missing.pem"))
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital, nowhere, broken, error_retries=0)) as (url, _), \
            _client(url, store, "acme", "service") as feed:
        detail = _problem(feed.post("/v1/patients/nobody/pull", json={"connection": "hospital"}), 502, "ehr-refused")
        assert detail == "Patient $everything: the FHIR server refused (404 Not Found; issue not-found)"
        fhir.faults(fail_page={"n": 1, "status": 500})
        detail = _problem(feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}), 502,
                          "ehr-refused")
        assert "(500 Internal Server Error; issue exception)" in detail
        detail = _problem(feed.post(f"/v1/patients/{patient}/pull", json={"connection": "nowhere"}), 502,
                          "ehr-unreachable")
        assert detail == "read CapabilityStatement: the FHIR server could not be reached (ConnectError)"
        detail = _problem(feed.post(f"/v1/patients/{patient}/pull", json={"connection": "broken"}), 503,
                          "ehr-misconfigured")
        assert "missing.pem" not in detail
    assert store.record("acme", patient) is None


def test_a_group_export_over_http(fhir: FhirServer, tmp_path: Path) -> None:  # noqa: F811
    patients = [load_one(fhir, NZ), load_one(fhir, EPIC)]
    fhir.load([{"resourceType": "Group", "id": "ward", "type": "person", "actual": True,
                "member": [{"entity": {"reference": f"Patient/{p}"}} for p in patients]}])
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital)) as (url, _), _client(url, store, "acme", "service") as feed:
        report = feed.post("/v1/ehr/hospital/export", json={"group": "ward"})
        assert report.status_code == 200, report.text
        assert sorted(p["patient"] for p in report.json()["patients"]) == sorted(patients)
        for patient in patients:
            assert feed.get(f"/v1/patients/{patient}/fragments").status_code == 200
    assert sorted(row[4] for row in store.audit_rows() if row[5] == "pull") == sorted(patients)


@pytest.mark.model
def test_a_refresh_prepares_only_what_changed(fhir: FhirServer, tmp_path: Path, resources: Any) -> None:  # noqa: F811
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital, prepare=True), resources) as (url, service), \
            _client(url, store, "acme", "service") as feed:
        assert feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}).status_code == 200
        assert service.preparer.wait_idle(60)
        record = store.record("acme", patient)
        assert service.prepared(record) == len(record.fragments) == fragments_of(NZ)
        done = service.preparer.counts["fragments"]
        value = round(5.5 + random.random(), 3)  # a value no earlier run has prepared (the caches are on disk)
        bundle = json.loads(chart(NZ).read_text(encoding="utf-8"))
        potassium = next(e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Observation"
                         and e["resource"]["code"]["coding"][0].get("code") == "2823-3")
        fhir.load([{**potassium, "valueQuantity": {**potassium["valueQuantity"], "value": value}}])
        refresh = feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}).json()
        assert refresh["resources_fetched"] == 1 and refresh["changed"] == 2 and refresh["added"] == 0
        assert service.preparer.wait_idle(60)
        record = store.record("acme", patient)
        assert service.prepared(record) == fragments_of(NZ)
        assert service.preparer.counts["fragments"] - done == 2, "the two fragments that show the new value"
        assert sum(f"{value:.4g} mmol/L" in f.text for f in record.fragments) == 2


def test_a_key_limited_to_a_patient_pulls_that_patients_own_chart_only(fhir: FhirServer,  # noqa: F811
                                                                       tmp_path: Path) -> None:
    nz, epic = load_one(fhir, NZ), load_one(fhir, EPIC)
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital)) as (url, _):
        with _client(url, store, "acme", "service", nz) as limited:
            mark = len(fhir.requests())
            detail = _problem(limited.post(f"/v1/patients/{nz}/pull",
                                           json={"connection": "hospital", "fhir_patient": epic}), 403, "forbidden")
            assert detail == ("a key limited to listed patients pulls a patient's own chart only: fhir_patient must "
                              "be absent or the patient id (another id could be anyone on the server)")
            assert fhir.requests()[mark:] == [] and store.record("acme", nz) is None
            own = limited.post(f"/v1/patients/{nz}/pull", json={"connection": "hospital", "fhir_patient": nz})
            assert own.status_code == 200, own.text
        with _client(url, store, "acme", "service") as feed:  # a tenant-wide key maps ids as the tenant does
            mapped = feed.post("/v1/patients/alice/pull", json={"connection": "hospital", "fhir_patient": epic})
            assert mapped.status_code == 200, mapped.text
    audited = {row[4]: json.loads(row[7]) for row in store.audit_rows() if row[5] == "pull"}
    assert audited["alice"][:2] == ["source:hospital", f"fhir:{epic}"]
    assert audited[nz][:2] == ["source:hospital", f"fhir:{nz}"]


def test_a_second_source_is_a_409_until_replace(fhir: FhirServer, tmp_path: Path) -> None:  # noqa: F811
    nz, epic = load_one(fhir, NZ), load_one(fhir, EPIC)
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    with _service(store, _settings(hospital)) as (url, _), _client(url, store, "acme", "service") as feed:
        first = feed.post("/v1/patients/alice/pull", json={"connection": "hospital", "fhir_patient": nz})
        assert first.status_code == 200, first.text
        held = store.record("acme", "alice")
        detail = _problem(feed.post("/v1/patients/alice/pull", json={"connection": "hospital", "fhir_patient": epic}),
                          409, "chart-source-conflict")
        assert "already holds a chart pulled from another source" in detail and epic not in detail
        assert store.record("acme", "alice") == held
        replaced = feed.post("/v1/patients/alice/pull",
                             json={"connection": "hospital", "fhir_patient": epic, "replace": True})
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["removed"] == first.json()["fragments"]
    record = store.record("acme", "alice")
    assert record is not None and len(record.fragments) == replaced.json()["fragments"] == replaced.json()["added"]
    assert store.pulled_sources("acme", "alice") == [f"{hospital.base}/Patient/{epic}"]


@pytest.mark.parametrize(("fault", "detail"), [
    ({"bad_gzip": True}, "Patient $everything: the FHIR server's answer could not be read: the gzip body does not "
                         "decode (Error -3 while decompressing data: incorrect header check)"),
    ({"next_link": "http://[::1"}, "Patient $everything: the FHIR server's next link is not a valid URL; it is not "
                                   "followed"),
])
def test_an_answer_that_cannot_be_read_is_a_502(fhir: FhirServer, tmp_path: Path, fault: dict[str, Any],  # noqa: F811
                                                detail: str) -> None:
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    fhir.faults(**fault)
    with _service(store, _settings(hospital, page_size=20)) as (url, _), \
            _client(url, store, "acme", "service") as feed:
        assert _problem(feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}), 502,
                        "ehr-refused") == detail
    assert store.record("acme", patient) is None


def test_a_dripping_server_is_stopped_at_the_request_deadline(fhir: FhirServer, tmp_path: Path) -> None:  # noqa: F811
    patient = load_one(fhir, NZ)
    hospital = register(fhir, tmp_path, name="hospital")
    store = SQLiteStore(tmp_path / "s.sqlite")
    fhir.faults(drip_ms=20)
    settings = _settings(hospital)  # [ehr] pull_seconds is 300 s: the service's deadline is what stops it
    settings = replace(settings, serve=replace(settings.serve, request_seconds=1.0))
    with _service(store, settings) as (url, _), _client(url, store, "acme", "service") as feed:
        started = time.monotonic()
        _problem(feed.post(f"/v1/patients/{patient}/pull", json={"connection": "hospital"}), 504, "timeout")
        assert time.monotonic() - started < 5 * settings.serve.request_seconds, \
            "the worker stopped between two chunks, not at the answer's end (minutes of dripping away)"
    assert store.record("acme", patient) is None


class _FailingStore(SQLiteStore):
    """A real store whose chart read fails in a way no handler expects (an internal error, a 500)."""

    def record(self, tenant: str, patient: str) -> Any:
        raise RuntimeError("an internal failure")


def test_the_last_resort_500_logs_the_route_not_the_patient_id(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    store = _FailingStore(tmp_path / "s.sqlite")
    with _service(store, _settings()) as (url, _), _client(url, store, "acme", "clinician") as clinician, \
            caplog.at_level(logging.ERROR, logger="ebmrag.serve.app"):
        _problem(clinician.get("/v1/patients/patient-8f2c1d/fragments"), 500, "internal")
    logged = [r.getMessage() for r in caplog.records if "unhandled error" in r.getMessage()]
    assert logged == ["unhandled error on /v1/patients/{pid}/fragments (RuntimeError)"]
    assert not any("patient-8f2c1d" in r.getMessage() for r in caplog.records)
