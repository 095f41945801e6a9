"""CDS Hooks 2.0 over HTTP (serve.cds_routes, serve.cds_auth): a real `ebmrag serve` on uvicorn, real signed JWTs
(ES384, RS384), the specification-shaped example requests, a real FHIR server for fetching a missing prefetch
(tests/fhir_server), and the audit log read back from the store."""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ebmrag.cds.params import CdsParams
from ebmrag.config import Settings
from ebmrag.serve.app import create_app
from ebmrag.serve.cds_auth import RETRY_FAILED_AFTER, CdsAuthError, KeySets
from ebmrag.serve.throttle import FAILED_BURST
from ebmrag.store.patients import PatientStore, SQLiteStore
from tests.ehr.conftest import fhir, fhir_server  # noqa: F401 (the test FHIR server's fixtures)
from tests.ehr.fhir_server import FhirServer
from tests.serve.conftest import free_port, serving

EXAMPLES = Path(__file__).resolve().parents[1] / "cds" / "data"
ISS = "https://ehr.example.org/"


# ------------------------------------------------------------------------------------------------ the card schema
class Coding(BaseModel):
    model_config = ConfigDict(extra="forbid")
    system: str | None = None
    code: str = Field(min_length=1)
    display: str | None = None


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = Field(min_length=1)
    url: str | None = None
    icon: str | None = None
    topic: Coding | None = None


class CardModel(BaseModel):
    """CDS Hooks 2.0 "Card Attributes"."""

    model_config = ConfigDict(extra="forbid")
    uuid: str | None = None
    summary: str = Field(min_length=1, max_length=139)
    detail: str | None = None
    indicator: Literal["info", "warning", "critical"]
    source: Source
    suggestions: list[dict[str, Any]] | None = None
    selectionBehavior: Literal["at-most-one", "any"] | None = None  # noqa: N815 (the specification's name)
    overrideReasons: list[Coding] | None = None  # noqa: N815
    links: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def behaviour_with_suggestions(self) -> CardModel:
        assert self.suggestions is None or self.selectionBehavior is not None, "suggestions need selectionBehavior"
        return self


class HookResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cards: list[CardModel]
    systemActions: list[dict[str, Any]] | None = None  # noqa: N815


class ServiceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hook: str
    title: str | None = None
    description: str = Field(min_length=1)
    id: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    prefetch: dict[str, str] | None = None
    usageRequirements: str | None = None  # noqa: N815


class Discovery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    services: list[ServiceModel]


def no_nulls(value: Any) -> bool:
    """"Unless otherwise specified, JSON attributes SHALL NOT be null" (and optional arrays are left out)."""
    if isinstance(value, dict):
        return all(v is not None and v != [] and no_nulls(v) for v in value.values())
    return all(no_nulls(v) for v in value) if isinstance(value, list) else True


