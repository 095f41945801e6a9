"""A hostile EHR (tests/ehr/hostile_server.py) never makes a pull store a wrong absence, hold a worker, blow up memory
or read a credential back (issue 43): through the library, and through `POST /v1/patients/{pid}/pull` on SQLite and
PostgreSQL.

Every variant comes to one of three outcomes, pinned per variant (`EXPECTED`): the pull fails (an EhrError, a 502
problem of one line, nothing stored), the chart is stored with the allergies marked "not known", or (an honest
answer) the penicillin allergy is stored. What a refusal relays never holds the server's free text nor a token."""

from __future__ import annotations

import logging
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ebmrag.ehr.bulk import export_group
from ebmrag.ehr.chart import WATCHED_TYPES
from ebmrag.ehr.fhir import EhrError
from ebmrag.ehr.keys import generate, write_private_key
from ebmrag.ehr.params import EhrConnection
from ebmrag.ehr.pull import pull_patient
from ebmrag.store.patients import PatientStore, SQLiteStore
from tests.ehr.helpers import TENANT, any_store, quick  # noqa: F401 (any_store: a fixture)
from tests.ehr.hostile_server import (
    BULK_VARIANTS,
    DIAGNOSTICS,
    PATIENT,
    PULL_VARIANTS,
    SECOND,
    SMART_VARIANTS,
    HostileFhir,
)
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
            "bulk-403": MARKED, "bulk-truncated": MARKED, "bulk-nul": MARKED, "bulk-error-entry": MARKED,
            "next-cut-chunked": FAIL, "bulk-cut": FAIL, "bulk-gzip-cut": FAIL,
            "unauthorized-echo": FAIL, "narrow-scope": MARKED, "bulk-narrow-scope": MARKED}
PARAMS = quick(timeout_seconds=1.0, pull_seconds=4.0, max_response_mb=8.0, error_retries=0, retries=0)


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileFhir]:
    with HostileFhir() as server:
        yield server


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The private key a SMART connection signs its assertions with (the hostile server takes any)."""
    path = tmp_path_factory.mktemp("keys") / "hostile.pem"
    write_private_key(generate("ES384"), path)
    return path


def _connection(server: HostileFhir, key: Path) -> EhrConnection:
    """Open, or SMART where the variant needs a token (a fresh client id: no token cached from another test)."""
    if server.variant not in SMART_VARIANTS:
        return EhrConnection("hostile", TENANT, server.base, allow_http=True)
    return EhrConnection("hostile", TENANT, server.base, f"ebmrag-{uuid.uuid4().hex[:8]}", str(key), allow_http=True)


def _relayed_only_codes(message: str, server: HostileFhir) -> None:
    """An error line as an operator or a caller reads it: one line, none of the server's free text, no token."""
    assert "\n" not in message
    assert DIAGNOSTICS not in message, message
    assert not [t for t in server.tokens if t in message], message


def _outcome(store: PatientStore, patient: str = PATIENT) -> str:
    """What the store holds of the patient: FAIL (nothing at all), MARKED, "penicillin", or the wrong absence."""
    record = store.record(TENANT, patient)
    if record is None:
        assert not store.pulled_sources(TENANT, patient), "no chart, yet resources or a sync point were kept"
        return FAIL
    line = next(f.text for f in record.fragments if f.id == "summary/allergies")
    if NONE_RECORDED in line:
        return f"WRONG ABSENCE: {line}"
    if line.startswith("Allergy status: not known.") or "Not read from the FHIR server" in line:
        return MARKED
    return "penicillin" if "penicillin" in line else line


def _second_patient_line(store: PatientStore) -> str:
    record = store.record(TENANT, SECOND)
    assert record is not None, "the export's second patient was not stored"
    return next(f.text for f in record.fragments if f.id == "summary/allergies")


def test_every_variant_is_known() -> None:
    assert set(EXPECTED) == {*PULL_VARIANTS, *BULK_VARIANTS, *SMART_VARIANTS}


def test_the_honest_server_is_read_whole(hostile: HostileFhir, key_file: Path, tmp_path: Path) -> None:
    """The control: what every other variant spoils is read when nothing is spoiled."""
    hostile.variant = "honest"
    store = SQLiteStore(tmp_path / "s.sqlite")
    pull_patient(store, _connection(hostile, key_file), PATIENT, params=PARAMS)
    record = store.record(TENANT, PATIENT)
    assert record is not None
    line = next(f.text for f in record.fragments if f.id == "summary/allergies")
    assert "penicillin" in line and "not known" not in line and not record.skipped, (line, record.skipped)


PULLED = [v for v in (*PULL_VARIANTS, *SMART_VARIANTS) if not v.startswith("bulk")]
EXPORTED = [v for v in (*BULK_VARIANTS, *SMART_VARIANTS) if v.startswith("bulk")]


