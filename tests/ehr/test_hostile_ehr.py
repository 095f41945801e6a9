"""A hostile EHR (tests/ehr/hostile_server.py) never makes a pull store a wrong absence, hold a worker, blow up memory
or read a credential back (issue 43): through the library, and through `POST /v1/patients/{pid}/pull` on SQLite and
PostgreSQL."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebmrag.ehr.bulk import export_group
from ebmrag.ehr.fhir import EhrError, FhirClient
from ebmrag.ehr.params import EhrConnection
from ebmrag.ehr.pull import pull_patient
from ebmrag.store.patients import PatientStore, SQLiteStore
from tests.ehr.helpers import QUICK, TENANT, any_store, quick  # noqa: F401 (any_store: a fixture)
from tests.ehr.hostile_server import BULK_VARIANTS, PATIENT, PULL_VARIANTS, HostileFhir
from tests.serve.test_ehr_routes import _client, _service, _settings

NONE_RECORDED = "no allergy or allergy statement is recorded"
FAIL = "fail"  # the pull fails, nothing stored
MARKED = "marked"  # stored, the allergy line "not known" (or marked "Not read")
# what each variant must come to (either is no wrong absence; this pins which)
EXPECTED = {"honest": "penicillin", "redirect-body": FAIL, "redirect-empty": FAIL, "no-content": FAIL,
            "accepted": FAIL, "html": FAIL, "next-500": FAIL, "next-truncated": FAIL, "next-cut": FAIL,
            "short-total": FAIL, "error-entry": FAIL, "nul": MARKED, "bomb": FAIL, "bomb-stacked": FAIL, "br": FAIL,
            "drip-headers": FAIL, "drip-body": FAIL, "search-without-allergy-search": MARKED,
            "allergy-without-id": MARKED, "bulk-gzip-members": "penicillin", "bulk-identifier-only": MARKED,
            "bulk-honest": "penicillin", "bulk-redirect": MARKED, "bulk-204": MARKED, "bulk-html": MARKED,
            "bulk-403": MARKED, "bulk-truncated": MARKED, "bulk-nul": MARKED, "bulk-error-entry": MARKED}
PARAMS = quick(timeout_seconds=1.0, pull_seconds=4.0, max_response_mb=8.0, error_retries=0, retries=0)


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileFhir]:
    with HostileFhir() as server:
        yield server


def _connection(server: HostileFhir) -> EhrConnection:
    return EhrConnection("hostile", TENANT, server.base, allow_http=True)


def _outcome(store: PatientStore) -> str:
    """What the store holds of the patient: FAIL (nothing), MARKED, "penicillin", or the wrong absence itself."""
    record = store.record(TENANT, PATIENT)
    if record is None:
        return FAIL
    line = next(f.text for f in record.fragments if f.id == "summary/allergies")
    if NONE_RECORDED in line:
        return f"WRONG ABSENCE: {line}"
    if line.startswith("Allergy status: not known.") or "Not read from the FHIR server" in line:
        return MARKED
    return "penicillin" if "penicillin" in line else line


def test_every_variant_is_known() -> None:
    assert set(EXPECTED) == {*PULL_VARIANTS, *BULK_VARIANTS}


@pytest.mark.parametrize("variant", PULL_VARIANTS)
def test_a_pull_from_a_hostile_ehr_fails_or_marks_never_stores_an_absence(variant: str, hostile: HostileFhir,
                                                                          tmp_path: Path) -> None:
    hostile.variant = variant
    store = SQLiteStore(tmp_path / "s.sqlite")
    started = time.monotonic()
    try:
        pull_patient(store, _connection(hostile), PATIENT, params=PARAMS)
    except EhrError as exc:
        assert "\n" not in str(exc)
    assert _outcome(store) == EXPECTED[variant]
    assert time.monotonic() - started < 4 * PARAMS.timeout_seconds + PARAMS.pull_seconds, "bounded in time"


@pytest.mark.parametrize("variant", BULK_VARIANTS)
def test_a_bulk_file_that_cannot_be_read_marks_its_kind_in_every_chart(variant: str, hostile: HostileFhir,
                                                                       tmp_path: Path) -> None:
    hostile.variant = variant
    store = SQLiteStore(tmp_path / "s.sqlite")
    report = export_group(store, _connection(hostile), "g1", params=PARAMS, sleep=lambda _: None)
    assert [p.patient for p in report.patients] == [PATIENT], "the export still stores its patients"
    assert _outcome(store) == EXPECTED[variant]


def test_an_export_that_did_not_ask_for_allergies_marks_them(hostile: HostileFhir, tmp_path: Path) -> None:
    hostile.variant = "bulk-honest"
    store = SQLiteStore(tmp_path / "s.sqlite")
    export_group(store, _connection(hostile), "g1", params=PARAMS, types=("Patient", "Condition", "Observation"),
                 sleep=lambda _: None)
    assert _outcome(store) == MARKED


def test_a_decompression_bomb_stops_at_the_limit_without_growing(hostile: HostileFhir, tmp_path: Path) -> None:
    """1 GiB of zeros in ~1 MB of gzip: refused once 8 MB are inflated, having held about that much."""
    hostile.variant = "bomb"
    tracemalloc.start()
    try:
        with pytest.raises(EhrError, match=r"larger than 8 MB \(\[ehr\] max_response_mb\)"):
            pull_patient(SQLiteStore(tmp_path / "s.sqlite"), _connection(hostile), PATIENT,
                         params=quick(max_response_mb=8.0, timeout_seconds=30.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 8 * 2**20, f"peak {peak / 2**20:.1f} MiB for an 8 MB limit"


def test_headers_dripped_a_byte_at_a_time_end_at_the_timeout(hostile: HostileFhir, tmp_path: Path) -> None:
    hostile.variant = "drip-headers"
    started = time.monotonic()
    with pytest.raises(EhrError, match=r"no complete answer within 1 s \(\[ehr\] timeout_seconds\)"):
        pull_patient(SQLiteStore(tmp_path / "s.sqlite"), _connection(hostile), PATIENT,
                     params=quick(timeout_seconds=1.0, error_retries=1, max_backoff_seconds=0.1))
    assert time.monotonic() - started < 4.0, "two tries of a second each, not the 30 minutes the drip would take"


def test_a_servers_echo_of_the_bearer_token_is_never_relayed() -> None:
    """An EHR whose 401 diagnostics repeat the Authorization header: the error names the status and code only."""

    class Token:
        def token(self) -> str:
            return "sekrit-system-token-4711"

        def refresh(self) -> str:
            return self.token()

    from tests.ehr.helpers import Bystander
    echo = (b'{"resourceType": "OperationOutcome", "issue": [{"severity": "error", "code": "login", '
            b'"diagnostics": "token Bearer sekrit-system-token-4711 is not valid"}]}')
    with Bystander(401, echo) as server:
        client = FhirClient(f"{server.origin}/fhir", quick(error_retries=0), auth=Token())
        with pytest.raises(EhrError) as caught:
            client.read("Patient/p1", operation="read Patient")
        client.close()
    assert "sekrit" not in str(caught.value)
    assert str(caught.value) == "read Patient: the FHIR server refused (401 Unauthorized; issue login)"


@pytest.mark.parametrize("variant", ["redirect-body", "no-content", "html", "next-cut", "nul", "bomb",
                                     "search-without-allergy-search"])
def test_the_service_answers_a_hostile_ehr_with_a_502_or_a_marked_chart(variant: str, hostile: HostileFhir,
                                                                        any_store: PatientStore) -> None:  # noqa: F811
    hostile.variant = variant
    connection = _connection(hostile)
    settings = _settings(connection, timeout_seconds=1.0, pull_seconds=4.0, max_response_mb=8.0, error_retries=0,
                         retries=0)
    with _service(any_store, settings) as (url, _), _client(url, any_store, TENANT, "service") as feed:
        answer = feed.post(f"/v1/patients/{PATIENT}/pull", json={"connection": "hostile"})
    if EXPECTED[variant] == FAIL:
        assert answer.status_code == 502, answer.text
        assert answer.json()["type"].endswith(("/ehr-refused", "/ehr-unreachable")), answer.text
    else:
        assert answer.status_code == 200, answer.text
    assert _outcome(any_store) == EXPECTED[variant]
