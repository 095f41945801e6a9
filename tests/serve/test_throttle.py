"""Issue 43: throttling and audit that cannot be turned against the service.

The client's address behind trusted proxies only (serve.clients), failed credentials throttled per address and per
credential without ever refusing a valid one (serve.throttle, serve.guard, the /ui sign-in, CDS Hooks in
test_cds_routes.py), throttled refusals audited by the burst, and ids bounded and compared whole. The counting
parts are checked on their own with a hand-turned clock; everything else against a real `ebmrag serve` on uvicorn
(the options `ebmrag serve` runs it with) over SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest

from ebmrag.config import ServeSettings, Settings, settings_from_dict, settings_to_dict
from ebmrag.errors import ConfigError
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.serve.app import create_app
from ebmrag.serve.clients import ClientAddresses
from ebmrag.serve.guard import MAX_ID_CHARS
from ebmrag.serve.throttle import FAILED_BURST, FailedCredentials, ThrottledAudit, address_block, key_credential
from ebmrag.store import audit
from ebmrag.store.access import create_key
from ebmrag.store.charts import IDEMPOTENCY_SCHEME, IdempotencyConflictError
from ebmrag.store.patients import PatientStore
from tests.serve.conftest import serving
from tests.serve.test_service import RECORD, problem

GUESS = "ebm_000000000000_" + "x" * 43  # well formed, no such key
SUMMARY = re.compile(r": (\d+) more from (.+) between (\S+) and (\S+)$")


class Clock:
    """A clock the test turns by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scope(peer: str | None, *headers: tuple[str, str]) -> dict[str, Any]:
    return {"type": "http", "client": (peer, 50_000) if peer else None,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers]}


# ------------------------------------------------------------------------------------------ forwarded headers
def test_forwarded_headers_are_read_only_from_a_trusted_proxy() -> None:
    untrusting = ClientAddresses()
    rotated = [untrusting.of(scope("127.0.0.1", ("X-Forwarded-For", f"198.51.100.{n}"),
                                   ("Forwarded", f"for=198.51.100.{n}"), ("X-Real-IP", f"198.51.100.{n}")))
               for n in range(5)]
    assert set(rotated) == {"127.0.0.1"}, "no trusted proxy: the peer is the client, whatever the headers say"
    behind = ClientAddresses(("10.0.0.0/8",))
    assert behind.of(scope("203.0.113.9", ("X-Forwarded-For", "198.51.100.7"))) == "203.0.113.9", "not a proxy"
    assert behind.of(scope("10.1.2.3", ("X-Forwarded-For", "198.51.100.7"))) == "198.51.100.7"


def test_the_client_is_the_right_most_address_that_is_not_a_trusted_proxy() -> None:
    proxies = ClientAddresses(("10.0.0.0/8", "2001:db8:ffff::/48"))
    chain = ("X-Forwarded-For", "6.6.6.6, 198.51.100.7, 10.0.0.2")  # the client wrote 6.6.6.6 itself
    assert proxies.of(scope("10.0.0.1", chain)) == "198.51.100.7"
    two_lines = scope("10.0.0.1", ("X-Forwarded-For", "6.6.6.6"), ("X-Forwarded-For", "198.51.100.7:4711"))
    assert proxies.of(two_lines) == "198.51.100.7", "header lines joined in order; a port is not the address"
    assert proxies.of(scope("10.0.0.1", ("X-Forwarded-For", "10.0.0.9, 10.0.0.2"))) == "10.0.0.9", "all proxies"
    assert proxies.of(scope("10.0.0.1", ("X-Forwarded-For", "6.6.6.6, unknown"))) == "10.0.0.1", \
        "a hop that is no address ends the walk at the proxy that wrote it"
    assert proxies.of(scope("10.0.0.1")) == "10.0.0.1", "a proxy's own request"
    assert proxies.of(scope("::ffff:10.0.0.1", ("X-Forwarded-For", "[2001:db8::5]:443"))) == "2001:db8::5"
    assert proxies.of(scope(None)) == "unknown"