# ------------------------------------------------------------------------------------------------ the EHR side
@dataclass
class Signer:
    """A CDS client's key: signs the JWTs the specification asks for."""

    kid: str
    alg: str
    key: Any
    iss: str = ISS

    def jwk(self) -> dict[str, Any]:
        algorithm = ECAlgorithm if self.alg.startswith("ES") else RSAAlgorithm
        public = json.loads(algorithm.to_jwk(self.key.public_key()))
        return {**public, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def token(self, aud: str | list[str], *, header: dict[str, Any] | None = None, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.iss, "aud": aud, "iat": now, "exp": now + 120, "jti": str(uuid.uuid4()),
                   "tenant": "org-7"} | claims
        return jwt.encode({k: v for k, v in payload.items() if v is not None}, self.key, algorithm=self.alg,
                          headers={"kid": self.kid, "typ": "JWT", **(header or {})})


ES = Signer("ehr-es384", "ES384", ec.generate_private_key(ec.SECP384R1()))
RS = Signer("ehr-rs384", "RS384", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def example(hook: str) -> dict[str, Any]:
    return dict(json.loads((EXAMPLES / f"{hook}.json").read_text("utf-8")))


@dataclass
class Cds:
    url: str
    store: PatientStore

    def post(self, path: str, body: Any, token: str | None = "sign", signer: Signer = ES) -> httpx.Response:
        url = f"{self.url}{path}"
        headers = {} if token is None else {"Authorization": "Bearer " + (signer.token(url) if token == "sign"
                                                                          else token)}
        return httpx.post(url, json=body, headers=headers, timeout=30)

    def hook(self, service: str, body: Any, **kw: Any) -> httpx.Response:
        return self.post(f"/cds-services/{service}", body, **kw)


@contextmanager
def cds_service(tmp_path: Path, store: PatientStore | None = None, fhir_servers: tuple[str, ...] = (),
                trusted_proxies: tuple[str, ...] = (), **cds: Any) -> Iterator[Cds]:
    jwks = tmp_path / "ehr-jwks.json"
    jwks.write_text(json.dumps({"keys": [ES.jwk(), RS.jwk()]}))
    issuers = {"ehr-test": {"iss": ISS, "tenant": "clinic-a", "jwks_file": str(jwks),
                            "fhir_servers": list(fhir_servers)}}
    port = free_port()
    settings = Settings()
    serve = replace(settings.serve, prepare_charts=False, trusted_proxies=trusted_proxies)
    settings = replace(settings, serve=serve, cds=CdsParams(**{
        "enabled": True, "base_url": f"http://127.0.0.1:{port}", "issuers": issuers, **cds}))
    store = store or SQLiteStore(tmp_path / "store.sqlite")
    with serving(create_app(store, settings), port) as (url, _):
        yield Cds(url, store)


@pytest.fixture
def cds(tmp_path: Path) -> Iterator[Cds]:
    with cds_service(tmp_path) as running:
        yield running


def audited(store: PatientStore, action: str) -> list[tuple[Any, ...]]:
    return [row for row in store.audit_rows() if row[5] == action]


# ------------------------------------------------------------------------------------------------ discovery
def test_discovery_lists_the_three_hooks_with_their_prefetch(cds: Cds) -> None:
    answer = httpx.get(f"{cds.url}/cds-services")
    assert answer.status_code == 200 and no_nulls(answer.json())
    services = Discovery.model_validate(answer.json()).services
    assert {s.hook: s.id for s in services} == {"patient-view": "ebmrag-patient-view",
                                                "order-select": "ebmrag-order-select",
                                                "order-sign": "ebmrag-order-sign"}
    order_select = next(s for s in services if s.hook == "order-select")
    assert order_select.prefetch is not None
    assert order_select.prefetch["allergies"] == "AllergyIntolerance?patient={{context.patientId}}"


def test_the_service_is_off_unless_enabled(tmp_path: Path) -> None:
    with serving(create_app(SQLiteStore(tmp_path / "s.sqlite"))) as (url, _):
        assert httpx.get(f"{url}/cds-services").status_code == 404


# ------------------------------------------------------------------------------------------------ the examples
def test_order_select_of_amoxicillin_with_a_penicillin_anaphylaxis_is_critical_citing_it(cds: Cds) -> None:
    answer = cds.hook("ebmrag-order-select", example("order-select"))
    assert answer.status_code == 200, answer.text
    assert no_nulls(answer.json())
    cards = HookResponse.model_validate(answer.json()).cards
    allergy = [c for c in cards if c.source.topic and c.source.topic.code == "allergy"]
    assert len(allergy) == 1 and allergy[0].indicator == "critical"  # anaphylaxis: issue 47
    assert allergy[0].summary.startswith("Allergy: penicillin class — Anaphylaxis")
    assert allergy[0].detail is not None and "AllergyIntolerance/pcn-anaphylaxis" in allergy[0].detail
    row, = audited(cds.store, "cds:order-select")
    assert row[2:5] == ("cds:ehr-test", "clinic-a", "4471")
    assert "AllergyIntolerance/pcn-anaphylaxis" in json.loads(row[7])
    assert f"card:{allergy[0].uuid}" in json.loads(row[7])


def test_order_sign_on_a_chart_without_allergies_gives_no_allergy_card(cds: Cds) -> None:
    answer = cds.hook("ebmrag-order-sign", example("order-sign"))
    cards = HookResponse.model_validate(answer.json()).cards
    topics = [c.source.topic.code for c in cards if c.source.topic]
    assert topics == ["renal"]  # metformin, the low eGFR and high creatinine cited; no allergy card
    assert cards[0].indicator == "warning" and "eGFR 31" in cards[0].summary


def test_patient_view_shows_a_critical_result_of_the_last_hours(cds: Cds) -> None:
    body = example("patient-view")
    three_hours_ago = (datetime.now(UTC) - timedelta(hours=3)).isoformat()
    body["prefetch"]["observations"]["entry"][0]["resource"]["effectiveDateTime"] = three_hours_ago
    cards = HookResponse.model_validate(cds.hook("ebmrag-patient-view", body).json()).cards
    assert [(c.indicator, c.summary[:36]) for c in cards] == [("critical", "Critical result in the last 24 h: Po")]
    old = example("patient-view")  # the example's own dates are years ago: nothing critical now
    assert cds.hook("ebmrag-patient-view", old).json() == {"cards": []}


# ------------------------------------------------------------------------------------------------ the JWT
def test_es384_and_rs384_tokens_are_accepted(cds: Cds) -> None:
    for signer in (ES, RS):
        assert cds.hook("ebmrag-order-sign", example("order-sign"), signer=signer).status_code == 200


def refused(answer: httpx.Response, why: str) -> bool:
    body = answer.json()
    return (answer.status_code == 401 and answer.headers["content-type"] == "application/problem+json"
            and answer.headers.get("www-authenticate") == "Bearer" and why in body["detail"])


def test_bad_tokens_are_refused(cds: Cds) -> None:
    url = f"{cds.url}/cds-services/ebmrag-order-sign"
    body = example("order-sign")
    wrong_key = Signer("ehr-es384", "ES384", ec.generate_private_key(ec.SECP384R1()))
    cases: list[tuple[str | None, str]] = [
        (None, "Authorization: Bearer"),
        (ES.token(f"{cds.url}/cds-services/ebmrag-order-select"), "aud"),
        (ES.token(url, iat=int(time.time()) - 600, exp=int(time.time()) - 300), "expired"),
        (ES.token(url, exp=int(time.time()) + 3600), "5 minutes"),
        (ES.token(url, header={"kid": "not-a-key"}), "kid"),
        (Signer("ehr-es384", "ES384", ES.key, iss="https://other.example/").token(url), "iss"),
        (wrong_key.token(url), "signature"),
        (ES.token(url, jti=None), "jti"),
        (jwt.encode({"iss": ISS, "aud": url, "exp": int(time.time()) + 60, "iat": int(time.time()), "jti": "h"},
                    "a-shared-secret-of-at-least-32-bytes!", algorithm="HS256",
                    headers={"kid": ES.kid, "typ": "JWT"}), "alg"),
        (Signer("ehr-es384", "RS384", RS.key).token(url), "not a key for the JWT's alg"),
        ("not-a-jwt", "not a JWT"),
    ]
    for token, why in cases:
        answer = cds.hook("ebmrag-order-sign", body, token=token) if token is not None else \
            cds.hook("ebmrag-order-sign", body, token=None)
        assert refused(answer, why), (why, answer.status_code, answer.text)
    assert len([r for r in cds.store.audit_rows() if r[5] == "refused 401 /cds-services/{service_id}"]) == len(cases)


def test_a_replayed_token_is_refused(cds: Cds) -> None:
    token = ES.token(f"{cds.url}/cds-services/ebmrag-order-sign")
    assert cds.hook("ebmrag-order-sign", example("order-sign"), token=token).status_code == 200
    assert refused(cds.hook("ebmrag-order-sign", example("order-sign"), token=token), "used before")


class _Jwks(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        return None


def test_a_jwks_url_is_fetched_and_a_foreign_jku_refused(tmp_path: Path) -> None:
    _Jwks.body = json.dumps({"keys": [ES.jwk()]}).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    jwks_url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    port = free_port()
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, prepare_charts=False), cds=CdsParams(
        enabled=True, base_url=f"http://127.0.0.1:{port}",
        issuers={"ehr-url": {"iss": ISS, "tenant": "clinic-b", "jwks_url": jwks_url}}))
    try:
        with serving(create_app(SQLiteStore(tmp_path / "s.sqlite"), settings), port) as (url, _):
            running = Cds(url, SQLiteStore(tmp_path / "s.sqlite"))
            endpoint = f"{url}/cds-services/ebmrag-order-sign"
            ok = ES.token(endpoint, header={"jku": jwks_url})
            assert running.hook("ebmrag-order-sign", example("order-sign"), token=ok).status_code == 200
            foreign = ES.token(endpoint, header={"jku": "https://attacker.example/jwks.json"})
            assert refused(running.hook("ebmrag-order-sign", example("order-sign"), token=foreign), "jku")
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------------ requests
def test_a_malformed_request_is_a_400_naming_the_field_and_an_unknown_service_404(cds: Cds) -> None:
    body = example("order-select")
    del body["context"]["patientId"]
    answer = cds.hook("ebmrag-order-select", body)
    assert answer.status_code == 400 and answer.json()["detail"].startswith("context.patientId:")
    assert cds.hook("ebmrag-order-select", example("order-sign")).json()["detail"].startswith("hook:")
    missing = cds.hook("no-such-service", example("order-sign"))
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"


def test_a_missing_prefetch_without_fhir_authorization_is_412(cds: Cds) -> None:
    body = example("order-select")
    del body["prefetch"]["allergies"]
    del body["fhirAuthorization"]
    answer = cds.hook("ebmrag-order-select", body)
    assert answer.status_code == 412 and "allergies" in answer.json()["detail"]
    body = example("order-select")  # with an authorization, but for a FHIR server the issuer does not list
    del body["prefetch"]["allergies"]
    answer = cds.hook("ebmrag-order-select", body)
    assert answer.status_code == 412 and "fhir_servers" in answer.json()["detail"]


def chart_bundle() -> dict[str, Any]:
    """The order-select example's chart as a transaction to load into the FHIR server."""
    prefetch = example("order-select")["prefetch"]
    resources = [prefetch["patient"], *(e["resource"] for key in ("allergies", "observations")
                                        for e in prefetch[key]["entry"])]
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


def test_a_missing_prefetch_is_fetched_with_the_hooks_fhir_authorization(tmp_path: Path,
                                                                        fhir: FhirServer) -> None:  # noqa: F811
    fhir.load(chart_bundle())
    body = example("order-select")
    body["fhirServer"] = fhir.base
    body["fhirAuthorization"]["access_token"] = fhir.mint_token("system/*.rs")
    body["prefetch"] = {}  # the client prefetched nothing
    with cds_service(tmp_path, fhir_servers=(fhir.base,)) as running:
        answer = running.hook("ebmrag-order-select", body)
    assert answer.status_code == 200, answer.text
    cards = HookResponse.model_validate(answer.json()).cards
    assert [c.source.topic.code for c in cards if c.source.topic] == ["allergy", "renal"]
    assert "AllergyIntolerance/pcn-anaphylaxis" in (cards[0].detail or "")
    asked = {(r["method"], r["path"], r["status"]) for r in fhir.requests()}
    assert {("GET", "/fhir/Patient/4471", 200), ("GET", "/fhir/AllergyIntolerance", 200),
            ("GET", "/fhir/Condition", 200), ("GET", "/fhir/Observation", 200)} <= asked
    assert all(r["query"].get("patient") == "4471" for r in fhir.requests() if r["path"] != "/fhir/Patient/4471")


def test_a_refused_fhir_token_is_412(tmp_path: Path, fhir: FhirServer) -> None:  # noqa: F811
    fhir.load(chart_bundle())
    body = example("order-select")
    body["fhirServer"] = fhir.base
    body["prefetch"] = {"patient": body["prefetch"]["patient"]}  # the token is the example's: the server refuses it
    with cds_service(tmp_path, fhir_servers=(fhir.base,)) as running:
        answer = running.hook("ebmrag-order-select", body)
    assert answer.status_code == 412 and "401" in answer.json()["detail"]


# ------------------------------------------------------------------------------------------------ feedback
def test_feedback_is_recorded_in_the_audit_log_as_ids_and_outcomes(tmp_path: Path, store: PatientStore) -> None:
    comment = "Patient took amoxicillin in 2022 without reaction"
    with cds_service(tmp_path, store=store) as running:
        card = running.hook("ebmrag-order-select", example("order-select")).json()["cards"][0]["uuid"]
        feedback = {"feedback": [
            {"card": card, "outcome": "overridden", "outcomeTimestamp": "2024-09-14T09:05:00Z",
             "overrideReason": {"reason": {"code": "tolerated", "system": "https://ehr.example.org/reasons"},
                                "userComment": comment}},
            {"card": card, "outcome": "accepted", "outcomeTimestamp": "2024-09-14T09:06:00Z",
             "acceptedSuggestions": [{"id": "0b1f6f9e-8a4e-4c5e-9a55-2f1f4f0e7c11"}]}]}
        answer = running.post("/cds-services/ebmrag-order-select/feedback", feedback)
        assert answer.status_code == 200 and answer.json() == {"recorded": 2}
        bad = running.post("/cds-services/ebmrag-order-select/feedback", {"feedback": [{"card": card}]})
        assert bad.status_code == 400 and bad.json()["detail"].startswith("feedback[0].outcome")
        unsigned = running.post("/cds-services/ebmrag-order-select/feedback", feedback, token=None)
        assert unsigned.status_code == 401
    rows = store.audit_rows()
    overridden, = audited(store, "cds:feedback overridden")
    accepted, = audited(store, "cds:feedback accepted")
    assert overridden[2:5] == ("cds:ehr-test", "clinic-a", "") and json.loads(overridden[7]) == [f"card:{card}"]
    assert json.loads(accepted[7]) == [f"card:{card}", "suggestion:0b1f6f9e-8a4e-4c5e-9a55-2f1f4f0e7c11"]
    assert not any(comment in str(column) or "tolerated" in str(column) for row in rows for column in row)


def test_a_hook_request_is_read_off_the_event_loop(cds: Cds) -> None:
    """Two calls at once both answer: the chart work runs on worker threads, the loop keeps serving."""
    results: list[int] = []
    calls: list[Callable[[], None]] = [
        lambda: results.append(cds.hook("ebmrag-order-select", example("order-select")).status_code)
        for _ in range(4)]
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [200] * 4
    assert len(audited(cds.store, "cds:order-select")) == 4


def test_cards_differ_per_hook_instance_and_repeat_for_the_same_one(cds: Cds) -> None:
    first = cds.hook("ebmrag-order-select", example("order-select")).json()["cards"]
    again = cds.hook("ebmrag-order-select", example("order-select")).json()["cards"]
    other = copy.deepcopy(example("order-select"))
    other["hookInstance"] = str(uuid.uuid4())
    third = cds.hook("ebmrag-order-select", other).json()["cards"]
    assert [c["uuid"] for c in first] == [c["uuid"] for c in again]
    assert not {c["uuid"] for c in first} & {c["uuid"] for c in third}


# ------------------------------------------------------------------------------------------------ review findings
def test_aud_is_checked_against_base_url_never_the_host_or_forwarded_headers(cds: Cds) -> None:
    """Finding 3: a token for another ebmrag's URL, sent with that host in Host (or https claimed through
    X-Forwarded-Proto from loopback), is refused; base_url alone says what `aud` must be."""
    body = example("order-select")
    path = "/cds-services/ebmrag-order-select"
    forged = ES.token(f"http://other-ebmrag.example{path}")
    answer = httpx.post(f"{cds.url}{path}", json=body, headers={"Authorization": f"Bearer {forged}",
                                                                "Host": "other-ebmrag.example"})
    assert refused(answer, "aud"), answer.text
    https = ES.token(f"https://{cds.url.removeprefix('http://')}{path}")
    answer = httpx.post(f"{cds.url}{path}", json=body, headers={"Authorization": f"Bearer {https}",
                                                                "X-Forwarded-Proto": "https"})
    assert refused(answer, "aud"), answer.text
    assert cds.hook("ebmrag-order-select", body).status_code == 200  # aud = base_url + the route


def test_a_jku_on_a_token_of_an_issuer_with_a_jwks_file_is_refused(cds: Cds) -> None:
    """Finding 12: an issuer configured with jwks_file takes no jku, not even one that looks harmless."""
    url = f"{cds.url}/cds-services/ebmrag-order-sign"
    token = ES.token(url, header={"jku": "https://ehr.example.org/jwks.json"})
    assert refused(cds.hook("ebmrag-order-sign", example("order-sign"), token=token), "jku")


def test_repeated_bad_tokens_from_one_address_are_answered_429_but_a_valid_token_passes(cds: Cds) -> None:
    """Finding 10: bad JWTs feed the service's failed-credential count per address (shared with /v1 and /ui);
    issue 43: the EHR's valid tokens are checked and answered all the same."""
    statuses = [cds.hook("ebmrag-order-sign", example("order-sign"), token="not-a-jwt").status_code
                for _ in range(FAILED_BURST + 1)]
    assert statuses[:FAILED_BURST] == [401] * FAILED_BURST and statuses[-1] == 429
    throttled = cds.hook("ebmrag-order-sign", example("order-sign"), token="not-a-jwt")
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    assert throttled.headers["content-type"] == "application/problem+json"
    assert cds.hook("ebmrag-order-sign", example("order-sign")).status_code == 200, "a valid token from there"
    assert httpx.get(f"{cds.url}/v1/patients", headers={"Authorization": "Bearer x"}).status_code == 429
    assert audited(cds.store, "refused 429 /cds-services/{service_id}")


def test_an_issuer_key_that_keeps_failing_is_throttled_without_blocking_its_valid_tokens(tmp_path: Path) -> None:
    """Tokens claiming the EHR's issuer and kid with bad signatures, from many addresses (behind a trusted proxy):
    the credential is throttled as such, and the EHR's own tokens still pass."""
    forged = Signer(ES.kid, ES.alg, ec.generate_private_key(ec.SECP384R1()))  # the EHR's iss and kid, another key
    with cds_service(tmp_path, trusted_proxies=("127.0.0.1",)) as cds:
        url = f"{cds.url}/cds-services/ebmrag-order-sign"
        statuses = [httpx.post(url, json=example("order-sign"), timeout=30, headers={
            "Authorization": f"Bearer {forged.token(url)}", "X-Forwarded-For": f"198.51.100.{n}"}).status_code
            for n in range(FAILED_BURST + 2)]
        valid = httpx.post(url, json=example("order-sign"), timeout=30, headers={
            "Authorization": f"Bearer {ES.token(url)}", "X-Forwarded-For": "198.51.100.250"})
    assert statuses[:FAILED_BURST] == [401] * FAILED_BURST and set(statuses[FAILED_BURST:]) == {429}
    assert valid.status_code == 200, valid.text


class _SwitchedJwks(BaseHTTPRequestHandler):
    """A JWK Set URL that can be taken down; counts the fetches."""

    body = b""
    status = 200
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body if self.status == 200 else b"{}")

    def log_message(self, *args: Any) -> None:
        return None