@pytest.mark.parametrize("variant", PULLED)
def test_a_pull_from_a_hostile_ehr_fails_or_marks_never_stores_an_absence(variant: str, hostile: HostileFhir,
                                                                          key_file: Path, tmp_path: Path) -> None:
    hostile.variant = variant
    store = SQLiteStore(tmp_path / "s.sqlite")
    started = time.monotonic()
    failed = False
    try:
        pull_patient(store, _connection(hostile, key_file), PATIENT, params=PARAMS)
    except EhrError as exc:
        failed = True
        _relayed_only_codes(str(exc), hostile)
    assert _outcome(store) == EXPECTED[variant]
    assert failed is (EXPECTED[variant] == FAIL), "a pull that stores nothing says so"
    assert time.monotonic() - started < 4 * PARAMS.timeout_seconds + PARAMS.pull_seconds, "bounded in time"


@pytest.mark.parametrize("variant", EXPORTED)
def test_a_bulk_file_that_cannot_be_read_marks_its_kind_in_every_chart(variant: str, hostile: HostileFhir,
                                                                       key_file: Path, tmp_path: Path) -> None:
    hostile.variant = variant
    store = SQLiteStore(tmp_path / "s.sqlite")
    if EXPECTED[variant] == FAIL:  # no whole answer at all: the export fails, nothing stored for anyone
        with pytest.raises(EhrError) as caught:
            export_group(store, _connection(hostile, key_file), "g1", params=PARAMS, sleep=lambda _: None)
        _relayed_only_codes(str(caught.value), hostile)
        assert _outcome(store) == _outcome(store, SECOND) == FAIL
        return
    report = export_group(store, _connection(hostile, key_file), "g1", params=PARAMS, sleep=lambda _: None)
    assert sorted(p.patient for p in report.patients) == [PATIENT, SECOND], "the export still stores its patients"
    assert _outcome(store) == EXPECTED[variant]
    second = _second_patient_line(store)
    if EXPECTED[variant] == MARKED:  # the lost file was every patient's: none of them has a known "none"
        assert second.startswith("Allergy status: not known."), second
    else:  # an honest export: the second patient truly has none, and says so (the marking is not blanket)
        assert NONE_RECORDED in second, second


def test_an_export_with_error_files_marks_every_watched_kind_in_every_chart(hostile: HostileFhir, key_file: Path,
                                                                           tmp_path: Path) -> None:
    hostile.variant = "bulk-error-entry"
    store = SQLiteStore(tmp_path / "s.sqlite")
    export_group(store, _connection(hostile, key_file), "g1", params=PARAMS, sleep=lambda _: None)
    for patient in (PATIENT, SECOND):
        record = store.record(TENANT, patient)
        assert record is not None
        for kind in WATCHED_TYPES:
            assert any(s.startswith(f"{kind}: not read from the FHIR server (may be incomplete") for s in
                       record.skipped), (patient, kind, record.skipped)
        lines = {f.id: f.text for f in record.fragments}
        assert "may be incomplete" in lines["summary/active-problems"], lines["summary/active-problems"]


def test_an_export_that_did_not_ask_for_allergies_marks_them(hostile: HostileFhir, key_file: Path,
                                                            tmp_path: Path) -> None:
    hostile.variant = "bulk-honest"
    store = SQLiteStore(tmp_path / "s.sqlite")
    export_group(store, _connection(hostile, key_file), "g1", params=PARAMS,
                 types=("Patient", "Condition", "Observation"), sleep=lambda _: None)
    assert _outcome(store) == MARKED


