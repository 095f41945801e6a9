"""The test FHIR server itself (tests/fhir_server), driven as B's and D's tests drive it: real HTTP, real signed
client assertions (PyJWT), the 17 real charts of ../shared/data/fhir_charts.

What the server must do is tests/fhir_server/README.md; these tests hold it to that, so a failure in an EHR test
can be blamed on the client, not on the server.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.ehr.fhir_server import NOT_INSTALLED, FhirServer

Json = dict[str, Any]

CHARTS = (
    "au_gpvisit_no_ids_document.json", "au_missing_composition_elements_document.json",
    "au_noknown_negations_document.json", "ecr_eicr_not_pregnant_batch.json", "fhirconv_discharge_summary_batch.json",
    "fhirconv_embedded_pdf_batch.json", "fhirconv_onc_ambulatory_ccd_batch.json", "ips_at_elga_german_document.json",
    "ips_cy_pregnancy_document.json", "ips_dk_danish_medication_card_document.json",
    "ips_it_italian_codes_document.json", "ips_nl_dutch_malformed_document.json",
    "ips_nz_peter_jordan_labs_document.json", "ips_us_epic_document.json",
    "ips_us_meditech_renal_transplant_searchset.json", "synthea_ckd_diabetes_transaction.json",
    "uscore_amy_shaw_collection.json",
)
# Entries $everything cannot reach (README, "What $everything returns"): nothing of the patient's references them,
# or only a resource one hop away does (PractitionerRole -> Practitioner), or they reference nothing at all
# (fhirconv DocumentReferences without subject, au_missing's Composition whose subject is data-absent).
UNREACHABLE = {
    "au_missing_composition_elements_document.json": 4, "au_noknown_negations_document.json": 1,
    "ecr_eicr_not_pregnant_batch.json": 2, "fhirconv_discharge_summary_batch.json": 3,
    "fhirconv_embedded_pdf_batch.json": 2, "fhirconv_onc_ambulatory_ccd_batch.json": 1,
    "ips_cy_pregnancy_document.json": 4,
}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def page_all(url: str, token: str, **params: str) -> tuple[list[Json], int]:
    """Every entry of a searchset, following absolute `next` links; also the number of pages read."""
    entries: list[Json] = []
    pages = 0
    next_url: str | None = url
    with httpx.Client(headers=auth(token)) as http:
        while next_url:
            response = http.get(next_url, params=params if pages == 0 else None)
            assert response.status_code == 200, response.text
            bundle = response.json()
            entries += bundle.get("entry", [])
            pages += 1
            next_url = next((link["url"] for link in bundle["link"] if link["relation"] == "next"), None)
            assert next_url is None or next_url.startswith("http://127.0.0.1:")
    assert len(entries) == bundle["total"]
    return entries, pages


def references(value: Any, found: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "reference" and isinstance(item, str):
                found.add(item)
            else:
                references(item, found)
    elif isinstance(value, list):
        for item in value:
            references(item, found)
    return found


def small_chart(patient: str = "p1") -> Json:
    """A transaction with urn:uuid fullUrls and no ids, as Synthea writes them."""
    person, doctor = f"urn:uuid:{uuid.uuid4()}", f"urn:uuid:{uuid.uuid4()}"
    observation = {"resourceType": "Observation", "status": "final", "code": {"text": "potassium"},
                   "subject": {"reference": person}, "performer": [{"reference": doctor}]}
    return {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": person, "resource": {"resourceType": "Patient", "id": patient}},
        {"fullUrl": doctor, "resource": {"resourceType": "Practitioner"}},
        *({"fullUrl": f"urn:uuid:{uuid.uuid4()}", "resource": observation} for _ in range(3)),
    ]}


# ---------------------------------------------------------------------------------------------- the real charts

@pytest.mark.data
def test_the_chart_folder_holds_the_17_known_charts(shared_data: Path) -> None:
    assert sorted(p.name for p in (shared_data / "fhir_charts").glob("*.json")) == sorted(CHARTS)


@pytest.mark.data
@pytest.mark.parametrize("name", CHARTS)
def test_every_chart_loads_and_pages_back_completely(fhir: FhirServer, shared_data: Path, name: str) -> None:
    path = shared_data / "fhir_charts" / name
    bundle = json.loads(path.read_text("utf-8"))
    [patient] = fhir.load(path)
    token = fhir.mint_token("system/*.rs")

    everything, pages = page_all(f"{fhir.base}/Patient/{patient}/$everything", token, _count="5")
    assert (everything[0]["resource"]["resourceType"], everything[0]["resource"]["id"]) == ("Patient", patient)
    keys = [f"{e['resource']['resourceType']}/{e['resource']['id']}" for e in everything]
    assert len(keys) == len(set(keys)) and pages == -(-len(keys) // 5)
    assert len(everything) == len(bundle["entry"]) - UNREACHABLE.get(name, 0)
    assert all(e["resource"]["meta"]["versionId"] == "1" and e["resource"]["meta"]["lastUpdated"] for e in everything)

    # The patient's resources, read from the file: those holding a reference to the Patient (id or fullUrl).
    [entry] = [e for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"]
    names = {f"Patient/{patient}", *([entry["fullUrl"]] if entry.get("fullUrl") else [])}
    mine = Counter(e["resource"]["resourceType"] for e in bundle["entry"]
                   if e["resource"]["resourceType"] != "Patient" and references(e["resource"], set()) & names)
    matched = [e for e in everything[1:] if e["search"]["mode"] == "match"]
    assert Counter(e["resource"]["resourceType"] for e in matched) == mine
    for resource_type, count in mine.items():
        found, _ = page_all(f"{fhir.base}/{resource_type}", token, patient=patient, _count="5")
        assert len(found) == count, resource_type
        assert {e["resource"]["id"] for e in found} == {
            e["resource"]["id"] for e in matched if e["resource"]["resourceType"] == resource_type}


@pytest.mark.data
def test_references_are_rewritten_to_the_stored_ids(fhir: FhirServer, shared_data: Path) -> None:
    """ips_at_elga: no resource has an id and every reference is urn:uuid; the stored chart reads as Type/id."""
    [patient] = fhir.load(shared_data / "fhir_charts" / "ips_at_elga_german_document.json")
    everything, _ = page_all(f"{fhir.base}/Patient/{patient}/$everything", fhir.mint_token(), _count="200")
    stored = {f"{e['resource']['resourceType']}/{e['resource']['id']}" for e in everything}
    pointed = set().union(*(references(e["resource"], set()) for e in everything))
    assert pointed and pointed <= stored


# ---------------------------------------------------------------------------------------------- loading, _since

def test_a_reload_makes_new_versions_and_since_returns_only_them(fhir: FhirServer) -> None:
    chart = small_chart()
    assert fhir.load(chart) == ["p1"]
    token = fhir.mint_token()
    first, _ = page_all(f"{fhir.base}/Patient/p1/$everything", token)
    assert [e["search"]["mode"] for e in first] == ["match"] * 4 + ["include"]  # Patient, 3 Observations, doctor
    instant = max(e["resource"]["meta"]["lastUpdated"] for e in first)

    fhir.load([first[1]["resource"]])  # the stored Observation, loaded again
    for url, params in ((f"{fhir.base}/Patient/p1/$everything", {"_since": instant}),
                        (f"{fhir.base}/Observation", {"patient": "p1", "_since": instant}),
                        (f"{fhir.base}/Observation", {"patient": "Patient/p1", "_lastUpdated": f"gt{instant}"})):
        since, _ = page_all(url, token, **params)
        assert [e["resource"]["id"] for e in since] == [first[1]["resource"]["id"]]
        assert since[0]["resource"]["meta"]["versionId"] == "2"
        assert since[0]["resource"]["meta"]["lastUpdated"] > instant


def test_a_chart_reloaded_keeps_its_ids(fhir: FhirServer) -> None:
    chart = small_chart()
    fhir.load(chart)
    fhir.load(chart)
    observations, _ = page_all(f"{fhir.base}/Observation", fhir.mint_token(), subject="Patient/p1")
    assert len(observations) == 3 and {e["resource"]["meta"]["versionId"] for e in observations} == {"2"}


def test_reset_empties_the_server(fhir: FhirServer) -> None:
    fhir.load(small_chart())
    fhir.reset()
    assert httpx.get(f"{fhir.base}/Patient/p1", headers=auth(fhir.mint_token())).status_code == 404
    assert fhir.requests() == [{"method": "GET", "path": "/fhir/Patient/p1", "query": {}, "status": 404}]


def test_bad_searches_are_refused_with_an_operation_outcome(fhir: FhirServer) -> None:
    token = fhir.mint_token()
    for params in ({"colour": "red"}, {"date": "yesterday"}, {"_since": "not-an-instant"}, {"_count": "0"}):
        response = httpx.get(f"{fhir.base}/Observation", params=params, headers=auth(token))
        assert response.status_code == 400 and response.json()["resourceType"] == "OperationOutcome", params


# ---------------------------------------------------------------------------------------------- SMART auth

@pytest.fixture
def client(fhir: FhirServer) -> dict[str, Any]:
    """A registered SMART client with an RSA (RS384) and an EC P-384 (ES384) key."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP384R1())
    jwks = {"keys": [
        {**jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), "kid": "rsa", "alg": "RS384"},
        {**jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True), "kid": "ec", "alg": "ES384"},
    ]}
    fhir.register_client("ebmrag-test", jwks, scope="system/Patient.rs system/Observation.rs")
    return {"rsa": rsa_key, "ec": ec_key}


