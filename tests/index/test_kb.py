from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ebmrag.errors import KnowledgeBaseError
from ebmrag.index import store
from ebmrag.index.kb import KnowledgeBase, index_text
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.index.sync import ingest_paths
from ebmrag.index.types import Filters
from ebmrag.ingest.documents import Document
from tests.engines import rrf_retriever

pytestmark = pytest.mark.model

GUIDES = {
    "sepsis": "Start broad-spectrum antibiotics within one hour of recognising septic shock. "
              "Give 30 mL/kg of crystalloid for hypotension or a lactate of 4 mmol/L or more.",
    "penicillin": "A history of anaphylaxis to penicillin contraindicates all penicillins. "
                  "Cephalosporins with dissimilar side chains may be used after specialist review.",
    "aki": "Acute kidney injury is a rise in serum creatinine of 0.3 mg/dL within 48 hours. "
           "Stop nephrotoxic drugs and metformin; review contrast exposure.",
}


def doc(doc_id: str, text: str, **extra: str) -> Document:
    return Document(doc_id, text, extra.pop("source", "guides"), "txt", title=doc_id, **extra)  # type: ignore[arg-type]


def chunk_rows(kb: KnowledgeBase) -> list[store.ChunkRow]:
    return list(kb.reader().iter_chunks())


