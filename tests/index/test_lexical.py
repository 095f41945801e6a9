from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from ebmrag.index.analyzer import Analyzer
from ebmrag.index.lexical import LexicalIndex


@pytest.fixture(scope="module")
def abstracts(shared_data: Path) -> list[list[str]]:
    analyzer = Analyzer()
    with (shared_data / "pubmedqa" / "pubmedqa_corpus_contexts.jsonl").open(encoding="utf-8") as handle:
        lines = [line for _, line in zip(range(300), handle, strict=False)]
    return [analyzer.terms(" ".join(json.loads(line)["contexts"])) for line in lines]


def assert_parity_with_rank_bm25(documents: list[list[str]], seed: int = 0) -> None:
    """Robertson BM25 against the reference implementation, on query terms found in < half the documents
    (where rank_bm25's negative-idf floor does not apply)."""
    reference = BM25Okapi(documents, k1=1.5, b=0.75)
    ours = LexicalIndex(method="robertson")
    ours.build(documents)
    frequency = {term: sum(term in set(doc) for doc in documents) for doc in documents[:20] for term in doc}
    rng = np.random.default_rng(seed)
    candidates = sorted(t for t, n in frequency.items() if n < len(documents) / 2)
    for _ in range(25):
        query = list(rng.choice(candidates, size=3, replace=False))
        assert np.allclose(ours.scores(query), reference.get_scores(query), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.data
def test_robertson_scores_match_rank_bm25(abstracts: list[list[str]]) -> None:
    """Parity on real abstracts."""
    assert_parity_with_rank_bm25(abstracts)


def test_robertson_scores_match_rank_bm25_on_a_synthetic_corpus() -> None:
    """Parity without the shared data: 300 documents of Zipf-distributed terms and varied lengths, so
    term frequencies > 1, rare and common terms and length normalisation are all exercised."""
    rng = np.random.default_rng(7)
    vocabulary = [f"term{i}" for i in range(2000)]
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    weights /= weights.sum()
    documents = [list(rng.choice(vocabulary, size=int(rng.integers(5, 120)), p=weights)) for _ in range(300)]
    assert_parity_with_rank_bm25(documents, seed=1)


def test_lucene_scores_follow_the_formula() -> None:
    docs = [["penicillin", "allergy", "rash"], ["penicillin", "penicillin", "anaphylaxis"], ["creatinine"]]
    index = LexicalIndex(k1=1.5, b=0.75)
    index.build(docs)
    average = sum(map(len, docs)) / len(docs)

    def expected(term: str, doc: list[str]) -> float:
        n = sum(term in d for d in docs)
        idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
        tf = doc.count(term)
        return idf * tf * 2.5 / (tf + 1.5 * (1 - 0.75 + 0.75 * len(doc) / average))

    got = index.scores(["penicillin", "anaphylaxis"])
    want = [expected("penicillin", d) + expected("anaphylaxis", d) for d in docs]
    assert np.allclose(got, want, rtol=1e-5)


def test_search_ranks_masks_and_survives_save_and_load(tmp_path: Path) -> None:
    docs = [["warfarin", "inr"], ["warfarin", "bleed", "inr", "inr"], ["aspirin"], ["inr"]]
    index = LexicalIndex()
    index.build(docs)
    index.save(tmp_path)
    loaded = LexicalIndex.load(tmp_path)
    rows, scores = loaded.search(["inr", "warfarin"], k=10)
    assert set(rows.tolist()[:2]) == {0, 1} and 2 not in rows.tolist()  # a row with no query term never appears
    assert np.all(np.diff(scores) <= 0)
    masked, _ = loaded.search(["inr"], k=10, mask=np.array([True, False, True, True]))
    assert sorted(masked.tolist()) == [0, 3]
    assert loaded.search(["unknownterm"], k=5)[0].size == 0


def test_analyzer_stems_drops_stop_words_and_segments_chinese() -> None:
    terms = Analyzer().terms("The patients were treated with 2.8 mg/dL; 患者青霉素过敏")
    assert "the" not in terms and "patient" in terms and "treat" in terms and "2.8" in terms
    assert "青霉素" in terms and "过敏" in terms