def test_a_decompression_bomb_stops_at_the_limit_without_growing(hostile: HostileFhir, key_file: Path,
                                                                  tmp_path: Path) -> None:
    """1 GiB of zeros in ~1 MB of gzip: refused once 8 MB are inflated, having held about that much."""
    hostile.variant = "bomb"
    tracemalloc.start()
    try:
        with pytest.raises(EhrError, match=r"larger than 8 MB \(\[ehr\] max_response_mb\)"):
            pull_patient(SQLiteStore(tmp_path / "s.sqlite"), _connection(hostile, key_file), PATIENT,
                         params=quick(max_response_mb=8.0, timeout_seconds=30.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 8 * 2**20, f"peak {peak / 2**20:.1f} MiB for an 8 MB limit"


def test_headers_dripped_a_byte_at_a_time_end_at_the_timeout(hostile: HostileFhir, key_file: Path,
                                                             tmp_path: Path) -> None:
    """A byte every 0.5 s: the head would take 40 minutes; each try ends at timeout_seconds."""
    hostile.variant = "drip-headers"
    params = quick(timeout_seconds=1.0, error_retries=1, max_backoff_seconds=0.1)
    started = time.monotonic()
    with pytest.raises(EhrError, match=r"no complete answer within 1 s \(\[ehr\] timeout_seconds\)"):
        pull_patient(SQLiteStore(tmp_path / "s.sqlite"), _connection(hostile, key_file), PATIENT, params=params)
    assert time.monotonic() - started < 4 * params.timeout_seconds * (1 + params.error_retries)


def test_a_servers_echo_of_the_bearer_token_is_never_relayed(hostile: HostileFhir, key_file: Path, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """An EHR whose 401 repeats the request's Authorization header (diagnostics, details, WWW-Authenticate): the
    error names the status and the issue code only, and the log holds no token either."""
    hostile.variant = "unauthorized-echo"
    hostile.tokens.clear()
    caplog.set_level(logging.INFO)  # what a service logs (httpcore's DEBUG trace prints every response header)
    with pytest.raises(EhrError) as caught:
        pull_patient(SQLiteStore(tmp_path / "s.sqlite"), _connection(hostile, key_file), PATIENT, params=PARAMS)
    assert len(hostile.tokens) == 2, "a token, then one fresh token after the first 401"
    _relayed_only_codes(f"{caught.value} {caught.value.args!r}", hostile)
    assert str(caught.value) == "Patient $everything: the FHIR server refused (401 Unauthorized; issue login)"
    assert not [t for t in hostile.tokens if t in caplog.text]


def test_an_id_of_dots_never_reaches_the_server(hostile: HostileFhir, key_file: Path, tmp_path: Path) -> None:
    """`Patient/..` is the base itself: its search would be every patient's."""
    hostile.variant = "honest"
    before = len(hostile.requests)
    for dots in (".", ".."):
        with pytest.raises(ValueError, match="FHIR patient id"):
            pull_patient(SQLiteStore(tmp_path / "s.sqlite"), _connection(hostile, key_file), PATIENT, params=PARAMS,
                         fhir_patient=dots)
    assert hostile.requests[before:] == []


SERVED = ["honest", "redirect-body", "redirect-empty", "no-content", "accepted", "html", "next-500", "next-truncated",
          "next-cut", "next-cut-chunked", "short-total", "error-entry", "nul", "bomb", "search-without-allergy-search",
          "unauthorized-echo", "narrow-scope"]


def _served(hostile: HostileFhir, key_file: Path, store: PatientStore, path: str, body: dict[str, object]
            ) -> httpx.Response:
    """`body` posted to the service's `path`, the service on `store` with one connection to the hostile server."""
    settings = _settings(_connection(hostile, key_file), timeout_seconds=1.0, pull_seconds=4.0, max_response_mb=8.0,
                         error_retries=0, retries=0)
    with _service(store, settings) as (url, _), _client(url, store, TENANT, "service") as feed:
        return feed.post(path, json=body)


def _failed_as_a_problem(answer: httpx.Response, hostile: HostileFhir) -> None:
    assert answer.status_code == 502, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.headers
    assert answer.json()["type"].endswith(("/ehr-refused", "/ehr-unreachable")), answer.text
    _relayed_only_codes(answer.json()["detail"], hostile)
    _relayed_only_codes(answer.text, hostile)


@pytest.mark.parametrize("variant", SERVED)
def test_the_service_answers_a_hostile_ehr_with_a_502_or_a_marked_chart(variant: str, hostile: HostileFhir,
                                                                        key_file: Path,
                                                                        any_store: PatientStore) -> None:  # noqa: F811
    hostile.variant = variant
    answer = _served(hostile, key_file, any_store, f"/v1/patients/{PATIENT}/pull", {"connection": "hostile"})
    if EXPECTED[variant] == FAIL:
        _failed_as_a_problem(answer, hostile)
    else:
        assert answer.status_code == 200, answer.text
    assert _outcome(any_store) == EXPECTED[variant]


@pytest.mark.parametrize("variant", ["bulk-redirect", "bulk-html", "bulk-error-entry", "bulk-gzip-cut"])
def test_the_service_exports_from_a_hostile_ehr_with_marked_charts_or_a_502(variant: str, hostile: HostileFhir,
                                                                            key_file: Path,
                                                                            any_store: PatientStore) -> None:  # noqa: F811
    hostile.variant = variant
    answer = _served(hostile, key_file, any_store, "/v1/ehr/hostile/export", {"group": "g1"})
    if EXPECTED[variant] == FAIL:
        _failed_as_a_problem(answer, hostile)
        assert _outcome(any_store, SECOND) == FAIL
    else:
        assert answer.status_code == 200, answer.text
        assert _second_patient_line(any_store).startswith("Allergy status: not known.")
    assert _outcome(any_store) == EXPECTED[variant]


@pytest.mark.parametrize("dots", [".", ".."])
def test_the_service_refuses_an_id_of_dots_before_asking_the_server(dots: str, hostile: HostileFhir, key_file: Path,
                                                                     any_store: PatientStore) -> None:  # noqa: F811
    hostile.variant = "honest"
    before = len(hostile.requests)
    answer = _served(hostile, key_file, any_store, f"/v1/patients/{PATIENT}/pull",
                     {"connection": "hostile", "fhir_patient": dots})
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.headers
    assert hostile.requests[before:] == [] and _outcome(any_store) == FAIL
