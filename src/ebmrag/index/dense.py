"""Dense search over L2-normalized vectors: exact matrix product when small or filtered, HNSW when large.

Below `hnsw_min_rows` an exact scan costs about a millisecond and needs no graph build, so small
knowledge bases ingest fast and search exactly. A metadata filter that leaves few rows is also
answered by an exact scan over just those rows (HNSW with a selective filter loses recall).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.errors import require_extra
from ebmrag.index.lexical import Rows, Scores

Vectors = npt.NDArray[np.float32]
VECTORS_FILE = "vectors.npy"
HNSW_FILE = "dense.hnsw"


class DenseIndex:
    def __init__(self, vectors: Vectors, hnsw: Any = None, ef_search: int = 64) -> None:
        self.vectors = vectors
        self._hnsw = hnsw
        self._hidden: npt.NDArray[np.bool_] | None = None  # rows marked deleted in the graph
        self._hidden_count = 0
        self.ef_search = ef_search

    @property
    def size(self) -> int:
        return int(self.vectors.shape[0])

    @staticmethod
    def write(directory: Path, vectors: Vectors, hnsw_min_rows: int = 20_000, m: int = 16,
              ef_construction: int = 200) -> None:
        np.save(directory / VECTORS_FILE, np.ascontiguousarray(vectors, dtype=np.float32))
        if vectors.shape[0] >= hnsw_min_rows:
            hnswlib = require_extra("hnswlib", "kb", "the HNSW vector index")

            graph = hnswlib.Index(space="ip", dim=int(vectors.shape[1]))
            graph.init_index(max_elements=int(vectors.shape[0]), ef_construction=ef_construction, M=m, random_seed=7)
            graph.add_items(vectors, np.arange(vectors.shape[0]), num_threads=-1)
            graph.save_index(str(directory / HNSW_FILE))

    @staticmethod
    def extend(directory: Path, vectors: Vectors, graph: Any) -> None:
        """Write `vectors` whose first rows `graph` already indexes: only the rest are inserted (compaction of
        small segments into a large one costs what the small ones hold, not a rebuild)."""
        np.save(directory / VECTORS_FILE, np.ascontiguousarray(vectors, dtype=np.float32))
        start = int(graph.get_current_count())
        if start < vectors.shape[0]:
            graph.add_items(vectors[start:], np.arange(start, vectors.shape[0]), num_threads=-1)
        graph.save_index(str(directory / HNSW_FILE))

    def mark_deleted(self, rows: Rows) -> None:
        """Hide rows from approximate search (in memory; the graph file is never changed)."""
        if self._hnsw is not None:
            if self._hidden is None:
                self._hidden = np.zeros(self.size, bool)
            for label in rows.tolist():
                if not self._hidden[label]:
                    self._hnsw.mark_deleted(int(label))
            self._hidden[rows] = True
            self._hidden_count = int(self._hidden.sum())

    @property
    def has_graph(self) -> bool:
        return self._hnsw is not None

    @staticmethod
    def load_graph(directory: Path, dim: int, rows: int, extra: int = 0) -> Any:
        """The HNSW graph in memory with room for `extra` more items (hnswlib reads the whole file)."""
        hnswlib = require_extra("hnswlib", "kb", "the HNSW vector index")

        hnsw = hnswlib.Index(space="ip", dim=dim)
        hnsw.load_index(str(directory / HNSW_FILE), max_elements=rows + extra)
        return hnsw

    @classmethod
    def load(cls, directory: Path, dim: int, ef_search: int = 64, deleted: Rows | None = None) -> DenseIndex:
        """`deleted` rows are marked deleted in the in-memory graph (the file is never changed), so approximate
        search skips them without a per-candidate filter; exact scans are given a mask by the caller."""
        vectors = np.load(directory / VECTORS_FILE, mmap_mode="r")
        hnsw = None
        if (directory / HNSW_FILE).exists():
            hnsw = cls.load_graph(directory, dim, int(vectors.shape[0]))
            hnsw.set_ef(max(ef_search, 10))
            hnsw.set_num_threads(1)
        index = cls(vectors, hnsw, ef_search)
        if deleted is not None:
            index.mark_deleted(deleted)
        return index

    def search(self, query: Vectors, k: int, mask: npt.NDArray[np.bool_] | None = None,
               exact_below: int = 50_000) -> tuple[Rows, Scores]:
        if self.size == 0 or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        allowed = None if mask is None else np.flatnonzero(mask)
        if self._hnsw is None or (allowed is not None and len(allowed) <= exact_below):
            return self._exact(query, k, allowed)
        return self._approximate(query, k, mask)

    def _exact(self, query: Vectors, k: int, rows: Rows | None) -> tuple[Rows, Scores]:
        matrix = self.vectors if rows is None else self.vectors[rows]
        scores = matrix @ query.astype(np.float32)
        k = min(k, scores.shape[0])
        if k == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        picked = top if rows is None else rows[top]
        return picked.astype(np.int64), scores[top].astype(np.float32)

    def _approximate(self, query: Vectors, k: int, mask: npt.NDArray[np.bool_] | None) -> tuple[Rows, Scores]:
        k = min(k, self.size - self._hidden_count)
        if k == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        self._hnsw.set_ef(max(self.ef_search, k))
        selector = None if mask is None else (lambda label: bool(mask[label]))
        try:
            labels, distances = self._hnsw.knn_query(query[None, :], k=k, filter=selector)
        except RuntimeError:  # hnswlib found fewer than k (a selective filter): answer exactly instead
            allowed = np.ones(self.size, bool) if mask is None else mask.copy()
            if self._hidden is not None:
                allowed &= ~self._hidden
            return self._exact(query, k, np.flatnonzero(allowed))
        return labels[0].astype(np.int64), (1.0 - distances[0]).astype(np.float32)