def assertion(fhir: FhirServer, keys: dict[str, Any], key: str = "rsa", kid: str | None = None, **claims: Any) -> str:
    """A client assertion as SMART Backend Services asks for it, signed RS384 (key "rsa") or ES384 (key "ec")."""
    body = {"iss": "ebmrag-test", "sub": "ebmrag-test", "aud": fhir.token_url, "exp": int(time.time()) + 240,
            "jti": str(uuid.uuid4()), **claims}
    algorithm = "ES384" if key == "ec" else "RS384"
    return jwt.encode(body, keys[key], algorithm=algorithm, headers={"kid": kid or key})


def ask_token(fhir: FhirServer, signed: str, scope: str = "system/Patient.rs system/Observation.rs") -> httpx.Response:
    return httpx.post(fhir.token_url, data={
        "grant_type": "client_credentials", "scope": scope, "client_assertion": signed,
        "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"})


@pytest.mark.parametrize("key", ["rsa", "ec"])
def test_a_signed_client_assertion_gets_a_token_that_reads(fhir: FhirServer, client: dict[str, Any], key: str) -> None:
    fhir.load(small_chart())
    response = ask_token(fhir, assertion(fhir, client, key=key), scope="system/Patient.rs system/Condition.rs")
    assert response.status_code == 200, response.text
    grant = response.json()
    assert grant["token_type"] == "bearer" and grant["scope"] == "system/Patient.rs" and grant["expires_in"] > 0
    assert httpx.get(f"{fhir.base}/Patient/p1", headers=auth(grant["access_token"])).status_code == 200