def test_only_the_configured_header_is_read_and_rfc_7239_is_parsed() -> None:
    """A proxy that appends to X-Forwarded-For passes the client's own Forwarded header on: reading it would let
    the client choose its address."""
    xff = ClientAddresses(("10.0.0.0/8",))
    assert xff.of(scope("10.0.0.1", ("Forwarded", "for=6.6.6.6"), ("X-Forwarded-For", "198.51.100.7"))) == \
        "198.51.100.7"
    forwarded = ClientAddresses(("10.0.0.0/8",), "forwarded")
    header = ('for="6.6.6.6;x,y", for=198.51.100.7;proto=https;by=10.0.0.2, '
              'For="[2001:db8:cafe::17]:4711";host="a,b", for=10.0.0.3')
    assert forwarded.of(scope("10.0.0.1", ("Forwarded", header), ("X-Forwarded-For", "6.6.6.6"))) == \
        "2001:db8:cafe::17"
    assert forwarded.of(scope("10.0.0.1", ("Forwarded", "for=_hidden, by=10.0.0.2"))) == "10.0.0.1", \
        "an obfuscated or missing for= ends the walk"
    real_ip = ClientAddresses(("10.0.0.0/8",), "x-real-ip")
    assert real_ip.of(scope("10.0.0.1", ("X-Real-IP", "198.51.100.7"), ("X-Forwarded-For", "6.6.6.6"))) == \
        "198.51.100.7"


def test_trusted_proxies_are_checked_when_the_settings_load() -> None:
    loaded = settings_from_dict({"serve": {"trusted_proxies": ["10.0.0.0/8", "2001:db8::1"],
                                           "forwarded_header": "forwarded"}})
    assert loaded.serve.trusted_proxies == ("10.0.0.0/8", "2001:db8::1/128")
    assert settings_from_dict(json.loads(json.dumps(settings_to_dict(loaded)))) == loaded, "a JSON round trip"
    for bad, named in ((["10.0.0.7/8"], "10.0.0.7/8"), (["proxy.internal"], "proxy.internal"), ([8], "8")):
        with pytest.raises(ConfigError, match=re.escape(named)):
            settings_from_dict({"serve": {"trusted_proxies": bad}})
    with pytest.raises(ConfigError, match="forwarded_header"):
        settings_from_dict({"serve": {"forwarded_header": "x-client-ip"}})
    assert ServeSettings().trusted_proxies == (), "default: no forwarded header is ever read"