@contextmanager
def jwks_server() -> Iterator[str]:
    _SwitchedJwks.body, _SwitchedJwks.status, _SwitchedJwks.hits = json.dumps({"keys": [ES.jwk()]}).encode(), 200, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SwitchedJwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def url_issuer_service(tmp_path: Path, jwks_url: str, **cds: Any) -> Iterator[Cds]:
    port = free_port()
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, prepare_charts=False), cds=CdsParams(
        enabled=True, base_url=f"http://127.0.0.1:{port}",
        issuers={"ehr-url": {"iss": ISS, "tenant": "clinic-b", "jwks_url": jwks_url}}, **cds))
    store = SQLiteStore(tmp_path / "s.sqlite")
    with serving(create_app(store, settings), port) as (url, _):
        yield Cds(url, store)


def test_a_jwks_url_that_goes_down_after_a_good_fetch_still_verifies(tmp_path: Path) -> None:
    """Finding 10: a failed refetch keeps the last good key set (and is not retried at every call)."""
    with jwks_server() as jwks_url, url_issuer_service(tmp_path, jwks_url, jwks_cache_seconds=0.0) as running:
        assert running.hook("ebmrag-order-sign", example("order-sign")).status_code == 200
        _SwitchedJwks.status = 503
        for _ in range(3):
            assert running.hook("ebmrag-order-sign", example("order-sign")).status_code == 200
        assert _SwitchedJwks.hits == 2  # the first fetch, one failed refetch; then RETRY_FAILED_AFTER holds


