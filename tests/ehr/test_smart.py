"""SMART Backend Services against the real test server: real keys (RS384, ES384), real signed assertions, the
server's verdicts, and what a pull does when its token expires."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

import jwt
import pytest

from ebmrag.ehr.fhir import EhrError, FhirClient
from ebmrag.ehr.keys import generate, load_signing_key, public_jwk, thumbprint, write_private_key
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.ehr.pull import pull_patient
from ebmrag.ehr.smart import TokenSource, client_assertion, connect, discover, trusted_token_endpoint
from ebmrag.errors import ConfigError
from ebmrag.store.patients import SQLiteStore
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import QUICK, TENANT, Bystander, load_one, quick, register

NZ = "ips_nz_peter_jordan_labs_document.json"


@pytest.mark.parametrize("algorithm", ["RS384", "ES384"])
def test_a_signed_assertion_buys_a_token_that_reads_the_chart(fhir: FhirServer, tmp_path: Path,
                                                               algorithm: str) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path, algorithm)
    client, _ = connect(connection, QUICK)
    assert isinstance(client.auth, TokenSource)
    read = client.read(f"Patient/{patient}", operation="read Patient")
    assert read["id"] == patient
    assert client.auth.issued == 1 and client.auth.scope == "system/*.rs"
    assert [r["path"] for r in fhir.requests() if r["path"].startswith("/auth")] == ["/auth/token"]


@pytest.mark.parametrize("algorithm", ["RS384", "ES384"])
def test_the_assertion_carries_what_the_profile_requires(tmp_path: Path, algorithm: str) -> None:
    key = generate(algorithm)
    write_private_key(key, tmp_path / "k.pem")
    signing = load_signing_key(tmp_path / "k.pem", algorithm)
    first = client_assertion(signing, "me", "https://ehr.example/token", now=1_000_000)
    second = client_assertion(signing, "me", "https://ehr.example/token", now=1_000_000)
    header = jwt.get_unverified_header(first)
    claims = jwt.decode(first, key.public_key(), algorithms=[algorithm], audience="https://ehr.example/token",
                        options={"verify_exp": False})
    assert header["alg"] == algorithm and header["kid"] == thumbprint(public_jwk(key, algorithm))
    assert claims["iss"] == claims["sub"] == "me" and claims["exp"] - claims["iat"] == 300
    assert claims["jti"] != jwt.decode(second, options={"verify_signature": False})["jti"], "one use each"


def test_the_key_file_is_owner_only_and_a_jwk_file_works_too(fhir: FhirServer, tmp_path: Path) -> None:
    key = generate("ES384")
    write_private_key(key, tmp_path / "k.pem")
    assert stat.S_IMODE((tmp_path / "k.pem").stat().st_mode) == 0o600
    private = jwt.algorithms.ECAlgorithm.to_jwk(key, as_dict=True) | {"kid": "mine"}
    (tmp_path / "k.jwk").write_text(json.dumps({"keys": [private]}))
    loaded = load_signing_key(tmp_path / "k.jwk", "ES384")
    assert loaded.kid == "mine"
    fhir.register_client("c1", {"keys": [public_jwk(key, "ES384", "mine")]})
    connection = EhrConnection("jwk", TENANT, fhir.base, "c1", str(tmp_path / "k.jwk"), allow_http=True)
    source = TokenSource(connection, loaded, fhir.token_url)
    assert source.token()
    with pytest.raises(ConfigError, match="RS384 needs an RSA key"):
        load_signing_key(tmp_path / "k.pem", "RS384")


def test_an_unregistered_key_is_one_line_naming_the_servers_reason(fhir: FhirServer, tmp_path: Path) -> None:
    load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    stranger = generate("ES384")
    write_private_key(stranger, Path(connection.private_key_file))  # the EHR knows the other public key
    client, _ = connect(connection, QUICK)
    with pytest.raises(EhrError) as caught:
        client.read("Patient", operation="search Patient")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("token request: the authorization server refused (401)")
    assert message.endswith(": invalid_client") and "kid" not in message, "the code, never the server's words"


def test_discovery_falls_back_to_the_capability_statement(fhir: FhirServer) -> None:
    real = FhirClient(fhir.base, QUICK)
    capability = real.read("metadata", operation="read CapabilityStatement", authorized=False)
    assert discover(real, capability).algorithms == ("RS384", "ES384")
    # A base whose .well-known answers 404: the token endpoint is read from the CapabilityStatement's oauth-uris.
    elsewhere = FhirClient(fhir.base + "/NoSuchPlace", QUICK)
    found = discover(elsewhere, capability)
    assert found.token_endpoint == fhir.token_url and found.algorithms == ()
    with pytest.raises(EhrError, match="names no token endpoint"):
        discover(elsewhere, {"resourceType": "CapabilityStatement"})


def test_an_expired_token_is_replaced_once_and_the_pull_goes_on(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    expired = []

    def expire_after_the_first_page(stage: str, done: int, total: int) -> None:
        if not expired:
            fhir.faults(expire_tokens=True)  # every token issued so far is dead from now on
            expired.append(done)

    store = SQLiteStore(tmp_path / "s.sqlite")
    report = pull_patient(store, connection, patient, params=quick(page_size=20),
                          progress=expire_after_the_first_page)
    log = fhir.requests()
    assert [r["status"] for r in log if r["path"] == "/auth/token"] == [200, 200]
    assert [r["status"] for r in log if r["status"] == 401] == [401], "one refusal, then the fresh token"
    assert report.written.added == len(report.fragment_ids) > 10


def test_a_token_that_never_works_is_one_line_and_stores_nothing(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    fhir.faults(token_ttl_seconds=0)  # every token is born expired
    store = SQLiteStore(tmp_path / "s.sqlite")
    with pytest.raises(EhrError) as caught:
        pull_patient(store, connection, patient, params=QUICK)
    message = str(caught.value)
    assert message == "Patient $everything: the FHIR server refused (401 Unauthorized; issue login)"
    assert caught.value.status == 401 and patient not in message
    assert [r["path"] for r in fhir.requests() if r["status"] == 401] == [f"/fhir/Patient/{patient}/$everything"] * 2
    assert store.record(TENANT, patient) is None


def test_pulls_of_one_connection_share_a_token_until_the_server_refuses_it(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    store = SQLiteStore(tmp_path / "s.sqlite")
    for _ in range(3):
        pull_patient(store, connection, patient, params=QUICK)
    assert [r["status"] for r in fhir.requests() if r["path"] == "/auth/token"] == [200]
    fhir.faults(expire_tokens=True)
    pull_patient(store, connection, patient, params=QUICK)
    assert [r["status"] for r in fhir.requests() if r["path"] == "/auth/token"] == [200, 200]


def test_a_token_endpoint_on_another_origin_never_gets_the_assertion(fhir: FhirServer, tmp_path: Path) -> None:
    patient = load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    with Bystander(200, b'{"access_token": "from-elsewhere", "expires_in": 300}') as elsewhere:
        fhir.faults(token_endpoint=f"{elsewhere.origin}/token")  # what an unauthenticated discovery may say
        with pytest.raises(EhrError) as caught:
            connect(connection, QUICK)
        assert str(caught.value) == (f"SMART discovery: the token endpoint is on another origin than the FHIR base "
                                     f"({elsewhere.origin}); not used: list it in [ehr.connections.ehr] "
                                     "token_origins, or set token_endpoint there")
        mark = len(fhir.requests())
        configured = replace(connection, token_endpoint=fhir.token_url)  # the operator's word replaces discovery
        client, _ = connect(configured, QUICK)
        assert client.read(f"Patient/{patient}", operation="read Patient")["id"] == patient
        assert not any(r["path"].endswith("smart-configuration") for r in fhir.requests()[mark:])
        assert elsewhere.received == [], "the signed assertion never left for the other origin"


def test_a_listed_token_origin_is_used_and_its_refusal_relays_no_free_text(fhir: FhirServer, tmp_path: Path) -> None:
    load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    said = {"error": "invalid_client\r\nX-Injected: 1",
            "error_description": "line one\nline two \x1b[31mred\x1b[0m \u202eevil\x00 " + "x" * 2000}
    with Bystander(400, json.dumps(said).encode()) as authorization:
        fhir.faults(token_endpoint=f"{authorization.origin}/token")
        client, _ = connect(replace(connection, token_origins=(authorization.origin,)), QUICK)
        with pytest.raises(EhrError) as caught:
            client.read("Patient", operation="search Patient")
    assert str(caught.value) == ("token request: the authorization server refused (400): an error code that is not "
                                 "OAuth's"), "an error that is no OAuth code is not repeated, nor its description"
    assert [method for method, _, _ in authorization.received] == ["POST"]


def test_only_https_unless_the_connection_is_for_local_testing() -> None:
    with pytest.raises(ValueError, match="fhir_base must be an https URL"):
        EhrParams(connections={"ehr": {"tenant": TENANT, "fhir_base": "http://ehr.example/fhir"}})
    with pytest.raises(ValueError, match=r"token_origins: 'https://auth\.example/path' is not an origin"):
        EhrConnection("ehr", TENANT, "https://ehr.example/fhir", token_origins=("https://auth.example/path",))
    secure = EhrConnection("ehr", TENANT, "https://ehr.example/fhir", token_origins=("https://auth.example",))
    assert trusted_token_endpoint(secure, "https://auth.example/oauth/token")
    assert trusted_token_endpoint(secure, "https://EHR.example:443/auth/token")
    for refused, reason in [("http://ehr.example/auth/token", "not https"),
                            ("https://auth.example:8443/token", "another origin"),
                            ("https://evil.example/token", "another origin"),
                            ("https://user:secret@ehr.example/token", "not a plain http(s) URL"),
                            ("https://ehr.example/token?x=1", "not a plain http(s) URL"),
                            ("https://[::1/token", "not a valid URL")]:
        with pytest.raises(EhrError) as caught:
            trusted_token_endpoint(secure, refused)
        assert str(caught.value).startswith("SMART discovery: the token endpoint is ") and reason in str(caught.value)


def test_a_configured_token_endpoint_is_used_wherever_it_is(fhir: FhirServer, tmp_path: Path) -> None:
    load_one(fhir, NZ)
    connection = register(fhir, tmp_path)
    with Bystander(200, b'{"access_token": "not-this-servers", "expires_in": 300}') as authorization:
        client, _ = connect(replace(connection, token_endpoint=f"{authorization.origin}/token"), QUICK)
        with pytest.raises(EhrError, match=r"refused \(401 Unauthorized; issue login\)"):
            client.read("Patient", operation="search Patient")  # its token is not the FHIR server's: refused
    assert [method for method, _, _ in authorization.received] == ["POST", "POST"], "the first, then one refresh"
    assert not any(r["path"].endswith("smart-configuration") for r in fhir.requests())
