"""Ingestion on a local multi-node Ray cluster (every node on 127.0.0.1) equals ingestion on this machine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ebmrag.demo import DEMO_CORPUS
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.sync import ingest_paths

pytestmark = pytest.mark.model
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: every node binds 127.0.0.1
ray = pytest.importorskip("ray", reason="the 'ray' extra is part of `make setup`")

WORDS = "fever cough creatinine penicillin sepsis lactate kidney warfarin insulin asthma stroke opioid".split()


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Two Ray nodes of one CPU each, both bound to 127.0.0.1."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                          "include_dashboard": False})
    nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    try:
        yield str(nodes.address)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        nodes.shutdown()


NOTES = 60


def corpus(root: Path) -> Path:
    """The bundled guidelines (one JSONL file) plus NOTES generated notes, a few of two chunks: more than one batch
    (prepare.BATCH_DOCUMENTS), so both nodes' actors embed; embedding is most of the test's time (issue 44)."""
    folder = root / "corpus"
    folder.mkdir()
    (folder / "guidelines.jsonl").write_bytes(Path(DEMO_CORPUS).read_bytes())
    rng = np.random.default_rng(3)
    for i in range(NOTES):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(20, 300))))
        (folder / f"note-{i:03d}.txt").write_text(f"Note {i}. {text}.\n", encoding="utf-8")
    (folder / "broken.pdf").write_bytes(b"not a pdf")  # a read error must come back as one, from the cluster
    return folder


@pytest.mark.slow
def test_ray_ingest_equals_local_ingest(cluster: str, tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    from ebmrag.index.distributed import RayPipeline

    folder = corpus(tmp_path)
    local = KnowledgeBase(tmp_path / "local", embedder=embedder)
    distributed = KnowledgeBase(tmp_path / "ray", embedder=embedder)
    expected = ingest_paths(local, [folder])
    pipeline = RayPipeline(cluster, distributed.config, tmp_path / "cache", actors=2)
    try:
        report = ingest_paths(distributed, [folder], cluster=pipeline)
        assert len({node["NodeID"] for node in ray.nodes() if node["Alive"]}) == 2
    finally:
        pipeline.close()
    assert sorted(report.added) == sorted(expected.added) and len(report.added) >= NOTES + 5
    assert [e.where for e in report.errors] == [e.where for e in expected.errors] and report.errors
    assert report.chunks_written == expected.chunks_written and report.generation == 1  # one committed generation
    ours, theirs = distributed.reader(), local.reader()
    chunks = {c.chunk_id: c for c in ours.iter_chunks()}
    reference = {c.chunk_id: c for c in theirs.iter_chunks()}
    assert chunks.keys() == reference.keys() and all(chunks[k].text == reference[k].text for k in chunks)
    ids = sorted(chunks)
    vectors = ours.dense.vectors_at([chunks[i].row for i in ids])
    assert np.allclose(vectors, theirs.dense.vectors_at([reference[i].row for i in ids]), atol=2e-2)
    terms = distributed.analyzer.terms("penicillin allergy creatinine")
    assert np.allclose(np.sort(ours.lexical.scores(terms)), np.sort(theirs.lexical.scores(terms)), atol=1e-6)


@pytest.mark.slow
def test_ray_ingest_writes_batched_upserts_to_milvus(cluster: str, tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    """The same pipeline feeding the Milvus backend: every document arrives once, searchable."""
    pytest.importorskip("pymilvus")
    from ebmrag.index.distributed import RayPipeline
    from ebmrag.index.milvus import MilvusKnowledgeBase
    from tests.engines import rrf_retriever
    from tests.index.test_milvus import free_port, start_milvus, stop

    folder = corpus(tmp_path)
    port = free_port()
    server = start_milvus(tmp_path / "milvus", port)
    try:
        milvus = MilvusKnowledgeBase(f"http://127.0.0.1:{port}", "ray", embedder=embedder)
        pipeline = RayPipeline(cluster, milvus.config, tmp_path / "cache", actors=2)
        try:
            report = ingest_paths(milvus, [folder], cluster=pipeline)
        finally:
            pipeline.close()
        assert len(report.added) >= NOTES + 5 and report.chunks_total == report.chunks_written
        documents = milvus.reader().documents()
        assert len(documents) == len(report.added)
        assert rrf_retriever(milvus).run("penicillin allergy", k=1)[0].doc_id in documents
    finally:
        stop(server)
