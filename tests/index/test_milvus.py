"""The Milvus backend against a real Milvus API: Milvus Lite started as a server on 127.0.0.1 by these tests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebmrag.errors import KnowledgeBaseError
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.index.types import Filters
from ebmrag.ingest.documents import Document
from tests.engines import rrf_retriever

pytestmark = [pytest.mark.model, pytest.mark.integration]  # a Milvus server process
pymilvus = pytest.importorskip("pymilvus", reason="the 'milvus' extra is part of `make setup`")

GUIDES = {
    "sepsis": ("Start broad-spectrum antibiotics within one hour of recognising septic shock. Give 30 mL/kg of "
               "crystalloid for hypotension or a lactate of 4 mmol/L or more.", "guideline", "2021-10-01"),
    "penicillin": ("A history of anaphylaxis to penicillin contraindicates all penicillins. Cephalosporins with "
                   "dissimilar side chains may be used after specialist review.", "guideline", "2019-03-15"),
    "aki": ("Acute kidney injury is a rise in serum creatinine of 0.3 mg/dL within 48 hours. Stop nephrotoxic "
            "drugs and metformin; review contrast exposure.", "textbook", "2012-01-01"),
    "gout": ("Colchicine or an NSAID treats an acute gout flare; avoid NSAIDs when the eGFR is below 30.",
             "other", ""),
    "青霉素": ("青霉素过敏患者禁用青霉素类抗生素，头孢菌素需谨慎使用。", "guideline", "2020-05-01"),
}
QUERIES = ("penicillin anaphylaxis cephalosporin", "creatinine rise after contrast", "gout flare NSAID kidney",
           "antibiotics for septic shock", "青霉素过敏")


def documents(edit: str = "") -> list[Document]:
    return [Document(doc_id, text + (edit if doc_id == "aki" else ""), "guides", "txt", title=doc_id,
                     authority=authority, date=date) for doc_id, (text, authority, date) in GUIDES.items()]


def scored(kb, found) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """chunk id -> score of a route's (rows, scores)."""
    rows, scores = found
    chunks = kb.reader().chunks_by_rows(rows.tolist())
    return {chunks[r].chunk_id: float(s) for r, s in zip(rows.tolist(), scores.tolist(), strict=True)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_milvus(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """A Milvus Lite server bound to 127.0.0.1 (its default is every interface), answering when returned."""
    server = Path(sys.executable).with_name("milvus-lite")
    process = subprocess.Popen([str(server), "server", "--data-dir", str(data_dir), "--host", "127.0.0.1",
                                "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else "exited"
            time.sleep(0.2)
    process.kill()
    pytest.fail("Milvus Lite did not start within 60 s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def milvus_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    process = start_milvus(tmp_path_factory.mktemp("milvus"), port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@pytest.fixture()
def pair(milvus_uri: str, tmp_path: Path, embedder, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The same documents in Milvus and in the embedded backend."""
    from ebmrag.index.milvus import MilvusKnowledgeBase

    milvus = MilvusKnowledgeBase(milvus_uri, request.node.name, embedder=embedder)
    embedded = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    for kb in (milvus, embedded):
        report = kb.apply(documents())
        assert sorted(report.added) == sorted(GUIDES) and not report.errors
    return milvus, embedded


def test_bm25_and_rankings_equal_the_embedded_backend(pair) -> None:  # type: ignore[no-untyped-def]
    milvus, embedded = pair
    for query in QUERIES:
        terms = embedded.analyzer.terms(query)
        theirs, ours = (scored(kb, kb.reader().lexical.search(terms, 10)) for kb in (milvus, embedded))
        assert theirs.keys() == ours.keys() and all(abs(theirs[c] - ours[c]) < 1e-4 for c in ours), query
        for mode in ("bm25", "dense", "hybrid"):
            got = [(h.chunk_id, round(h.score, 4)) for h in rrf_retriever(milvus, mode).run(query, k=5)]
            want = [(h.chunk_id, round(h.score, 4)) for h in rrf_retriever(embedded, mode).run(query, k=5)]
            assert got == want, (mode, query)


def test_filters_upserts_and_deletes(pair) -> None:  # type: ignore[no-untyped-def]
    milvus, _ = pair
    retriever = rrf_retriever(milvus, "hybrid")
    assert {h.doc_id for h in retriever.run("antibiotics", 5, Filters(authority="textbook"))} == {"aki"}
    assert {h.doc_id for h in retriever.run("antibiotics", 5, Filters(date_from="2020", date_to="2021"))} == \
        {"sepsis", "青霉素"}
    again = milvus.apply(documents())
    assert not again.changed and sorted(again.unchanged) == sorted(GUIDES)  # by content hash
    edited = milvus.apply([d for d in documents(edit=" Hydrate with isotonic saline before contrast.")
                           if d.doc_id != "gout"], ["gout", "missing"])
    assert (edited.updated, edited.deleted, [e.where for e in edited.errors]) == (["aki"], ["gout"], ["missing"])
    reader = milvus.reader()
    assert set(reader.documents()) == set(GUIDES) - {"gout"} and reader.document("gout") is None
    aki = reader.chunks_of("aki")
    assert len(aki) == 1 and "isotonic saline" in aki[0].text  # the old version's chunk is gone
    assert all(h.doc_id != "gout" for h in retriever.run("gout flare colchicine", 10))
    assert reader.live_chunks == len(GUIDES) - 1 == milvus.stats().chunks


def test_settings_are_kept_and_checked(milvus_uri: str, embedder, pair) -> None:  # type: ignore[no-untyped-def]
    from ebmrag.index.milvus import MilvusKnowledgeBase

    milvus, _ = pair
    with pytest.raises(KnowledgeBaseError, match="cannot be opened with"):
        MilvusKnowledgeBase(milvus_uri, milvus.name, KnowledgeBaseConfig(embedding_max_tokens=256), embedder=embedder)
    with pytest.raises(KnowledgeBaseError, match="not a knowledge base yet"):
        MilvusKnowledgeBase(milvus_uri, "never-written", embedder=embedder).reader()
    with pytest.raises(KnowledgeBaseError, match=r"Milvus at http://127\.0\.0\.1:1: .*server unavailable"):
        MilvusKnowledgeBase("http://127.0.0.1:1", "x", embedder=embedder)


def test_ingest_search_and_ask_run_unchanged_on_milvus(milvus_uri: str, tmp_path: Path) -> None:
    """The CLI with `[kb] backend = "milvus"`: the same commands, nothing else to change."""
    from typer.testing import CliRunner

    from ebmrag.cli import app
    from ebmrag.demo import DEMO_CORPUS

    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[kb]\nbackend = "milvus"\nuri = "{milvus_uri}"\n[models]\ncache_dir = "{tmp_path}"\n')
    runner, kb = CliRunner(), str(tmp_path / "demo-guidelines")
    ingested = runner.invoke(app, ["ingest", str(DEMO_CORPUS), "--kb", kb, "--config", str(config)])
    assert ingested.exit_code == 0, ingested.output
    found = runner.invoke(app, ["search", "penicillin allergy", "--kb", kb, "--json", "--config", str(config)])
    assert found.exit_code == 0 and json.loads(found.output)[0]["doc_id"], found.output
    stats = json.loads(runner.invoke(app, ["kb", "stats", "--kb", kb, "--json", "--config", str(config)]).output)
    assert stats["documents"] >= 5 and stats["chunks"] >= 18
    asked = runner.invoke(app, ["ask", "Which antibiotic is safe given his penicillin allergy?", "--patient",
                                "demo-colon", "--kb", kb, "--window", "900", "--retrieval", "always", "--json",
                                "--config", str(config)])
    assert asked.exit_code == 0, asked.output
    assert json.loads(asked.output)["trace"]["retrieved"], "the answer drew on the Milvus knowledge base"


def test_a_knowledge_base_survives_a_server_restart(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    """After a restart Milvus holds its collections released; opening the knowledge base loads them."""
    from ebmrag.index.milvus import MilvusKnowledgeBase

    port = free_port()
    process = start_milvus(tmp_path / "data", port)
    try:
        MilvusKnowledgeBase(f"http://127.0.0.1:{port}", "restart", embedder=embedder).apply(documents())
    finally:
        stop(process)
    process = start_milvus(tmp_path / "data", port)
    try:
        reopened = MilvusKnowledgeBase(f"http://127.0.0.1:{port}", "restart", embedder=embedder)
        assert rrf_retriever(reopened).run("penicillin anaphylaxis", k=1)[0].doc_id == "penicillin"
    finally:
        stop(process)
