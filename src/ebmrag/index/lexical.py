"""BM25 (k1 = 1.5, b = 0.75, Lucene idf) over analysed terms, scored at query time over one or more segments.

Each segment stores raw term frequencies (CSC: one column per term, a row per chunk) and chunk lengths,
memory-mapped. Scores are computed at query time from statistics that are global over every live row of
every segment (document frequency, row count, average length), so a knowledge base split into segments,
some rows deleted, scores exactly as one index built over its live rows would. A query costs
O(postings of the query terms + N). Row i of a segment is chunk row i of that segment's SQLite table.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.int64]
Scores = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]
_ARRAYS = ("tf.npy", "rows.npy", "columns.npy", "lengths.npy")


@dataclass
class TermCounts:
    """A batch of chunks as term-frequency triples (column, row, tf) over its own vocabulary."""

    vocabulary: list[str]
    columns: npt.NDArray[np.int32]
    rows: npt.NDArray[np.int32]
    tf: npt.NDArray[np.float32]
    lengths: npt.NDArray[np.int32]

    @classmethod
    def count(cls, documents: Iterable[Sequence[str]]) -> TermCounts:
        """One row per term list (the Python loop of indexing; ingest runs it in worker processes)."""
        vocabulary: dict[str, int] = {}
        columns: list[int] = []
        rows: list[int] = []
        tf: list[int] = []
        lengths: list[int] = []
        for row, terms in enumerate(documents):
            lengths.append(len(terms))
            for term, count in Counter(terms).items():
                columns.append(vocabulary.setdefault(term, len(vocabulary)))
                rows.append(row)
                tf.append(count)
        return cls(list(vocabulary), np.asarray(columns, np.int32), np.asarray(rows, np.int32),
                   np.asarray(tf, np.float32), np.asarray(lengths, np.int32))

    @classmethod
    def concat(cls, parts: Sequence[TermCounts]) -> TermCounts:
        """Batches stacked row-wise in order, their vocabularies merged."""
        vocabulary: dict[str, int] = {}
        columns, rows, offset = [], [], 0
        for part in parts:
            remap = np.asarray([vocabulary.setdefault(t, len(vocabulary)) for t in part.vocabulary], np.int32)
            columns.append(remap[part.columns] if len(part.columns) else part.columns)
            rows.append(part.rows + offset)
            offset += len(part.lengths)
        return cls(list(vocabulary), _stack(columns, np.int32), _stack(rows, np.int32),
                   _stack([p.tf for p in parts], np.float32), _stack([p.lengths for p in parts], np.int32))


def _stack(arrays: Sequence[npt.NDArray[Any]], dtype: type) -> npt.NDArray[Any]:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


class LexicalSegment:
    """One segment's postings: for term column c, rows[indptr[c]:indptr[c+1]] with frequencies tf[...]."""

    def __init__(self, vocabulary: dict[str, int], indptr: npt.NDArray[np.int64], rows: npt.NDArray[np.int32],
                 tf: npt.NDArray[np.float32], lengths: npt.NDArray[np.int32]) -> None:
        self.vocabulary, self.indptr, self.rows, self.tf, self.lengths = vocabulary, indptr, rows, tf, lengths

    @property
    def size(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_counts(cls, counts: TermCounts) -> LexicalSegment:
        order = np.lexsort((counts.rows, counts.columns))
        indptr = np.zeros(len(counts.vocabulary) + 1, np.int64)
        np.cumsum(np.bincount(counts.columns, minlength=len(counts.vocabulary)), out=indptr[1:])
        return cls({t: i for i, t in enumerate(counts.vocabulary)}, indptr, counts.rows[order], counts.tf[order],
                   counts.lengths)

    def counts(self, keep: Mask | None = None) -> TermCounts:
        """Back to triples, keeping only rows where `keep` is True, renumbered in order (for merging)."""
        columns = np.repeat(np.arange(len(self.vocabulary), dtype=np.int32), np.diff(self.indptr))
        rows, tf, lengths = np.asarray(self.rows), np.asarray(self.tf), np.asarray(self.lengths)
        if keep is not None:
            new_row = np.cumsum(keep, dtype=np.int64) - 1
            alive = keep[rows]
            columns, rows, tf = columns[alive], new_row[rows[alive]].astype(np.int32), tf[alive]
            lengths = lengths[keep]
        vocabulary = sorted(self.vocabulary, key=self.vocabulary.__getitem__)
        return TermCounts(vocabulary, columns, rows, tf, lengths)

    def postings(self, term: str) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        column = self.vocabulary.get(term)
        if column is None:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        start, end = int(self.indptr[column]), int(self.indptr[column + 1])
        return self.rows[start:end], self.tf[start:end]

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        arrays: tuple[npt.NDArray[Any], ...] = (self.tf, self.rows, self.indptr, self.lengths)
        for name, array in zip(_ARRAYS, arrays, strict=True):
            np.save(directory / name, array)
        (directory / "vocab.json").write_text(json.dumps(self.vocabulary, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> LexicalSegment:
        vocabulary = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        tf, rows, indptr, lengths = (np.load(directory / name, mmap_mode="r") for name in _ARRAYS)
        return cls(vocabulary, indptr, rows, tf, lengths)


class LexicalIndex:
    """BM25 over segments laid end to end (segment i's rows start at the sum of the sizes before it).

    `live[i]` marks segment i's rows that are not deleted (None: all live); deleted rows neither score
    nor count in the statistics."""

    def __init__(self, k1: float = 1.5, b: float = 0.75, method: str = "lucene") -> None:
        """`method` picks the idf: "lucene" log(1 + (N-n+.5)/(n+.5)), never negative; "robertson" as rank_bm25."""
        if k1 <= 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if method not in ("lucene", "robertson"):
            raise ValueError(f"method must be 'lucene' or 'robertson', got {method!r}")
        self.k1, self.b, self.method = k1, b, method
        self.segments: list[LexicalSegment] = []
        self.live: list[Mask | None] = []
        self.offsets: list[int] = []
        self.size = 0  # rows in the row space, deleted ones included
        self.live_rows = 0
        self._norms: list[npt.NDArray[np.float32]] = []

    def over(self, segments: Sequence[LexicalSegment], live: Sequence[Mask | None]) -> LexicalIndex:
        """Serve these segments; the global statistics are computed once, here."""
        self.segments, self.live = list(segments), list(live)
        self.offsets = [int(x) for x in np.cumsum([0] + [s.size for s in segments])[:-1]]
        self.size = sum(s.size for s in segments)
        total_length = 0
        self.live_rows = 0
        for segment, keep in zip(segments, live, strict=True):
            lengths = np.asarray(segment.lengths, dtype=np.int64)
            total_length += int(lengths.sum() if keep is None else lengths[keep].sum())
            self.live_rows += segment.size if keep is None else int(keep.sum())
        average = total_length / self.live_rows if self.live_rows else 1.0
        # the length part of the denominator, k1 * (1 - b + b * dl / avgdl), once per row
        self._norms = [(self.k1 * (1 - self.b + self.b * np.asarray(s.lengths, np.float64) / max(average, 1e-9)))
                       .astype(np.float64) for s in segments]
        return self

    def build(self, documents: Sequence[Sequence[str]]) -> LexicalIndex:
        """One segment over these term lists (tests and benchmarks; the knowledge base writes segments)."""
        return self.over([LexicalSegment.from_counts(TermCounts.count(documents))], [None])

    def save(self, directory: Path) -> None:
        """A one-segment index to `directory` (see `load`)."""
        if len(self.segments) != 1:
            raise ValueError(f"save writes one segment; this index serves {len(self.segments)}")
        self.segments[0].save(directory)

    @classmethod
    def load(cls, directory: Path, k1: float = 1.5, b: float = 0.75) -> LexicalIndex:
        return cls(k1, b).over([LexicalSegment.load(directory)], [None])

    def _idf(self, frequency: int) -> float:
        n, total = frequency, self.live_rows
        if self.method == "robertson":
            return math.log((total - n + 0.5) / (n + 0.5))
        return math.log(1 + (total - n + 0.5) / (n + 0.5))

    def _live_postings(self, term: str) -> list[tuple[int, npt.NDArray[np.int32], npt.NDArray[np.float32]]]:
        found = []
        for i, (segment, keep) in enumerate(zip(self.segments, self.live, strict=True)):
            rows, tf = segment.postings(term)
            if keep is not None and len(rows):
                alive = keep[rows]
                rows, tf = rows[alive], tf[alive]
            if len(rows):
                found.append((i, rows, tf))
        return found

    def scores(self, terms: Sequence[str]) -> Scores:
        """BM25 score of every row; a repeated query term counts once per occurrence, as in rank_bm25."""
        total = np.zeros(self.size, dtype=np.float32)
        for term in terms:
            postings = self._live_postings(term)
            idf = self._idf(sum(len(rows) for _, rows, _ in postings))
            for i, rows, tf in postings:
                tf64 = tf.astype(np.float64)
                part = idf * tf64 * (self.k1 + 1) / (tf64 + self._norms[i][rows])
                total[self.offsets[i] + rows.astype(np.int64)] += part.astype(np.float32)
        return total

    def share(self, term: str) -> float:
        """The share of live rows that contain `term` (0 for an unknown term): how generic a word is here."""
        if self.live_rows == 0:
            return 0.0
        return sum(len(rows) for _, rows, _ in self._live_postings(term)) / self.live_rows

    def search(self, terms: Sequence[str], k: int, mask: Mask | None = None) -> tuple[Rows, Scores]:
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
