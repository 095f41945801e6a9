"""Segments: writes add segments and deletions, scores equal a single build's, merges and crashes keep it whole."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ebmrag.index import merge
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.params import KnowledgeBaseConfig, StorageSettings
from ebmrag.index.prepare import prepare_batches
from ebmrag.index.segment import SegmentEntry
from ebmrag.index.types import Filters, SearchHit
from ebmrag.ingest.documents import Document
from tests.engines import rrf_retriever

pytestmark = pytest.mark.model

WORDS = ("fever cough creatinine penicillin anaphylaxis sepsis lactate antibiotic kidney contrast warfarin bleeding "
         "insulin glucose ketoacidosis asthma wheeze steroid fracture opioid nausea stroke thrombolysis").split()
QUERIES = ("penicillin anaphylaxis antibiotic", "creatinine contrast kidney", "warfarin bleeding",
           "insulin glucose ketoacidosis", "stroke thrombolysis fever")
CONFIG = KnowledgeBaseConfig(hnsw_min_rows=40, chunker="fixed")  # small segments get an HNSW graph too


def note(i: int, version: int = 0) -> Document:
    """A short document of varied length and term mix; `version` changes its text (an update)."""
    rng = np.random.default_rng(i * 31 + version)
    words = " ".join(rng.choice(WORDS, size=int(rng.integers(8, 40))))
    return Document(f"d{i:03d}", f"{words} note {i} v{version}.", "notes", "txt", title=f"note {i}",
                    authority="guideline" if i % 3 == 0 else "other")


def lexical_scores(kb: KnowledgeBase, query: str) -> dict[str, float]:
    """chunk id -> BM25 score of every live chunk (independent of how rows are split)."""
    reader = kb.reader()
    scores = reader.lexical.scores(kb.analyzer.terms(query))
    return {c.chunk_id: float(scores[c.row]) for c in reader.iter_chunks()}


def untied(hits: list[SearchHit]) -> list[str]:
    """The chunk ids of hits whose score no other hit shares (ties break by row, and rows differ by layout)."""
    scores = [round(h.score, 5) for h in hits]
    return [h.chunk_id for h, s in zip(hits, scores, strict=True) if scores.count(s) == 1]


def history(kb: KnowledgeBase) -> list[Document]:
    """Five writes (adds, updates, deletions) leaving a segmented KB; returns the final documents."""
    final = {i: note(i) for i in range(60)}
    kb.apply([final[i] for i in range(30)])
    kb.apply([final[i] for i in range(30, 60)])
    for i in range(0, 60, 7):
        final[i] = note(i, version=1)
    kb.apply([final[i] for i in range(0, 60, 7)])
    kb.apply([], [f"d{i:03d}" for i in range(5, 60, 11)])
    for i in range(5, 60, 11):
        del final[i]
    final[60] = note(60)
    kb.apply([final[60]])
    return list(final.values())


@pytest.fixture()
def segmented(tmp_path: Path, embedder) -> tuple[KnowledgeBase, list[Document]]:  # type: ignore[no-untyped-def]
    kb = KnowledgeBase(tmp_path / "kb", CONFIG, embedder=embedder, storage=StorageSettings(merge_factor=0))
    return kb, history(kb)


def test_scores_equal_a_single_build_of_the_live_documents(segmented, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                           embedder) -> None:
    kb, final = segmented
    reader = kb.reader()
    assert len(reader.segments) == 4 and reader.size > reader.live_chunks  # 4 writes added, 1 only deleted
    single = KnowledgeBase(tmp_path / "single", CONFIG, embedder=embedder)
    single.apply(final)
    assert kb.reader().documents().keys() == single.reader().documents().keys()
    for query in QUERIES:
        ours, theirs = lexical_scores(kb, query), lexical_scores(single, query)
        assert ours.keys() == theirs.keys()
        assert max(abs(ours[c] - theirs[c]) for c in ours) <= 1e-6 * max(1.0, max(theirs.values()))
        for mode in ("bm25", "dense", "hybrid"):  # depth 100 > 56 chunks: no route cut falls inside a tie
            got = rrf_retriever(kb, mode, route_depth=100).run(query, k=8)
            want = rrf_retriever(single, mode, route_depth=100).run(query, k=8)
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5), (mode, query)
            assert untied(got) == untied(want), (mode, query)  # rows differ, so only ties may swap


def test_deleted_and_replaced_rows_never_surface(segmented) -> None:  # type: ignore[no-untyped-def]
    kb, final = segmented
    live = {d.doc_id: d for d in final}
    for query in QUERIES:
        for mode in ("bm25", "dense", "hybrid"):
            for hit in rrf_retriever(kb, mode).run(query, k=20):
                assert hit.doc_id in live and hit.text in live[hit.doc_id].text, (mode, hit.chunk_id)
        guideline = rrf_retriever(kb, "dense").run(query, k=20, filters=Filters(authority="guideline"))
        assert guideline and all(live[h.doc_id].authority == "guideline" for h in guideline)


def test_compaction_keeps_every_score_and_drops_deleted_rows(segmented) -> None:  # type: ignore[no-untyped-def]
    kb, _ = segmented
    before = {q: lexical_scores(kb, q) for q in QUERIES}
    hybrid = {q: [h.chunk_id for h in rrf_retriever(kb).run(q, k=8)] for q in QUERIES}
    report = kb.compact()
    reader = kb.reader()
    assert report.segments_merged == 4 and len(reader.segments) == 1 and reader.size == reader.live_chunks
    assert len(list((kb.root / "segments").iterdir())) == 1  # merged-away segments were removed
    for query in QUERIES:
        assert lexical_scores(kb, query) == pytest.approx(before[query], abs=1e-6)
        assert [h.chunk_id for h in rrf_retriever(kb).run(query, k=8)] == hybrid[query]
    assert kb.compact().segments_merged == 0  # already compact: no new generation


def test_tiered_policy_merges_a_full_tier_and_bounds_the_count(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    entries = [SegmentEntry(f"seg-{i:06d}", rows, rows) for i, rows in enumerate((50_000, 400, 300, 900))]
    assert merge.plan(entries, 4) == []  # three in tier 0, one in a higher tier
    assert merge.plan([*entries, SegmentEntry("seg-000009", 10, 10)], 4) == [3, 1, 2, 4]  # largest first
    assert merge.plan([SegmentEntry("seg-000001", 5_000, 2_000)], 10) == [0]  # mostly deleted: rewritten
    kb = KnowledgeBase(tmp_path / "kb", CONFIG, embedder=embedder, storage=StorageSettings(merge_factor=3))
    counts, merged = [], 0
    for start in range(0, 50, 5):
        report = kb.apply([note(i) for i in range(start, start + 5)])
        counts.append(len(kb.reader().segments))
        merged += report.segments_merged
        assert report.chunks_total == kb.reader().live_chunks == start + 5
    assert max(counts) < 3 and merged == 3 * 4  # each time a third segment joins tier 0, it merges
    assert {h.doc_id for h in rrf_retriever(kb, "bm25").run("note 42", k=50)} >= {"d042"}


def test_parallel_preparation_equals_in_process_preparation() -> None:
    documents = [note(i) for i in range(300)]
    one = list(prepare_batches(documents, "fixed", True, workers=1))
    two = list(prepare_batches(documents, "fixed", True, workers=2))
    assert [b.chunks for b in one] == [b.chunks for b in two]
    assert [b.texts for b in one] == [b.texts for b in two]
    for a, b in zip(one, two, strict=True):
        assert a.counts.vocabulary == b.counts.vocabulary and np.array_equal(a.counts.tf, b.counts.tf)


@pytest.mark.slow
def test_a_large_write_is_split_into_segments_of_bounded_size(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    kb = KnowledgeBase(tmp_path / "kb", CONFIG, embedder=embedder,
                       storage=StorageSettings(segment_rows=100, merge_factor=0, workers=1))
    report = kb.apply([note(i) for i in range(300)])
    sizes = [s.rows for s in kb.reader().segments]
    assert len(sizes) == 3 and sum(sizes) == report.chunks_written == 300 and max(sizes) <= 100 + 64
    tail = KnowledgeBase(tmp_path / "tail", CONFIG, embedder=embedder,
                         storage=StorageSettings(segment_rows=100, merge_factor=0, workers=1))
    tail.apply([note(i) for i in range(150)])
    assert [s.rows for s in tail.reader().segments] == [150]  # 22 left after 128: no tail segment of its own


@pytest.mark.integration
def test_format_1_knowledge_base_is_refused_then_converted(segmented, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                           embedder) -> None:
    """A generation of the first on-disk format (kb.sqlite + vectors.npy in the generation folder) must open only
    through `compact`, which converts it without re-embedding."""
    kb, _ = segmented
    kb.compact()
    segment = kb.reader().segments[0].path
    old = tmp_path / "old"
    (old / "gen-000003").mkdir(parents=True)
    for name in ("kb.sqlite", "vectors.npy", "dense.hnsw"):
        shutil.copy2(segment / name, old / "gen-000003" / name)
    manifest = json.loads((kb.reader().path / "manifest.json").read_text())
    manifest.update(format=1, chunks=kb.reader().size)
    del manifest["segments"]
    (old / "gen-000003" / "manifest.json").write_text(json.dumps(manifest))
    (old / "CURRENT").write_text("gen-000003")
    with pytest.raises(Exception, match="kb compact"):
        KnowledgeBase(old, embedder=embedder).reader()
    converted = KnowledgeBase(old, embedder=embedder)
    assert converted.compact().generation == 4
    for query in QUERIES:
        assert lexical_scores(converted, query) == pytest.approx(lexical_scores(kb, query), abs=1e-6)


CRASHING_COMPACTION = textwrap.dedent("""
    import os, signal, sys
    from ebmrag.index.kb import KnowledgeBase

    def die(stage, done, total):
        if stage == "merging" and done >= 2:
            os.kill(os.getpid(), signal.SIGKILL)

    KnowledgeBase(sys.argv[1], cache_dir=sys.argv[2]).compact(progress=die)