def test_ingest_is_idempotent_and_updates_replace_chunks(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    first = kb.apply([doc(k, v) for k, v in GUIDES.items()])
    assert (first.added, first.generation) == (list(GUIDES), 1)
    again = kb.apply([doc(k, v) for k, v in GUIDES.items()])
    assert not again.changed and again.generation == 1 and sorted(again.unchanged) == sorted(GUIDES)
    assert sorted(p.name for p in (tmp_path / "kb").glob("gen-*")) == ["gen-000001"]

    superseded = kb.reader()
    edited = kb.apply([doc("aki", "Contrast nephropathy: hydrate with isotonic saline before the scan.")])
    assert edited.updated == ["aki"] and edited.generation == 2
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        superseded.segments[0].db.execute("SELECT 1")  # the old generation's connections were released
    rows = chunk_rows(kb)
    assert len({r.row for r in rows}) == len(rows) and len({r.chunk_id for r in rows}) == len(rows)
    assert not any("metformin" in r.text for r in rows)
    assert [s.entry.name for s in kb.reader().segments] == ["seg-000001", "seg-000002"]  # the write added one
    hits = rrf_retriever(kb).run("saline hydration before contrast", k=1)
    assert hits[0].doc_id == "aki" and "isotonic saline" in hits[0].text
    assert sorted(p.name for p in (tmp_path / "kb").glob("gen-*")) == ["gen-000002"]


def test_delete_leaves_no_chunk_vector_or_posting(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    kb.apply([doc(k, v) for k, v in GUIDES.items()])
    report = kb.apply([], ["penicillin", "not-there"])
    assert report.deleted == ["penicillin"]
    assert [e.where for e in report.errors] == ["not-there"]
    reader = kb.reader()
    rows = chunk_rows(kb)
    assert {r.doc_id for r in rows} == {"sepsis", "aki"} and reader.live_chunks == len(rows)
    assert reader.lexical.search(kb.analyzer.terms("anaphylaxis cephalosporins"), 10)[0].size == 0
    assert reader.dense.search(kb.embedder.embed(["penicillin anaphylaxis"])[0], 10)[0].size == len(rows)
    documents = reader.documents()
    assert set(documents) == {"sepsis", "aki"} and reader.document("penicillin") is None
    expected = kb.embedder.embed([index_text(documents[r.doc_id].title, r.section, r.text, True) for r in rows])
    assert np.allclose(reader.dense.vectors_at([r.row for r in rows]), expected, atol=1e-5)
    assert all(h.doc_id != "penicillin" for h in rrf_retriever(kb).run("penicillin anaphylaxis", k=10))
    compacted = kb.compact()
    assert compacted.segments_merged == 1 and kb.reader().size == len(rows)  # compaction drops deleted rows


def test_filters_restrict_every_route(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    kb.apply([doc("old", GUIDES["sepsis"], date="2015-02-01", authority="textbook"),
              doc("new", GUIDES["sepsis"].replace("one hour", "the first hour"), date="2024-06-01",
                  authority="guideline", source="ssc")])
    for mode in ("bm25", "dense", "hybrid"):
        retriever = rrf_retriever(kb, mode)
        guideline = Filters(authority="guideline")
        assert {h.doc_id for h in retriever.run("antibiotics septic shock", 5, guideline)} == {"new"}
        assert {h.doc_id for h in retriever.run("antibiotics septic shock", 5, Filters(date_to="2016"))} == {"old"}
        assert {h.doc_id for h in retriever.run("antibiotics septic shock", 5, Filters(source="ssc"))} == {"new"}
    with pytest.raises(ValueError, match="query is empty"):
        rrf_retriever(kb).run("   ")


def test_sync_removes_documents_of_vanished_files_only(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "guides"
    folder.mkdir()
    for name, text in GUIDES.items():
        (folder / f"{name}.md").write_text(f"# {name}\n\n{text}\n", encoding="utf-8")
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    assert len(ingest_paths(kb, [folder]).added) == 3
    (folder / "sepsis.md").unlink()
    (folder / "aki.md").write_bytes(b"\xff broken")  # unreadable this time: must not be deleted
    report = ingest_paths(kb, [folder], sync=True)
    assert report.deleted == ["guides/sepsis.md"]
    assert "guides/aki.md" in kb.reader().documents()
    stats = kb.stats()
    assert (stats.documents, stats.generation, stats.by_source_type) == (2, 2, {"markdown": 2})


def test_a_second_writer_is_refused_and_configs_must_match(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    from ebmrag.index.generations import writer_lock

    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    kb.apply([doc("sepsis", GUIDES["sepsis"])])
    with writer_lock(tmp_path / "kb"), pytest.raises(KnowledgeBaseError, match="another process"):
        kb.apply([doc("aki", GUIDES["aki"])])
    with pytest.raises(KnowledgeBaseError, match="cannot be opened with"):
        KnowledgeBase(tmp_path / "kb", KnowledgeBaseConfig(embedding_max_tokens=256), embedder=embedder)
    with pytest.raises(KnowledgeBaseError, match="not a knowledge base yet"):
        KnowledgeBase(tmp_path / "empty", embedder=embedder).reader()


@pytest.mark.integration
def test_queries_cannot_be_embedded_by_another_model_than_the_chunks(tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                    embedder) -> None:
    from ebmrag.models.adapters import save_delta
    from ebmrag.models.embeddings import SentenceEmbedder

    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    kb.apply([doc("sepsis", GUIDES["sepsis"])])
    delta = tmp_path / "other.npz"
    save_delta(delta, {"encoder.layer.0.output.dense": (np.zeros((1, 1536)), np.zeros((384, 1)))}, {})
    with pytest.raises(KnowledgeBaseError, match="was embedded with"):
        KnowledgeBase(tmp_path / "kb", embedder=SentenceEmbedder(delta)).reader()
    assert KnowledgeBase(tmp_path / "kb").reader().size == kb.reader().size  # its own settings open it


CRASHING_INGEST = textwrap.dedent("""
    import os, signal, sys
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.ingest.documents import Document
    stage, after, count = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    words = "patient presented with fever cough and a rising creatinine after contrast".split()
    docs = [Document(f"bulk-{i}", " ".join(words[(i + j) % len(words)] for j in range(160)) + f" case {i}.",
                     "bulk", "txt") for i in range(count)]

    def die_at(name, done, total):  # a deterministic crash point: no race with a timer
        if name == stage and done >= after:
            os.kill(os.getpid(), signal.SIGKILL)

    KnowledgeBase(sys.argv[1], cache_dir=sys.argv[2]).apply(docs, progress=die_at)
""")


@pytest.mark.integration
@pytest.mark.parametrize(("stage", "after", "documents"), [("documents", 64, 700), ("indexing", 0, 80)])
def test_kill_9_mid_ingest_keeps_the_last_generation(tmp_path: Path, embedder, stage: str,  # type: ignore[no-untyped-def]
                                                     after: int, documents: int) -> None:
    """The writer is killed (SIGKILL, from its own progress callback) after the first batch of documents was
    prepared (in worker processes: 700 documents, over MIN_DOCUMENTS_FOR_WORKERS) and embedded, or just before the
    new segment's indexes are written (80 documents: everything before that point is embedded, so fewer is faster
    and the crash point the same): the previous generation must keep serving."""
    root = tmp_path / "kb"
    kb = KnowledgeBase(root, embedder=embedder)
    kb.apply([doc(k, v) for k, v in GUIDES.items()])
    process = subprocess.run([sys.executable, "-c", CRASHING_INGEST, str(root), str(tmp_path / "cache"), stage,
                              str(after), str(documents)], timeout=300, check=False)
    assert process.returncode == -signal.SIGKILL, "the ingest must die at the crash point, not finish"
    assert (root / "segments" / "seg-000002.partial").exists(), "the crash happened mid-write"

    reopened = KnowledgeBase(root, embedder=embedder)
    assert reopened.reader().path.name == "gen-000001"
    assert rrf_retriever(reopened).run("penicillin anaphylaxis", k=1)[0].doc_id == "penicillin"

    extra = doc("extra", "Gout flares respond to colchicine.")
    rerun = reopened.apply([*(doc(k, v) for k, v in GUIDES.items()), extra])
    assert rerun.added == ["extra"] and rerun.generation == 2
    assert not list(root.rglob("*.partial"))
    rows = chunk_rows(reopened)
    assert len({r.chunk_id for r in rows}) == len(rows)
    assert {r.doc_id for r in rows} == {*GUIDES, "extra"}
    assert reopened.reader().live_chunks == len(rows)


def test_ids_are_unique_across_sources_and_stable_across_spellings(tmp_path: Path, embedder,  # type: ignore[no-untyped-def]
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18.3: orgB/guidelines silently replaced orgA/guidelines; naming the file directly added a copy."""
    for org, text in (("orgA", "Give antibiotics within one hour of sepsis recognition."),
                      ("orgB", "Measure lactate before the first antibiotic dose.")):
        (tmp_path / org / "guidelines").mkdir(parents=True)
        (tmp_path / org / "guidelines" / "sepsis.md").write_text(f"# Sepsis\n{text}\n")
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    assert ingest_paths(kb, [tmp_path / "orgA" / "guidelines"]).added == ["guidelines/sepsis.md"]
    monkeypatch.chdir(tmp_path / "orgA")
    for spelling in (Path("guidelines"), Path("./guidelines/"), Path("guidelines/sepsis.md")):
        again = ingest_paths(kb, [spelling])
        assert (again.added, again.updated, again.unchanged) == ([], [], ["guidelines/sepsis.md"]), spelling
    clash = ingest_paths(kb, [tmp_path / "orgB" / "guidelines"])
    assert not clash.changed and "already names" in str(clash.errors[0])
    assert "one hour" in chunk_rows(kb)[0].text, "orgA's document is still there"
    both = ingest_paths(kb, [tmp_path / "orgB" / "guidelines"], source="orgB")
    assert both.added == ["orgB/sepsis.md"] and len(chunk_rows(kb)) == 2
