"""BM25 (k1 = 1.5, b = 0.75, Lucene idf) over analysed terms: bm25s builds it, a numpy scorer queries it.

bm25s precomputes every (term, document) score into a sparse matrix (CSC: one column per term), so
a query is the sum of a few columns. We read those arrays memory-mapped and do the sum and the
top-k ourselves: no numba JIT (5 s at each process start), no per-call overhead, O(postings of
the query terms + N) per query. Row i of the index is chunk row i of the generation's SQLite table.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.errors import require_extra

Rows = npt.NDArray[np.int64]
Scores = npt.NDArray[np.float32]
_ARRAYS = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy")


class LexicalIndex:
    def __init__(self, k1: float = 1.5, b: float = 0.75, method: str = "lucene") -> None:
        """`method` picks the idf: "lucene" log(1 + (N-n+.5)/(n+.5)), never negative; "robertson" as rank_bm25."""
        if k1 <= 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if method not in ("lucene", "robertson"):
            raise ValueError(f"method must be 'lucene' or 'robertson', got {method!r}")
        self.k1, self.b, self.method = k1, b, method
        self.size = 0
        self._vocabulary: dict[str, int] = {}
        self._data: npt.NDArray[np.float32] = np.zeros(0, np.float32)
        self._indices: npt.NDArray[np.int32] = np.zeros(0, np.int32)
        self._indptr: npt.NDArray[np.int64] = np.zeros(1, np.int64)

    def build(self, documents: Sequence[list[str]]) -> None:
        bm25s = require_extra("bm25s", "kb", "building a BM25 index")

        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.size = len(documents)
        if not documents:
            return
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        model.index(list(documents), show_progress=False)
        self._vocabulary = {str(term): int(i) for term, i in model.vocab_dict.items()}
        self._data = model.scores["data"]
        self._indices = model.scores["indices"]
        self._indptr = model.scores["indptr"]

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        arrays: tuple[npt.NDArray[Any], ...] = (self._data, self._indices, self._indptr)
        for name, array in zip(_ARRAYS, arrays, strict=True):
            np.save(directory / name, array)
        (directory / "vocab.json").write_text(json.dumps(self._vocabulary, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path, size: int, k1: float = 1.5, b: float = 0.75) -> LexicalIndex:
        index = cls(k1, b)
        index.size = size
        index._vocabulary = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        index._data, index._indices, index._indptr = (np.load(directory / name, mmap_mode="r") for name in _ARRAYS)
        return index

    def scores(self, terms: list[str]) -> npt.NDArray[np.float32]:
        """BM25 score of every row; a repeated query term counts once per occurrence, as in rank_bm25."""
        total = np.zeros(self.size, dtype=np.float32)
        for term in terms:
            column = self._vocabulary.get(term)
            if column is None:
                continue
            start, end = int(self._indptr[column]), int(self._indptr[column + 1])
            total[self._indices[start:end]] += self._data[start:end]
        return total * np.float32(self.k1 + 1)  # bm25s leaves out this constant factor of the textbook formula

    def share(self, term: str) -> float:
        """The share of rows that contain `term` (0 for an unknown term): how generic a word is here."""
        column = self._vocabulary.get(term)
        if column is None or self.size == 0:
            return 0.0
        return (int(self._indptr[column + 1]) - int(self._indptr[column])) / self.size

    def search(self, terms: list[str], k: int, mask: npt.NDArray[np.bool_] | None = None) -> tuple[Rows, Scores]:
        """Top-k rows by BM25 among rows where `mask` is True; rows with no query term never appear."""
        if self.size == 0 or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        total = self.scores(terms)
        if mask is not None:
            total[~mask] = 0
        candidates = np.flatnonzero(total > 0)
        if len(candidates) > k:
            candidates = candidates[np.argpartition(-total[candidates], k - 1)[:k]]
        order = candidates[np.lexsort((candidates, -total[candidates]))]
        return order.astype(np.int64), total[order]
