"""`ebmrag mcp` driven by the `mcp` SDK's own client: over streamable HTTP against a real uvicorn server, and over
stdio against the real command in a subprocess. Keys, roles, tenants and patient scopes hold as on the HTTP API."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from ebmrag.answer.engine import Engine
from ebmrag.compose import Resources, ServiceParts
from ebmrag.config import Settings
from ebmrag.demo import load_patient
from ebmrag.records.fragment import PatientRecord
from ebmrag.serve.service import Service
from ebmrag.serve.throttle import FailedCredentials
from ebmrag.store import audit
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from tests.serve.conftest import demo_engine, serving

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from ebmrag.serve.mcp import http_app

pytestmark = pytest.mark.model
TOOLS = {"patient_fragments", "pack", "ask", "search", "ddx"}
QUESTION = "Which antibiotic is safe for his wound infection?"


def as_patient(record: PatientRecord, pid: str, marker: str = "") -> PatientRecord:
    return PatientRecord(pid, tuple(replace(f, patient_id=pid, text=f.text + marker) for f in record.fragments))


def seeded_store(path: Path) -> tuple[SQLiteStore, str]:
    """Tenant t1 holds p1 and p2, tenant t2 holds its own p1 (marked); the key sees t1's p1 only."""
    store, demo = SQLiteStore(path), load_patient("demo-colon")
    store.put_record("t1", "p1", as_patient(demo, "p1"))
    store.put_record("t1", "p2", as_patient(demo, "p2", " TENANT-ONE-P2"))
    store.put_record("t2", "p1", as_patient(demo, "p1", " TENANT-TWO"))
    return store, create_key(store, "t1", "clinician", ("p1",))[0]


@contextmanager
def running_mcp(tmp_path: Path, engine: tuple[Engine, Resources], settings: Settings,
                failed_keys: FailedCredentials | None = None) -> Iterator[tuple[str, SQLiteStore, str]]:
    """`engine`: an engine and the resources it was built from (`demo_engine`); `failed_keys`: the throttle of
    failed credentials in place of the service's (one on a test's clock)."""
    store, key = seeded_store(tmp_path / "store.sqlite")
    service = Service(store, settings, ServiceParts(settings, engine[1], engine[0]))
    if failed_keys is not None:
        service.failed_keys = failed_keys
    with serving(http_app(service)) as (url, _):
        yield f"{url}/mcp", store, key


@pytest.fixture
def mcp_url(tmp_path: Path, resources: Resources, context_packer: Any,
            demo_voter: Any) -> Iterator[tuple[str, SQLiteStore, str]]:
    with running_mcp(tmp_path, demo_engine(resources, context_packer, demo_voter), Settings()) as running:
        yield running


def test_calls_beyond_the_keys_rate_are_refused(tmp_path: Path, resources: Resources, context_packer: Any,
                                                demo_voter: Any) -> None:
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, rate_per_second=0.01, rate_burst=2))
    with running_mcp(tmp_path, demo_engine(resources, context_packer, demo_voter), settings) as (url, store, key):
        _, results = asyncio.run(http_calls(url, key, [("patient_fragments", {"patient_id": "p1"})] * 3))
    assert [r.is_error for r in results] == [False, False, True] and "429" in text(results[2])
    refused = [(r[3], r[4], r[5]) for r in store.audit_rows() if r[5].startswith("refused")]
    assert refused == [("t1", "p1", "refused 429 mcp:patient_fragments")]


async def http_calls(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[set[str], list[Any]]:
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with (client, streamable_http_client(url, http_client=client) as (read, write, *_),
                ClientSession(read, write) as session):
        await session.initialize()
        listed = await session.list_tools()
        names = {t.name for t in listed.tools}
        assert all(t.input_schema.get("type") == "object" and t.input_schema.get("properties") for t in listed.tools)
        return names, [await session.call_tool(name, args) for name, args in calls]


def text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def test_http_tools_answer_within_the_keys_scope(mcp_url: tuple[str, SQLiteStore, str]) -> None:
    url, store, key = mcp_url
    names, (fragments, packed, asked, searched, ranked, other_patient, bad_window, missing) = asyncio.run(
        http_calls(url, key, [
            ("patient_fragments", {"patient_id": "p1"}),
            ("pack", {"patient_id": "p1", "question": QUESTION, "window": 300}),
            ("ask", {"patient_id": "p1", "question": QUESTION, "window": 900}),
            ("search", {"query": "penicillin allergy and cephalosporins", "k": 3}),
            ("ddx", {"findings": ["fever", "cough", "shortness of breath"]}),
            ("patient_fragments", {"patient_id": "p2"}),
            ("pack", {"patient_id": "p1", "question": QUESTION, "window": -5}),
            ("pack", {"patient_id": "p1"}),
        ]))
    assert names == TOOLS
    listed = json.loads(text(fragments))["fragments"]
    assert any(f["id"] == "admission-2026-03-08" and f["must_keep"] for f in listed)
    assert not any("TENANT-TWO" in f["text"] for f in listed)  # the same patient id in another tenant stays apart
    pack = json.loads(text(packed))
    assert {p["fragment_id"]: p["reason"] for p in pack["packed"]}["admission-2026-03-08"] == "allergy"
    answer = json.loads(text(asked))
    assert answer["answer"] and answer["citations"]
    assert "TENANT-TWO" not in text(asked) and "TENANT-ONE-P2" not in text(asked)
    hits = json.loads(text(searched))
    assert len(hits) == 3 and all(h["doc_id"] for h in hits)
    assert json.loads(text(ranked))["mapped"]
    for refused in (other_patient, bad_window, missing):
        assert refused.is_error
    assert "404" in text(other_patient) and "TENANT-ONE-P2" not in text(other_patient)
    assert "window" in text(bad_window)
    rows = store.audit_rows()
    assert {"mcp:read", "mcp:pack", "mcp:ask", "mcp:search"} <= {r[5] for r in rows} and audit.verify(store).intact
    assert {r[3] for r in rows} == {"t1"} and "p2" not in {r[4] for r in rows if not r[5].startswith("refused")}
    assert [(r[4], r[5]) for r in rows if r[5].startswith("refused")] == [("p2", "refused 404 mcp:patient_fragments")]


def test_http_refuses_a_request_without_a_valid_key(mcp_url: tuple[str, SQLiteStore, str]) -> None:
    url, _, _ = mcp_url
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"Authorization": "Bearer ebm_000000000000_notavalidsecretnotavalid"}):
        response = httpx.post(url, json=body, headers={**headers, "Accept": "application/json, text/event-stream"})
        assert response.status_code == 401 and response.headers["content-type"] == "application/problem+json"


