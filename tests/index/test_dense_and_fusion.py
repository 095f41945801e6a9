from __future__ import annotations

from pathlib import Path

import numpy as np

from ebmrag.index.dense import HNSW_FILE, DenseIndex
from ebmrag.retrieve.fusion import Ranked, rrf, score_fusion, top


def unit_vectors(n: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_hnsw_agrees_with_exact_search(tmp_path: Path) -> None:
    vectors = unit_vectors(3000)
    DenseIndex.write(tmp_path, vectors, hnsw_min_rows=1000)
    assert (tmp_path / HNSW_FILE).exists()
    index = DenseIndex.load(tmp_path, 32)
    queries = unit_vectors(50, seed=1)
    overlap = []
    for query in queries:
        approx, _ = index.search(query, 10)
        exact = np.argsort(-(vectors @ query))[:10]
        overlap.append(len(set(approx.tolist()) & set(exact.tolist())) / 10)
    assert np.mean(overlap) >= 0.95


def test_masked_search_returns_only_allowed_rows(tmp_path: Path) -> None:
    vectors = unit_vectors(500)
    DenseIndex.write(tmp_path, vectors, hnsw_min_rows=10_000)
    index = DenseIndex.load(tmp_path, 32)
    mask = np.zeros(500, dtype=bool)
    mask[::7] = True
    rows, scores = index.search(vectors[3], 20, mask)
    assert len(rows) == 20 and all(mask[rows])
    assert np.all(np.diff(scores) <= 1e-7)
    top_row, _ = index.search(vectors[14], 1, mask)
    assert top_row.tolist() == [14]


def test_rrf_is_the_weighted_reciprocal_rank_sum() -> None:
    bm25 = Ranked(np.array([5, 7, 9]), np.array([3.0, 2.0, 1.0], np.float32))
    dense = Ranked(np.array([7, 5]), np.array([0.9, 0.8], np.float32))
    fused = rrf([bm25, dense], [1.0, 2.0], k=60)
    assert fused[7] == 1 / 62 + 2 / 61
    assert fused[9] == 1 / 63
    assert top(fused, 2).rows.tolist() == [7, 5]


def test_score_fusion_normalises_each_route() -> None:
    bm25 = Ranked(np.array([1, 2]), np.array([30.0, 10.0], np.float32))
    dense = Ranked(np.array([2, 3]), np.array([0.8, 0.4], np.float32))
    fused = score_fusion([bm25, dense], [0.3, 0.7])
    assert fused == {1: 0.3, 2: 0.7, 3: 0.0}