""")


@pytest.mark.integration
def test_kill_9_mid_compaction_keeps_the_last_generation(segmented, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    kb, final = segmented
    before = {q: [h.chunk_id for h in rrf_retriever(kb).run(q, k=5)] for q in QUERIES}
    generation = kb.reader().path.name
    process = subprocess.run([sys.executable, "-c", CRASHING_COMPACTION, str(kb.root), str(tmp_path / "cache")],
                             timeout=300, check=False)
    assert process.returncode == -signal.SIGKILL
    assert list((kb.root / "segments").glob("*.partial")), "the crash happened mid-merge"
    assert kb.reader().path.name == generation and len(kb.reader().segments) == 4
    assert {q: [h.chunk_id for h in rrf_retriever(kb).run(q, k=5)] for q in QUERIES} == before
    kb.apply([note(70)])  # the next writer clears the leftovers
    assert not list(kb.root.rglob("*.partial"))
    assert kb.compact().segments_merged == 5 and kb.reader().live_chunks == len(final) + 1


def test_a_write_carries_loaded_indexes_over_to_the_next_reader(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    """Reloading a large graph after every nightly write would cost seconds: the new generation's reader
    shares the loaded indexes of segments it still names, with the new deletions marked."""
    kb = KnowledgeBase(tmp_path / "kb", CONFIG, embedder=embedder, storage=StorageSettings(merge_factor=0))
    kb.apply([note(i) for i in range(60)])
    dense = kb.reader().segments[0].dense
    assert dense.has_graph
    kb.apply([note(3, version=1)], ["d004"])
    reader = kb.reader()
    assert reader.segments[0].dense is dense and len(reader.segments) == 2
    query = embedder.embed([note(4).text])[0]
    found = reader.chunks_by_rows(reader.dense.search(query, 60)[0].tolist())
    texts = {c.doc_id: c.text for c in found.values()}
    assert "d004" not in texts and texts["d003"].endswith("v1.") and len(texts) == 59


def test_a_reader_keeps_the_chunk_rows_it_read_and_a_new_generation_reads_its_own(tmp_path: Path,
                                                                                    embedder,  # type: ignore[no-untyped-def]
                                                                                    monkeypatch: pytest.MonkeyPatch
                                                                                    ) -> None:
    """Issue 33: a follow-up ask's record sentences vote with mostly the same chunks; a reader reads each chunk
    row once (the generation never changes), and the next generation (a write) starts with nothing kept."""
    from ebmrag.index import reader as reader_module
    from ebmrag.index import store

    kb = KnowledgeBase(tmp_path / "kb", CONFIG, embedder=embedder, storage=StorageSettings(merge_factor=0))
    kb.apply([note(i) for i in range(20)])
    reader = kb.reader()
    rows = reader.dense.search(embedder.embed([note(4).text])[0], 10)[0].tolist()
    first = reader.chunks_by_rows(rows)
    monkeypatch.setattr(store, "chunks_by_rows", lambda *a: pytest.fail("read again"))
    assert reader.chunks_by_rows(rows) == first
    monkeypatch.undo()
    kb.apply([note(4, version=1)])
    fresh = kb.reader().chunks_by_rows(kb.reader().dense.search(embedder.embed([note(4).text])[0], 10)[0].tolist())
    assert any(c.text.endswith("v1.") for c in fresh.values())
    monkeypatch.setattr(reader_module, "ROW_CACHE", 3)
    small = kb.reader()
    small._rows.clear()
    small.chunks_by_rows(list(range(10)))
    assert len(small._rows) == 3