def test_stdio_server_lists_and_calls_tools(tmp_path: Path) -> None:
    seeded_store(tmp_path / "store.sqlite")
    key = create_key(SQLiteStore(tmp_path / "store.sqlite"), "t1", "clinician", ("p1",))[0]
    params = StdioServerParameters(command=sys.executable, args=["-m", "ebmrag", "mcp", "--data-dir", str(tmp_path)],
                                   env={**os.environ, "EBMRAG_API_KEY": key})

    async def run() -> tuple[set[str], Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            return (names, await session.call_tool("patient_fragments", {"patient_id": "p1"}),
                    await session.call_tool("patient_fragments", {"patient_id": "p2"}))

    names, mine, not_mine = asyncio.run(asyncio.wait_for(run(), 120))
    assert names == TOOLS
    assert any(f["id"] == "admission-2026-03-08" for f in json.loads(text(mine))["fragments"])
    assert not_mine.is_error and "404" in text(not_mine)


def test_http_refusals_are_audited_throttled_and_bounded_like_the_http_api(
        tmp_path: Path, resources: Resources, context_packer: Any, demo_voter: Any) -> None:
    """The same guard as the HTTP API: a body over [serve] max_body_mb is refused while it streams, an expired
    key is refused and audited under its id, bad keys are throttled per address, and each refusal is audited.
    The throttle's clock stands still: its allowance comes back with time (tests/serve/test_throttle.py), which
    on a loaded machine let a 21st failure through as 401 (issue 44)."""
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, max_body_mb=0.05))
    still = FailedCredentials(clock=lambda: 0.0)
    with running_mcp(tmp_path, demo_engine(resources, context_packer, demo_voter), settings,
                     still) as (url, store, key):
        accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        chunks = (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "pad": "' + b"x" * 20_000 for _ in range(5))
        too_large = httpx.post(url, content=chunks, headers={**accept, "Authorization": f"Bearer {key}"})
        expired, gone = create_key(store, "t1", "clinician", (), datetime.now(UTC) - timedelta(days=1))
        expired_key = httpx.post(url, json={}, headers={**accept, "Authorization": f"Bearer {expired}"})
        lapsed = create_key(store, "t1", "clinician", (), datetime.now(UTC) + timedelta(seconds=0.5))[0]
        asyncio.run(asyncio.sleep(0.6))
        statuses = [httpx.post(url, json={}, headers={**accept, "Authorization": f"Bearer {bearer}"}).status_code
                    for bearer in [lapsed] + ["ebm_000000000000_notavalidsecretnotavalid"] * 21]
    assert too_large.status_code == 413 and too_large.json()["type"].endswith("/payload-too-large")
    assert expired_key.status_code == 401 and "expired on" in expired_key.json()["detail"] and statuses[0] == 401
    assert statuses[1:19] == [401] * 18 and set(statuses[19:]) == {429}, statuses
    refused = [(r[2], r[5]) for r in store.audit_rows() if r[5].startswith("refused")]
    lapsed_id = lapsed.split("_")[1]
    assert refused[:3] == [(key.split("_")[1], "refused 413 /mcp"), (gone.key_id, "refused 401 /mcp"),
                           (lapsed_id, "refused 401 /mcp")]
    assert refused[3:-1] == [("-", "refused 401 /mcp")] * 18 + [("-", "refused 429 /mcp")], refused
    assert refused[-1][1].startswith("refused 429 /mcp: 2 more from address 127.0.0.1 between "), \
        "the throttled attempts after the first, summarised when the server stopped"
    assert audit.verify(store).intact


def test_stdio_refusals_are_audited(tmp_path: Path) -> None:
    """No peer address to throttle over stdio, but every refused call is audited, under the key."""
    store, key = seeded_store(tmp_path / "store.sqlite")
    key_id = key.split("_")[1]
    params = StdioServerParameters(command=sys.executable, args=["-m", "ebmrag", "mcp", "--data-dir", str(tmp_path)],
                                   env={**os.environ, "EBMRAG_API_KEY": key})

    async def run() -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            hidden = await session.call_tool("patient_fragments", {"patient_id": "p2"})
            store.revoke(key_id)
            return hidden, await session.call_tool("pack", {"patient_id": "p1", "question": QUESTION})

    hidden, revoked = asyncio.run(asyncio.wait_for(run(), 120))
    assert hidden.is_error and "404" in text(hidden) and revoked.is_error and "401" in text(revoked)
    refused = [(r[2], r[3], r[4], r[5]) for r in store.audit_rows() if r[5].startswith("refused")]
    assert refused == [(key_id, "t1", "p2", "refused 404 mcp:patient_fragments"),
                       (key_id, "t1", "p1", "refused 401 mcp:pack")]
    assert audit.verify(store).intact
