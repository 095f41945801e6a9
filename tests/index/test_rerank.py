from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ebmrag.errors import ModelUnavailableError
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.types import SearchHit
from ebmrag.ingest.documents import Document, DocumentBuilder
from ebmrag.models.adapters import NAMED_DELTAS, save_delta
from ebmrag.models.tokens import bundled_model_dir
from ebmrag.retrieve.rerank import CrossEncoderReranker, reranker_from_dict, shown_text
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.retrieve.vote import DocumentVoter
from tests.engines import rrf_params, rrf_retriever

pytestmark = pytest.mark.model

GUIDES = {
    "sepsis": ["Septic shock needs broad-spectrum antibiotics within one hour.",
               "Give 30 mL/kg crystalloid for hypotension or raised lactate in sepsis.",
               "Norepinephrine is the first vasopressor in septic shock."],
    "penicillin": ["Anaphylaxis to penicillin contraindicates all penicillins.",
                   "Cephalosporins with dissimilar side chains may follow specialist review."],
    "aki": ["Acute kidney injury is a creatinine rise of 0.3 mg/dL in 48 hours.",
            "Stop metformin and nephrotoxic drugs in acute kidney injury."],
}


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> KnowledgeBase:
    """One document per guide, one section per sentence: chunks are section-bounded, so one chunk each."""
    base = KnowledgeBase(tmp_path_factory.mktemp("kb") / "kb", embedder=embedder)
    base.apply([_guide(doc_id, parts) for doc_id, parts in GUIDES.items()])
    return base


def _guide(doc_id: str, parts: list[str]) -> Document:
    builder = DocumentBuilder()
    for number, part in enumerate(parts):
        builder.add(f"part {number}", part, f"{doc_id}_{number}")
    return Document(doc_id, builder.text, "guides", "jsonl", title=doc_id, sections=builder.sections)


class PreferWord:
    """A reranker written for this test: hits containing the word first, order otherwise kept."""

    def __init__(self, word: str) -> None:
        self.word = word

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        return sorted(hits, key=lambda h: self.word not in h.text.lower())

    def to_dict(self) -> dict[str, Any]:
        return {"type": "prefer-word", "word": self.word}


def test_retriever_applies_a_pluggable_reranker_to_the_route_depth(kb: KnowledgeBase) -> None:
    plain = rrf_retriever(kb).run("antibiotics for septic shock", k=1)
    reranked = rrf_retriever(kb, reranker=PreferWord("metformin")).run("antibiotics for septic shock", k=1)
    assert "metformin" not in plain[0].text.lower()
    assert "metformin" in reranked[0].text.lower()


def test_document_vote_counts_distinct_chunks_across_sentences(kb: KnowledgeBase) -> None:
    voter = DocumentVoter(rrf_retriever(kb, "bm25", vote_chunks=10, vote_documents=2, vote_min_score=0.5))
    sentences = ["Hypotension with a raised lactate.", "Which vasopressor in shock?", "Antibiotics within an hour.",
                 "Creatinine rose over 48 hours."]
    documents = voter.run(sentences)
    assert [d.doc_id for d in documents] == ["sepsis", "aki"]
    assert documents[0].votes == 3 and documents[1].votes == 1
    assert all(hit.doc_id == d.doc_id for d in documents for hit in d.chunks)
    assert len({hit.chunk_id for hit in documents[0].chunks}) == 3
    # the same sentence twice adds no vote: the merged chunk set is a union
    assert voter.run(sentences + sentences)[0].votes == 3


def test_document_vote_floor_drops_weak_chunks(kb: KnowledgeBase) -> None:
    strict = DocumentVoter(rrf_retriever(kb, "bm25", vote_chunks=10, vote_documents=3, vote_min_score=1.0))
    loose = DocumentVoter(rrf_retriever(kb, "bm25", vote_chunks=10, vote_documents=3, vote_min_score=0.0))
    query = ["septic shock antibiotics and penicillin anaphylaxis"]
    assert sum(d.votes for d in strict.run(query)) == 1
    assert sum(d.votes for d in loose.run(query)) > 1
    assert strict.run(["zzzz unknownword"]) == []
    with pytest.raises(ValueError, match="no non-empty query"):
        strict.run(["  "])
    with pytest.raises(ValueError, match="vote_min_score"):
        DocumentVoter(rrf_retriever(kb), rrf_params(vote_min_score=1.5))
    assert DocumentVoter.from_dict(strict.to_dict()).to_dict() == strict.to_dict()


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real cross-encoder folder: the bundled MiniLM body with a one-logit head, saved to disk."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("cross-encoder")
    CrossEncoder(str(bundled_model_dir()), num_labels=1, device="cpu", local_files_only=True,
                 model_kwargs={"dtype": torch.float32}).save(str(folder))
    return folder