@pytest.mark.parametrize("bad", [
    {"aud": "http://127.0.0.1:1/auth/token"},  # another server's token endpoint
    {"kid": "not-registered"},
    {"key": "ec", "kid": "rsa"},  # an ES384 signature under the RSA key's kid
    {"exp": int(time.time()) - 10},  # expired
    {"exp": int(time.time()) + 3600},  # more than 5 minutes ahead
    {"key": "ec", "iss": "someone-else"},
], ids=["aud", "unknown-kid", "wrong-key", "expired", "exp-too-far", "iss"])
def test_a_bad_client_assertion_is_refused(fhir: FhirServer, client: dict[str, Any], bad: Json) -> None:
    response = ask_token(fhir, assertion(fhir, client, **bad))
    assert (response.status_code, response.json()["error"]) == (401, "invalid_client")


def test_a_replayed_or_forged_assertion_and_an_unregistered_scope_are_refused(
        fhir: FhirServer, client: dict[str, Any]) -> None:
    signed = assertion(fhir, client)
    assert ask_token(fhir, signed).status_code == 200
    assert ask_token(fhir, signed).json()["error"] == "invalid_client"  # same jti
    header, payload, _ = assertion(fhir, client).split(".")
    _, _, other_signature = assertion(fhir, client).split(".")
    assert ask_token(fhir, f"{header}.{payload}.{other_signature}").status_code == 401
    assert ask_token(fhir, "bnVsbA.bnVsbA.c2ln").json()["error"] == "invalid_client"  # null.null.sig
    refused = ask_token(fhir, assertion(fhir, client), scope="system/Condition.rs")
    assert (refused.status_code, refused.json()["error"]) == (400, "invalid_scope")