def test_an_unknown_kid_refetches_the_jwks_url_at_most_once_per_five_minutes(tmp_path: Path) -> None:
    with jwks_server() as jwks_url, url_issuer_service(tmp_path, jwks_url) as running:
        assert running.hook("ebmrag-order-sign", example("order-sign")).status_code == 200
        url = f"{running.url}/cds-services/ebmrag-order-sign"
        for _ in range(3):
            token = ES.token(url, header={"kid": f"unknown-{uuid.uuid4()}"})
            assert refused(running.hook("ebmrag-order-sign", example("order-sign"), token=token), "kid")
        assert _SwitchedJwks.hits == 1


def test_a_stale_key_set_is_used_up_to_its_bound_then_refused() -> None:
    """KeySets over real HTTP and a test clock: a set 23 h past its last good fetch still serves, 25 h does not."""
    now = [1000.0]
    with jwks_server() as jwks_url:
        params = CdsParams(issuers={"e": {"iss": ISS, "tenant": "t", "jwks_url": jwks_url}})
        keys, issuer = KeySets(params, clock=lambda: now[0]), params.issuer("e")
        assert keys.key(issuer, ES.kid) is not None
        _SwitchedJwks.status = 500
        now[0] += 23 * 3600
        assert keys.key(issuer, ES.kid) is not None and _SwitchedJwks.hits == 2
        now[0] += 2 * 3600
        with pytest.raises(CdsAuthError, match="could not be fetched") as raised:
            keys.key(issuer, ES.kid)
        assert not raised.value.client_fault  # the service's problem: not counted against the caller
        _SwitchedJwks.status = 200
        now[0] += RETRY_FAILED_AFTER
        assert keys.key(issuer, ES.kid) is not None  # back