# ------------------------------------------------------------------------------------------ failed credentials
def test_failures_are_counted_per_address_and_per_credential() -> None:
    clock = Clock()
    failed = FailedCredentials(clock=clock)
    assert [failed.failed("192.0.2.1") > 0 for _ in range(FAILED_BURST + 1)] == [False] * FAILED_BURST + [True]
    assert failed.failed("192.0.2.2") == 0, "another address has its own allowance"
    guessed = [failed.failed(f"198.51.100.{n}", "key:0123456789ab") > 0 for n in range(FAILED_BURST + 1)]
    assert guessed[-1] and not any(guessed[:-1]), "one key id failing from many addresses is throttled as such"
    clock.now += 2 / 0.5
    assert failed.failed("192.0.2.1") == 0, "the allowance comes back"
    assert address_block("2001:db8:1:2:aaaa::1") == address_block("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert key_credential("Bearer ebm_0123456789ab_secret") == "key:0123456789ab"
    assert key_credential("Bearer not-a-key") is None and key_credential(None) is None


def test_the_counts_are_bounded_in_memory() -> None:
    failed = FailedCredentials(capacity=100, clock=Clock())
    for n in range(1000):
        failed.failed(f"10.0.{n // 256}.{n % 256}", f"key:{n:012x}")
    assert len(failed._addresses._left) == 100 and len(failed._credentials._left) == 100


# ------------------------------------------------------------------------------------------ the audit of bursts
def test_a_burst_of_throttled_refusals_is_one_row_then_one_summary() -> None:
    clock, rows = Clock(), []
    wall = iter(f"2026-01-01T00:00:{n:02d}.000+00:00" for n in range(60))
    bursts = ThrottledAudit(rows.append, quiet=10, every=60, clock=clock, wall=lambda: next(wall))
    for n in range(50):
        bursts.refused(audit.AuditEntry("-", "-", "p1", "refused 429 /v1/x", f"r{n}"), "address 192.0.2.1")
        clock.now += 0.01
    assert [r.request_id for r in rows] == ["r0"], "the first is written at once, the rest counted"
    assert bursts.flush() == 0, "not quiet yet"
    clock.now += 10
    assert bursts.flush() == 1
    summary = rows[-1]
    found = SUMMARY.search(summary.action)
    assert found and found.group(1) == "49" and found.group(2) == "address 192.0.2.1", summary.action
    assert summary.action.startswith("refused 429 /v1/x") and summary.request_id == "r49" and not summary.patient
    assert bursts.flush(everything=True) == 0, "an ended burst is forgotten"


def test_a_long_burst_is_summarised_periodically_and_at_close() -> None:
    clock, rows = Clock(), []
    bursts = ThrottledAudit(rows.append, quiet=10, every=60, clock=clock)
    for _ in range(130):  # one a second for 130 s
        bursts.refused(audit.AuditEntry("k1", "t", "", "refused 429 /v1/y", "r"), "key k1")
        clock.now += 1
    counts = [int(SUMMARY.search(r.action).group(1)) for r in rows[1:]]  # type: ignore[union-attr]
    assert len(rows) == 3 and counts == [60, 60], [r.action for r in rows]
    bursts.close()
    assert sum(int(SUMMARY.search(r.action).group(1)) for r in rows[1:]) == 129  # type: ignore[union-attr]


def test_bursts_followed_at_once_are_bounded() -> None:
    clock, rows = Clock(), []
    bursts = ThrottledAudit(rows.append, capacity=10, clock=clock)
    for n in range(100):
        for _ in range(3):
            bursts.refused(audit.AuditEntry("-", "-", "", "refused 429 /v1/z", "r"), f"address 10.0.0.{n}")
    assert len(bursts._bursts) == 10
    assert len(rows) == 100 + 90, "every burst's first row, and the summaries of those forgotten"


# ------------------------------------------------------------------------------------------ a real server
@contextmanager
def guarded(store: PatientStore, **serve: Any) -> Iterator[tuple[str, Any]]:
    """A real server over `store` (no engine is built: nothing here asks or packs); stopped after, so what the
    service still counted for the audit is written."""
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, prepare_charts=False, **serve))
    with serving(create_app(store, settings)) as (url, app):
        yield url, app


def attempts(url: str, count: int, authorization: str, forwarded: Callable[[int], str] | None = None,
             path: str = "/v1/patients/p1/fragments") -> list[int]:
    with httpx.Client(base_url=url, timeout=30) as http:
        return [http.get(path, headers={"Authorization": authorization, **(
            {"X-Forwarded-For": forwarded(n)} if forwarded else {})}).status_code for n in range(count)]


def test_rotating_x_forwarded_for_from_loopback_is_still_throttled(store: PatientStore) -> None:
    """The measured bypass: uvicorn took X-Forwarded-For from 127.0.0.1 as the client; now the peer is the client
    unless it is a configured proxy."""
    with guarded(store) as (url, _):
        statuses = attempts(url, FAILED_BURST + 5, "Bearer ebm_guess", lambda n: f"198.51.100.{n}")
    assert statuses == [401] * FAILED_BURST + [429] * 5


def test_x_forwarded_for_is_trusted_only_from_a_configured_proxy(store: PatientStore) -> None:
    with guarded(store, trusted_proxies=("10.0.0.0/8",)) as (url, _):  # the test's peer is not a proxy
        assert attempts(url, FAILED_BURST + 1, "Bearer ebm_guess", lambda n: f"198.51.100.{n}")[-1] == 429
    with guarded(store, trusted_proxies=("127.0.0.1",)) as (url, _):
        rotated = attempts(url, FAILED_BURST + 5, "Bearer ebm_guess", lambda n: f"198.51.100.{n}")
        one_client = attempts(url, FAILED_BURST + 1, "Bearer ebm_guess", lambda n: "6.6.6.6, 198.51.100.200")
    assert set(rotated) == {401}, "each client behind the proxy has its own allowance"
    assert one_client[-1] == 429, "and the address the proxy saw is throttled, whatever the client prepended"