def test_fhir_requests_need_a_live_token_within_scope(fhir: FhirServer) -> None:
    fhir.load(small_chart())
    for headers in ({}, auth("made-up")):
        response = httpx.get(f"{fhir.base}/Patient/p1", headers=headers)
        assert response.status_code == 401 and response.json()["resourceType"] == "OperationOutcome"
        assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    patients_only = fhir.mint_token("system/Patient.rs")
    assert httpx.get(f"{fhir.base}/Patient/p1", headers=auth(patients_only)).status_code == 200
    forbidden = httpx.get(f"{fhir.base}/Observation", params={"patient": "p1"}, headers=auth(patients_only))
    assert forbidden.status_code == 403 and forbidden.json()["resourceType"] == "OperationOutcome"
    everything, _ = page_all(f"{fhir.base}/Patient/p1/$everything", patients_only)
    assert [e["resource"]["resourceType"] for e in everything] == ["Patient"]


def test_metadata_and_smart_configuration_need_no_token(fhir: FhirServer) -> None:
    fhir.load(small_chart())
    statement = httpx.get(f"{fhir.base}/metadata").json()
    rest = statement["rest"][0]
    [uris] = [x for x in rest["security"]["extension"] if x["url"].endswith("/oauth-uris")]
    assert uris["extension"] == [{"url": "token", "valueUri": fhir.token_url}]
    resources = {r["type"]: r for r in rest["resource"]}
    assert {"Patient", "Observation", "Practitioner", "Group"} <= set(resources)
    assert {"name": "everything"}.items() <= resources["Patient"]["operation"][0].items()
    assert [op["name"] for op in resources["Group"]["operation"]] == ["export"]
    assert {"patient", "code", "_lastUpdated"} <= {p["name"] for p in resources["Observation"]["searchParam"]}
    smart = httpx.get(f"{fhir.base}/.well-known/smart-configuration").json()
    assert smart["token_endpoint"] == fhir.token_url and "client-confidential-asymmetric" in smart["capabilities"]
    assert smart["token_endpoint_auth_signing_alg_values_supported"] == ["RS384", "ES384"]


# ---------------------------------------------------------------------------------------------- faults

def test_token_faults(fhir: FhirServer, client: dict[str, Any]) -> None:
    fhir.load(small_chart())
    token = fhir.mint_token()
    fhir.faults(expire_tokens=True)
    assert httpx.get(f"{fhir.base}/Patient/p1", headers=auth(token)).status_code == 401
    fhir.faults(token_ttl_seconds=0)
    grant = ask_token(fhir, assertion(fhir, client)).json()
    assert grant["expires_in"] == 0
    assert httpx.get(f"{fhir.base}/Patient/p1", headers=auth(grant["access_token"])).status_code == 401


def test_rate_limit_fault(fhir: FhirServer) -> None:
    fhir.load(small_chart())
    token = fhir.mint_token()
    fhir.faults(rate_limit={"count": 2, "retry_after": 7})
    for _ in range(2):
        limited = httpx.get(f"{fhir.base}/Patient/p1", headers=auth(token))
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "7"
        assert limited.json()["resourceType"] == "OperationOutcome"
    assert httpx.get(f"{fhir.base}/Patient/p1", headers=auth(token)).status_code == 200


