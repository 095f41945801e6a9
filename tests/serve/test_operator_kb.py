"""The operator's knowledge base: `serve --kb DIR` ([serve] kb) answers from DIR and uploads land there; without
it the service answers from the bundled demo knowledge base and refuses changes (409), writing nothing into the
cache; a knowledge base the service cannot read stops it at start-up in one line. `ebmrag mcp` and the results
gateway take the same setting. A real server on 127.0.0.1, over SQLite and PostgreSQL (`store`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ebmrag.cli import app as cli
from ebmrag.config import Settings, with_overrides
from ebmrag.demo import demo_guidelines, load_patient
from ebmrag.errors import KnowledgeBaseError
from ebmrag.index import generations
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.reader import FORMAT_VERSION, MANIFEST
from ebmrag.ingest.documents import Document
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore, SQLiteStore
from tests.serve.conftest import Live, free_port, serving

pytestmark = pytest.mark.model
QUESTION = "Which antibiotic is safe for his wound infection, given his penicillin allergy?"
WARD_DOCS = [
    Document("ward-ssi-protocol", "A surgical site infection after colectomy in a patient with penicillin "
             "anaphylaxis is treated with vancomycin and metronidazole; avoid all penicillins and cephalosporins "
             "until an allergist has reviewed the reaction.", "ward", "txt",
             title="Ward protocol: wound infection after colectomy with penicillin allergy", authority="guideline"),
    Document("ward-night-round", "The night round reviews every drain and wound dressing at 22:00.", "ward", "txt",
             title="Ward protocol: night round"),
]
WARD_IDS = {d.doc_id for d in WARD_DOCS}
UPLOAD = {"documents": [{"doc_id": "ward-zorbafen", "title": "Zorbafen dosing",
                         "text": "Zorbafen is given at half dose when creatinine clearance is below 30 mL/min."}]}


@pytest.fixture(scope="module")
def ward_kb_built(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Path:
    root = tmp_path_factory.mktemp("ward") / "kb"
    KnowledgeBase(root, embedder=embedder).apply(WARD_DOCS)
    return root


@pytest.fixture
def ward_kb(ward_kb_built: Path, tmp_path: Path) -> Path:
    """A copy of the operator's knowledge base for this test (uploads change it)."""
    return Path(shutil.copytree(ward_kb_built, tmp_path / "ward-kb"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache directory of every server here: the demo knowledge base must never be built in it."""
    return tmp_path_factory.mktemp("cache")


def settings_for(cache: Path, kb: Path | None = None, **serve: Any) -> Settings:
    return with_overrides(Settings(), models={"cache_dir": str(cache)},
                          serve={"kb": str(kb) if kb else None, "prepare_charts": False, **serve})


def serve_live(store: PatientStore, settings: Settings) -> Any:
    """A real server whose service builds its engine and knowledge base from `settings`, as `ebmrag serve` does."""
    return serving(create_app(store, settings))


def test_serve_with_kb_answers_from_it_and_uploads_land_in_it(store: PatientStore, ward_kb: Path,
                                                              cache: Path) -> None:
    demo = load_patient("demo-colon")
    store.put_record("ward", "p1", replace(demo, patient_id="p1",
                                           fragments=tuple(replace(f, patient_id="p1") for f in demo.fragments)))
    with serve_live(store, settings_for(cache, ward_kb)) as (url, app):
        live = Live(url, store, app)
        with live.client(live.key("ward", "clinician")) as clinician:
            asked = clinician.post("/v1/patients/p1/ask", json={"question": QUESTION, "retrieval": "always"})
        with live.client(live.key("ebmrag", "admin")) as admin:
            uploaded = admin.post("/v1/kb/documents", json=UPLOAD)
            found = admin.post("/v1/search", json={"query": "zorbafen creatinine clearance", "k": 1, "mode": "bm25"})
    assert asked.status_code == 200, asked.text
    answer = asked.json()
    retrieved = [d["doc_id"] for d in answer["trace"]["retrieved"]]
    assert "ward-ssi-protocol" in retrieved and set(retrieved) <= WARD_IDS, retrieved
    evidence = [c["id"] for c in answer["citations"] if c["kind"] == "evidence"]
    assert evidence and all(c.startswith("ward-") for c in evidence), answer["citations"]
    assert uploaded.status_code == 200 and uploaded.json()["added"] == ["ward-zorbafen"]
    assert found.json()[0]["doc_id"] == "ward-zorbafen"
    on_disk = KnowledgeBase(ward_kb)  # a fresh open of the directory: the upload is a new generation in it
    assert set(on_disk.reader().documents()) == WARD_IDS | {"ward-zorbafen"}
    assert generations.generation_number(generations.current_generation(ward_kb)) == 2
    assert not list(cache.glob("demo-kb-*")), "no demo knowledge base was built or written"


def test_changes_are_refused_without_an_operator_kb(store: PatientStore, cache: Path) -> None:
    with serve_live(store, settings_for(cache)) as (url, app):
        live = Live(url, store, app)
        with live.client(live.key("ebmrag", "admin")) as admin:
            refused = [admin.post("/v1/kb/documents", json=UPLOAD), admin.delete("/v1/kb/documents/cap-treatment")]
    for answer in refused:
        assert answer.status_code == 409 and answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["type"].endswith("/no-knowledge-base") and "start serve with --kb DIR" in problem["detail"]
    assert [row[5] for row in store.audit_rows()][-2:] == ["refused 409 /v1/kb/documents",
                                                           "refused 409 /v1/kb/documents/{doc_id}"]
    assert not list(cache.glob("demo-kb-*")), "a refused change builds and writes nothing"


def test_the_demo_kb_answers_when_no_kb_is_given(store: PatientStore, tmp_path: Path) -> None:
    """Without --kb the service still answers from the bundled corpus (built in its cache directory)."""
    with serve_live(store, settings_for(tmp_path / "cache")) as (url, app):
        live = Live(url, store, app)
        with live.client(live.key("ebmrag", "admin")) as admin:
            hits = admin.post("/v1/search", json={"query": "penicillin allergy cephalosporin", "k": 3}).json()
    assert {h["doc_id"] for h in hits} <= {g["id"] for g in demo_guidelines()} and hits
    assert len(list((tmp_path / "cache").glob("demo-kb-*-onnx"))) == 1


def rewrite_format(root: Path, value: Any) -> Path:
    manifest = generations.current_generation(root) / MANIFEST  # type: ignore[operator]
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": value}))
    return root


@pytest.mark.parametrize(("value", "says"), [(FORMAT_VERSION + 1, "upgrade ebmrag"),
                                             (1, "convert it once with `ebmrag kb compact --kb")])
def test_a_kb_the_service_cannot_read_stops_it_at_start_up(store: PatientStore, ward_kb: Path, cache: Path,
                                                           value: int, says: str) -> None:
    rewrite_format(ward_kb, value)
    with pytest.raises(KnowledgeBaseError, match=says):
        create_app(store, settings_for(cache, ward_kb))


def one_line(result: Any, says: str) -> None:
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_the_commands_take_kb_from_the_flag_over_the_file(tmp_path: Path, ward_kb: Path) -> None:
    """serve, mcp and `gateway run --prepare` check the knowledge base before serving: [serve] kb from the TOML
    file, --kb over it; a newer format is one line and exit 2, never a fresh knowledge base."""
    from_file, from_flag = tmp_path / "from-file", tmp_path / "from-flag"
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n[serve]\nkb = "{from_file}"\n')
    data = ["--data-dir", str(tmp_path / "data"), "--config", str(config)]
    commands = {"serve": ["serve", *data], "mcp": ["mcp", *data, "--transport", "http"],
                "gateway": ["gateway", "run", *data, "--broker", "redis://127.0.0.1:1/0", "--prepare"]}
    runner = CliRunner()
    for name, command in commands.items():
        one_line(runner.invoke(cli, command), f"{from_file} holds no knowledge base yet")
        one_line(runner.invoke(cli, [*command, "--kb", str(from_flag)]), f"{from_flag} holds no knowledge base yet")
        newer = rewrite_format(Path(shutil.copytree(ward_kb, tmp_path / f"newer-{name}")), FORMAT_VERSION + 1)
        one_line(runner.invoke(cli, [*command, "--kb", str(newer)]), "upgrade ebmrag")
    assert not from_file.exists() and not from_flag.exists()


def test_mcp_searches_the_operators_kb(tmp_path: Path, ward_kb: Path, cache: Path) -> None:
    """`ebmrag mcp --kb DIR` (the real command over stdio): its search tool answers from DIR."""
    pytest.importorskip("mcp", reason="the [mcp] extra is not installed")
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    key = create_key(SQLiteStore(tmp_path / "store.sqlite"), "t1", "clinician")[0]
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{cache}"\n')
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "ebmrag", "mcp", "--data-dir", str(tmp_path), "--kb", str(ward_kb), "--config", str(config)],
        env={**os.environ, "EBMRAG_API_KEY": key})

    async def search() -> Any:
        with (tmp_path / "mcp.log").open("w") as errlog:  # a real file: the server's stderr needs a descriptor
            async with stdio_client(params, errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("search", {"query": "penicillin anaphylaxis wound infection", "k": 2})

    result = asyncio.run(asyncio.wait_for(search(), 120))
    hits = json.loads("".join(getattr(block, "text", "") for block in result.content))
    assert not result.is_error and hits[0]["doc_id"] == "ward-ssi-protocol"
    assert {h["doc_id"] for h in hits} <= WARD_IDS
    assert not list(cache.glob("demo-kb-*"))


def test_every_worker_process_serves_the_kb_given_on_the_command_line(tmp_path: Path, ward_kb: Path,
                                                                     cache: Path) -> None:
    """`ebmrag serve --workers 2 --kb DIR` (the real command): the workers, started by uvicorn, take --kb too."""
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{cache}"\n[serve]\nprepare_charts = false\n')
    key = create_key(SQLiteStore(tmp_path / "store.sqlite"), "ebmrag", "admin")[0]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "ebmrag.cli", "serve", "--data-dir", str(tmp_path), "--port",
                               str(port), "--workers", "2", "--kb", str(ward_kb), "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                          timeout=60) as admin:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    admin.get("/healthz")
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            statuses = [admin.post("/v1/kb/documents", json={"documents": [
                {"doc_id": f"ward-upload-{i}", "text": f"Ward note {i}: check the drain."}]}).status_code
                for i in range(4)]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert statuses == [200] * 4
    assert {f"ward-upload-{i}" for i in range(4)} <= set(KnowledgeBase(ward_kb).reader().documents())