def test_a_valid_key_passes_from_a_throttled_address_and_under_a_throttled_key_id(store: PatientStore) -> None:
    key = create_key(store, "t", "service")[0]
    key_id = key.split("_")[1]
    with guarded(store) as (url, _):
        assert attempts(url, FAILED_BURST + 1, f"Bearer {GUESS}")[-1] == 429
        wrong_secret = f"Bearer ebm_{key_id}_{'B' * 43}"
        assert attempts(url, 3, wrong_secret)[-1] == 429, "a failure from the throttled address"
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            assert http.put("/v1/patients/p1", json=RECORD).status_code == 200
    with guarded(store, trusted_proxies=("127.0.0.1",)) as (url, _):  # many addresses, one key id
        assert attempts(url, FAILED_BURST + 1, wrong_secret, lambda n: f"198.51.100.{n}")[-1] == 429
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}",
                                                 "X-Forwarded-For": "198.51.100.250"}, timeout=30) as http:
            assert http.put("/v1/patients/p1", json=RECORD).status_code == 200


def test_a_burst_of_throttled_attempts_writes_two_audit_rows_with_the_count(store: PatientStore) -> None:
    bursts = 60
    with guarded(store, rate_per_second=0.01, rate_burst=1) as (url, _):
        statuses = attempts(url, FAILED_BURST + bursts, f"Bearer {GUESS}")
        key = create_key(store, "t", "clinician")[0]
        over_rate = attempts(url, 30, f"Bearer {key}", path="/v1/patients/p9/fragments")
    assert statuses.count(429) == bursts and over_rate.count(429) == 29
    rows = [str(r[5]) for r in store.audit_rows()]
    throttled = [a for a in rows if a.startswith("refused 429 /v1/patients/{pid}/fragments")]
    assert len(throttled) == 4, throttled  # the first and a summary, for the address and for the key
    counts = {m.group(2): int(m.group(1)) for m in map(SUMMARY.search, throttled) if m}
    assert counts == {"address 127.0.0.1": bursts - 1, f"key {key.split('_')[1]}": 28}, throttled
    assert sum(a.startswith("refused 401") for a in rows) == FAILED_BURST
    assert audit.verify(store).intact


def test_ids_over_200_characters_are_refused_never_cut(store: PatientStore) -> None:
    key = create_key(store, "t", "service")[0]
    with guarded(store) as (url, _), httpx.Client(base_url=url, timeout=30,
                                                   headers={"Authorization": f"Bearer {key}"}) as http:
        long_id = http.get("/healthz", headers={"X-Request-ID": "r" * (MAX_ID_CHARS + 1)})
        kept = http.get("/healthz", headers={"X-Request-ID": "r" * MAX_ID_CHARS}).headers["X-Request-ID"]
        with_text = http.get("/healthz", headers={"X-Request-ID": "Jane Doe 1957"}).headers["X-Request-ID"]
        http.put("/v1/patients/p1", json=RECORD)
        fragment = {"patient_id": "p1", "fragments": [{"id": "k1", "text": "Potassium 4.1 mmol/L."}]}
        other = {"patient_id": "p1", "fragments": [{"id": "k2", "text": "Potassium 6.9 mmol/L."}]}
        over = http.post("/v1/patients/p1/fragments", json=fragment,
                         headers={"Idempotency-Key": "i" * (MAX_ID_CHARS + 1)})
        shared = "i" * (MAX_ID_CHARS - 1)
        first = http.post("/v1/patients/p1/fragments", json=fragment, headers={"Idempotency-Key": shared + "a"})
        second = http.post("/v1/patients/p1/fragments", json=other, headers={"Idempotency-Key": shared + "b"})
        again = http.post("/v1/patients/p1/fragments", json=other, headers={"Idempotency-Key": shared + "b"})
    assert "X-Request-ID header" in problem(long_id, 400, "invalid-request-id")["detail"]
    assert kept.startswith("r" * MAX_ID_CHARS + ".") and re.fullmatch(r"[0-9a-f]{32}", with_text)
    assert "Idempotency-Key header" in problem(over, 400, "invalid-idempotency-key")["detail"]
    assert (first.json()["added"], second.json()["added"], again.json().get("replayed")) == (1, 1, True)
    stored = [str(r[0]) for r in sql(store, "SELECT idem_key FROM idempotency")]
    assert len(stored) == 2 and all(s.startswith(IDEMPOTENCY_SCHEME) and shared not in s for s in stored)