def many_observations(count: int) -> list[dict[str, Any]]:
    return [{"resourceType": "Observation", "id": f"bp-{n}", "status": "final", "subject": {"reference":
             "Patient/4471"}, "code": {"text": "Heart rate"}, "valueQuantity": {"value": 70, "unit": "/min"},
             "effectiveDateTime": "2024-09-01T08:00:00Z"} for n in range(count)]


@pytest.mark.parametrize("fault", [{"bad_gzip": True}, {"next_link": "http://[::1"}])
def test_a_fetch_that_fails_in_any_way_is_412_naming_the_key(tmp_path: Path, fhir: FhirServer,  # noqa: F811
                                                              fault: dict[str, Any]) -> None:
    """Finding 7: a body with a bad gzip encoding, or a next link that is no URL, leaves the key missing: 412."""
    bundle = chart_bundle()
    bundle["entry"] += [{"resource": r} for r in many_observations(120)]  # a next page after the first 100
    fhir.load(bundle)
    fhir.faults(**fault)
    body = example("order-select")
    body["fhirServer"] = fhir.base
    body["fhirAuthorization"]["access_token"] = fhir.mint_token("system/*.rs")
    del body["prefetch"]["observations"]
    with cds_service(tmp_path, fhir_servers=(fhir.base,)) as running:
        answer = running.hook("ebmrag-order-select", body)
    assert answer.status_code == 412, answer.text
    detail = answer.json()["detail"]
    assert "'observations'" in detail and "\n" not in detail and "4471" not in detail