def test_fail_page_fault_fails_the_nth_paging_request_once(fhir: FhirServer) -> None:
    fhir.load(small_chart())
    token = fhir.mint_token()
    fhir.faults(fail_page={"n": 2, "status": 503})
    first = httpx.get(f"{fhir.base}/Patient/p1/$everything", params={"_count": "1"}, headers=auth(token)).json()
    second_url = next(link["url"] for link in first["link"] if link["relation"] == "next")
    second = httpx.get(second_url, headers=auth(token)).json()
    third_url = next(link["url"] for link in second["link"] if link["relation"] == "next")
    failed = httpx.get(third_url, headers=auth(token))
    assert failed.status_code == 503 and failed.json()["resourceType"] == "OperationOutcome"
    assert httpx.get(third_url, headers=auth(token)).status_code == 200
    assert [r["status"] for r in fhir.requests()] == [200, 200, 503, 200]


def test_everything_can_be_switched_off(fhir: FhirServer) -> None:
    fhir.load(small_chart())
    fhir.faults(everything=False)
    statement = httpx.get(f"{fhir.base}/metadata").json()
    [patient] = [r for r in statement["rest"][0]["resource"] if r["type"] == "Patient"]
    assert "everything" not in [op["name"] for op in patient.get("operation", [])]
    response = httpx.get(f"{fhir.base}/Patient/p1/$everything", headers=auth(fhir.mint_token()))
    assert response.status_code == 404 and response.json()["resourceType"] == "OperationOutcome"


# ---------------------------------------------------------------------------------------------- Bulk Data

def kick_off(fhir: FhirServer, token: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{fhir.base}/{path}", params=params, headers={**auth(token), "Prefer": "respond-async"})


def test_group_export_kick_off_poll_download(fhir: FhirServer) -> None:
    fhir.load(small_chart("p1"))
    fhir.load(small_chart("p2"))
    fhir.load([{"resourceType": "Group", "id": "ward", "type": "person", "actual": True,
                "member": [{"entity": {"reference": "Patient/p1"}}, {"entity": {"reference": "Patient/p2"}}]}])
    token = fhir.mint_token()
    fhir.faults(export_polls=2, export_retry_after=0)
    accepted = kick_off(fhir, token, "Group/ward/$export")
    assert accepted.status_code == 202
    status_url = accepted.headers["Content-Location"]
    for poll in (1, 2):
        pending = httpx.get(status_url, headers=auth(token))
        assert (pending.status_code, pending.headers["Retry-After"]) == (202, "0")
        assert pending.headers["X-Progress"] == f"poll {poll} of 2"
    done = httpx.get(status_url, headers=auth(token))
    assert done.status_code == 200
    manifest = done.json()
    assert manifest["requiresAccessToken"] is True and manifest["error"] == [] and manifest["transactionTime"]
    counts = {out["type"]: out["count"] for out in manifest["output"]}
    assert counts == {"Patient": 2, "Observation": 6, "Practitioner": 2}
    for out in manifest["output"]:
        assert httpx.get(out["url"]).status_code == 401
        ndjson = httpx.get(out["url"], headers=auth(token))
        assert ndjson.headers["Content-Type"].startswith("application/fhir+ndjson")
        lines = [json.loads(line) for line in ndjson.text.splitlines()]
        assert len(lines) == out["count"] and {r["resourceType"] for r in lines} == {out["type"]}
    assert httpx.delete(status_url, headers=auth(token)).status_code == 202
    assert httpx.get(status_url, headers=auth(token)).status_code == 404


def test_patient_export_with_type_and_since(fhir: FhirServer) -> None:
    fhir.load(small_chart("p1"))
    token = fhir.mint_token()
    observations = page_all(f"{fhir.base}/Observation", token, patient="p1")[0]
    instant = observations[0]["resource"]["meta"]["lastUpdated"]
    fhir.load([observations[0]["resource"]])
    fhir.faults(export_polls=0)
    accepted = kick_off(fhir, token, "Patient/$export", _type="Observation", _since=instant)
    manifest = httpx.get(accepted.headers["Content-Location"], headers=auth(token)).json()
    assert [(out["type"], out["count"]) for out in manifest["output"]] == [("Observation", 1)]
    assert httpx.get(f"{fhir.base}/Patient/$export", headers=auth(token)).status_code == 400  # no Prefer


def test_the_helper_says_how_to_install_the_server(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="make fhir-server"):
        FhirServer(server_dir=tmp_path).start()
    assert "make fhir-server" in NOT_INSTALLED