def test_keys_alike_in_their_first_200_characters_never_meet_in_the_store(store: PatientStore) -> None:
    """The store compares whole keys, however long (the 200-character bound is the HTTP layer's)."""
    prefix = "k" * 200
    one = {"patient": "p1", "added": 1}
    assert store.upsert_idempotent("t", "p1", prefix + "-one", _record("a"), lambda a, r: one) == one
    two = store.upsert_idempotent("t", "p1", prefix + "-two", _record("b"), lambda a, r: {"added": a})
    assert two == {"added": 1}, "not a replay, not a conflict"


def test_an_idempotency_row_from_before_digests_still_replays_and_is_rewritten(store: PatientStore) -> None:
    record = _record("a")
    first = store.upsert_idempotent("t", "p1", "seed", record, lambda a, r: {"added": a})
    sql(store, "UPDATE idempotency SET idem_key = ?", ("batch-7",))  # as a store before this change kept it
    replayed = store.upsert_idempotent("t", "p1", "batch-7", record, lambda a, r: {"added": -1})
    assert replayed == dict(first, replayed=True)
    assert [r[0] for r in sql(store, "SELECT idem_key FROM idempotency")] == [
        IDEMPOTENCY_SCHEME + hashlib.sha256(b"batch-7").hexdigest()]
    conflict = _record("b")
    with pytest.raises(IdempotencyConflictError):
        store.upsert_idempotent("t", "p1", "batch-7", conflict, lambda a, r: {"added": -1})


def _record(marker: str) -> PatientRecord:
    return PatientRecord("p1", (Fragment(f"f-{marker}", "p1", f"Sodium 14{len(marker)} mmol/L {marker}."),))


def sql(store: PatientStore, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with store.transaction() as cur:
        result = store._execute(cur, statement, params)
        return list(result.fetchall()) if result.description else []


def test_an_mcp_call_id_over_200_characters_is_a_json_rpc_error(store: PatientStore) -> None:
    """Measured: a 20,000-character JSON-RPC id was stored as the audit's request id. Now the call is refused
    with a JSON-RPC error naming the field, before any check or audit row."""
    pytest.importorskip("mcp", reason="the [mcp] extra is not installed")
    from ebmrag.compose import ServiceParts
    from ebmrag.serve.mcp import http_app
    from ebmrag.serve.service import Service

    key = create_key(store, "t", "clinician")[0]
    before = len(store.audit_rows())
    service = Service(store, Settings(), ServiceParts(Settings()))
    with serving(http_app(service)) as (url, _), httpx.Client(timeout=30, headers={
            "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}) as http:
        opened = http.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}})
        session = {"mcp-session-id": opened.headers.get("mcp-session-id", "")}
        http.post(f"{url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "patient_fragments",
                                                                      "arguments": {"patient_id": "p1"}}}
        refused = _rpc(http.post(f"{url}/mcp", json={**call, "id": "x" * 20_000}, headers=session))
        answered = _rpc(http.post(f"{url}/mcp", json={**call, "id": "y" * MAX_ID_CHARS}, headers=session))
    assert refused["error"]["code"] == -32600 and "JSON-RPC id" in refused["error"]["message"], refused
    assert "error" not in answered, "an id of 200 characters is a call like any other (here: a tool error, 404)"
    ids = [str(r[6]) for r in store.audit_rows()[before:]]
    assert ids and all(len(i) <= MAX_ID_CHARS + 17 and "x" * 100 not in i for i in ids), ids


def _rpc(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of an answer, sent as JSON or as one server-sent event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(response.json())