def malformed_allergies() -> dict[str, Any]:
    body = example("order-select")
    allergy = body["prefetch"]["allergies"]["entry"][0]
    body["prefetch"]["allergies"]["entry"] = [{"fullUrl": "urn:uuid:lost"}, allergy]  # an entry without a resource
    return body


def test_an_unreadable_prefetch_is_412_without_a_fhir_authorization(cds: Cds) -> None:
    """Finding 9: the penicillin anaphylaxis is never silently lost with the entry beside it."""
    body = malformed_allergies()
    del body["fhirAuthorization"]
    answer = cds.hook("ebmrag-order-select", body)
    assert answer.status_code == 412 and "allergies (prefetch.allergies: entry[0]" in answer.json()["detail"]
    body["prefetch"]["allergies"]["entry"] = {"resource": body["prefetch"]["allergies"]["entry"][1]["resource"]}
    answer = cds.hook("ebmrag-order-select", body)
    assert answer.status_code == 412 and "prefetch.allergies.entry: not a list" in answer.json()["detail"]


def test_an_unreadable_prefetch_is_fetched_from_a_listed_base(tmp_path: Path, fhir: FhirServer) -> None:  # noqa: F811
    """Finding 9 and 11: the unreadable key is fetched instead; the fhirServer matches its listed base normalised
    (a trailing slash), and one with a query string is refused."""
    fhir.load(chart_bundle())
    body = malformed_allergies()
    body["fhirServer"] = fhir.base + "/"
    body["fhirAuthorization"]["access_token"] = fhir.mint_token("system/*.rs")
    with cds_service(tmp_path, fhir_servers=(fhir.base,)) as running:
        answer = running.hook("ebmrag-order-select", body)
        assert answer.status_code == 200, answer.text
        cards = HookResponse.model_validate(answer.json()).cards
        assert next(c.source.topic.code for c in cards if c.source.topic) == "allergy"
        assert [(r["path"], r["status"]) for r in fhir.requests()] == [("/fhir/AllergyIntolerance", 200)]
        body["fhirServer"] = fhir.base + "?_format=json"
        answer = running.hook("ebmrag-order-select", body)
        assert answer.status_code == 400 and answer.json()["detail"].startswith("fhirServer:")