@pytest.mark.slow
def test_cross_encoder_reranker_loads_a_local_folder_and_orders_by_its_scores(
        kb: KnowledgeBase, cross_encoder_dir: Path) -> None:
    reranker = CrossEncoderReranker(cross_encoder_dir, batch_size=2)
    hits = rrf_retriever(kb).run("kidney injury after contrast", k=5)
    assert {h.title for h in hits} <= set(GUIDES) and all(h.title for h in hits)
    reranked = reranker.rerank("kidney injury after contrast", hits)
    expected = reranker.scores("kidney injury after contrast", [shown_text(h) for h in hits])
    assert shown_text(hits[0]).startswith(f"{hits[0].title} — {hits[0].section}\n")
    assert sorted(h.chunk_id for h in reranked) == sorted(h.chunk_id for h in hits)
    assert [h.score for h in reranked] == sorted(expected, reverse=True)
    again = reranker_from_dict(reranker.to_dict())
    assert [h.chunk_id for h in again.rerank("kidney injury after contrast", hits)] == [h.chunk_id for h in reranked]
    retriever = rrf_retriever(kb, reranker=reranker)
    assert HybridRetriever.from_dict(retriever.to_dict()).to_dict() == retriever.to_dict()


@pytest.mark.slow
def test_reranker_depth_rescores_only_the_head_and_mix_keeps_the_first_stage_in_play(
        kb: KnowledgeBase, cross_encoder_dir: Path) -> None:
    query = "kidney injury after contrast"
    hits = rrf_retriever(kb).run(query, k=6)
    head = CrossEncoderReranker(cross_encoder_dir, depth=3).rerank(query, hits)
    assert [h.chunk_id for h in head[3:]] == [h.chunk_id for h in hits[3:]]
    assert sorted(h.chunk_id for h in head[:3]) == sorted(h.chunk_id for h in hits[:3])
    first_stage_only = CrossEncoderReranker(cross_encoder_dir, mix=0.0).rerank(query, hits)
    assert [h.chunk_id for h in first_stage_only] == [h.chunk_id for h in hits]
    raw = np.asarray(CrossEncoderReranker(cross_encoder_dir).scores(query, [shown_text(h) for h in hits]))
    first = np.asarray([h.score for h in hits])
    expected = 0.5 * (raw - raw.min()) / np.ptp(raw) + 0.5 * (first - first.min()) / np.ptp(first)
    mixed = CrossEncoderReranker(cross_encoder_dir, mix=0.5).rerank(query, hits)
    assert [h.chunk_id for h in mixed] == [hits[i].chunk_id for i in np.argsort(-expected, kind="stable")]
    assert np.allclose([h.score for h in mixed], np.sort(expected)[::-1], atol=1e-6)
    with pytest.raises(ValueError, match="mix in"):
        CrossEncoderReranker(cross_encoder_dir, mix=1.5)


def test_a_delta_turns_the_bundled_model_into_a_reranker(tmp_path: Path, kb: KnowledgeBase) -> None:
    """The shipped form: the bundled MiniLM plus a file holding its new head (and low-rank layer changes)."""
    rng = np.random.default_rng(3)
    head = {"classifier.weight": rng.normal(size=(1, 384)).astype(np.float32),
            "classifier.bias": np.zeros(1, np.float32)}
    layer = {"bert.encoder.layer.0.output.dense": (rng.normal(size=(2, 1536)).astype(np.float32) * 0.01,
                                                   rng.normal(size=(384, 2)).astype(np.float32) * 0.01)}
    save_delta(tmp_path / "a.npz", layer, {"kind": "cross-encoder"}, head)
    head["classifier.weight"] = -head["classifier.weight"]
    save_delta(tmp_path / "b.npz", layer, {"kind": "cross-encoder"}, head)
    texts = ["Acute kidney injury is a creatinine rise.", "Norepinephrine is the first vasopressor."]
    a = CrossEncoderReranker(tmp_path / "a.npz").scores("kidney", texts)
    b = CrossEncoderReranker(tmp_path / "b.npz").scores("kidney", texts)
    assert a == CrossEncoderReranker(str(tmp_path / "a.npz")).scores("kidney", texts)  # deterministic load
    assert np.allclose(a, [-x for x in b], atol=0.05)  # the head came from the file, not a random init
    with pytest.raises(ModelUnavailableError, match="no scoring head"):
        CrossEncoderReranker(NAMED_DELTAS["minilm-medquad"]).scores("kidney", texts)
    save_delta(tmp_path / "bad.npz", {}, {}, {"classifier.weight": np.zeros((1, 10), np.float32)})
    with pytest.raises(ModelUnavailableError, match=r"parameter classifier\.weight is"):
        CrossEncoderReranker(tmp_path / "bad.npz").scores("kidney", texts)


def test_cross_encoder_reranker_rejects_missing_or_broken_folders(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailableError, match="not a local directory"):
        CrossEncoderReranker(tmp_path / "missing")
    with pytest.raises(ModelUnavailableError, match="not found"):
        CrossEncoderReranker(tmp_path / "missing.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelUnavailableError, match="could not load the reranker"):
        CrossEncoderReranker(tmp_path / "empty").rerank("q", [_hit()])
    with pytest.raises(ValueError, match="unknown reranker type"):
        reranker_from_dict({"type": "llm"})


def _hit() -> SearchHit:
    hit = SearchHit("d#0", "d", 1.0, "", "text", "s", "", 0, 4, "", "")
    return replace(hit, score=0.5)