def test_malformed_draft_orders_are_400_never_an_empty_answer(cds: Cds) -> None:
    body = example("order-sign")
    del body["context"]["draftOrders"]["entry"][0]["resource"]["medicationCodeableConcept"]
    answer = cds.hook("ebmrag-order-sign", body)
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("context.draftOrders.entry[0].resource:")
    body["context"]["draftOrders"]["entry"][0]["resource"]["medicationReference"] = {"reference": "Medication/x"}
    answer = cds.hook("ebmrag-order-sign", body)  # a reference nothing resolves: found only with the chart
    assert answer.status_code == 400 and "medicationReference" in answer.json()["detail"]


def test_an_allergy_of_another_or_no_patient_in_the_prefetch_gives_no_allergy_card(cds: Cds) -> None:
    """Finding 4 over HTTP: an identifier-only patient is not this patient; the answer says what was not read."""
    body = example("order-select")
    body["prefetch"]["allergies"]["entry"][0]["resource"]["patient"] = {
        "identifier": {"system": "urn:mrn", "value": "4471"}, "display": "Other Person"}
    answer = cds.hook("ebmrag-order-select", body)
    assert answer.status_code == 200, answer.text
    topics = [c.source.topic.code for c in HookResponse.model_validate(answer.json()).cards if c.source.topic]
    assert "allergy" not in topics and "left-out" in topics
