"""Merging segments: the tiered policy that keeps their number bounded, and the merge itself.

Tiers: a segment with L live rows is in tier ceil(log_f(L / FLOOR_ROWS)) (tier 0 up to FLOOR_ROWS), f the merge
factor. When f segments share a tier they are merged into one of the next tier, so a knowledge base of N
rows holds at most about f x log_f(N / FLOOR_ROWS) segments and each row is rewritten about log_f(N) times
over its life (Lucene's tiered policy, simplified). A segment that has lost most of its rows to deletions
is rewritten alone. A merge copies live rows only: chunks from SQLite, term counts from the BM25 arrays,
vectors from the vector file, so nothing is re-chunked, re-analysed or re-embedded. The HNSW graph of the
first segment is extended rather than rebuilt when that segment has no deletions.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.index import store
from ebmrag.index.dense import HNSW_FILE, VECTORS_FILE, DenseIndex
from ebmrag.index.generations import fsync_dir
from ebmrag.index.lexical import LexicalSegment, TermCounts
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.index.segment import (
    SEGMENT_FILE,
    Segment,
    SegmentBuilder,
    SegmentEntry,
    fsync_tree,
    next_name,
    segments_dir,
)
from ebmrag.protocols import Progress

FLOOR_ROWS = 1_000
EXPUNGE_BELOW = 0.5  # a segment whose live share falls below this is rewritten without its deleted rows


def tier(live: int, factor: int) -> int:
    return 0 if live <= FLOOR_ROWS else math.ceil(math.log(live / FLOOR_ROWS, factor))


def plan(entries: Sequence[SegmentEntry], factor: int) -> list[int]:
    """Indexes of the segments to merge next (largest first), or [] when the policy is satisfied."""
    for i, entry in enumerate(entries):
        if entry.rows > FLOOR_ROWS and entry.live < EXPUNGE_BELOW * entry.rows:
            return [i]
    tiers: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):
        tiers.setdefault(tier(entry.live, factor), []).append(i)
    for level in sorted(tiers):
        if len(tiers[level]) >= factor:
            return sorted(tiers[level], key=lambda i: -entries[i].live)
    return []


def merge_segments(root: Path, entries: Sequence[SegmentEntry], config: KnowledgeBaseConfig,
                   progress: Progress | None = None) -> SegmentEntry:
    """One new segment holding the live rows of `entries`, in their order."""
    dim = _dimension(root, entries)
    segments = [Segment(root, entry, dim) for entry in entries]
    builder = SegmentBuilder(root, next_name(root))
    try:
        for done, segment in enumerate(segments):
            if progress:
                progress("merging", done, len(segments))
            builder.add_documents(row for doc_id, row in store.documents(segment.db).items()
                                  if doc_id not in segment.deleted_docs)
            _copy_chunks(builder, segment)
        counts = TermCounts.concat([s.lexical.counts(s.live) for s in segments])
        vectors = np.concatenate([_live_vectors(s) for s in segments])
        graph = _reusable_graph(segments[0], len(vectors))
        entry = builder.finish(counts, vectors, config.hnsw_min_rows, graph)
        if progress:
            progress("merging", len(segments), len(segments))
        return entry
    except BaseException:
        builder.abandon()
        raise
    finally:
        for segment in segments:
            segment.close()


def _dimension(root: Path, entries: Sequence[SegmentEntry]) -> int:
    vectors = np.load(segments_dir(root) / entries[0].name / VECTORS_FILE, mmap_mode="r")
    return int(vectors.shape[1])


def _copy_chunks(builder: SegmentBuilder, segment: Segment) -> None:
    batch: list[store.ChunkRow] = []
    for chunk in store.iter_chunks(segment.db):
        if segment.live is not None and not segment.live[chunk.row]:
            continue
        batch.append(replace(chunk, row=builder.rows + len(batch)))
        if len(batch) >= 5000:
            builder.add_chunks(batch)
            batch = []
    builder.add_chunks(batch)


def _live_vectors(segment: Segment) -> np.ndarray:
    """From the vector file itself: loading the segment's dense index would read its whole graph too."""
    vectors = np.load(segment.path / VECTORS_FILE, mmap_mode="r")
    return np.asarray(vectors if segment.live is None else vectors[segment.live], dtype=np.float32)


def _reusable_graph(first: Segment, total: int) -> Any:
    """The first segment's graph, loaded with room for `total` rows, when its rows stay rows 0.. unchanged."""
    if first.live is not None or not (first.path / HNSW_FILE).exists():
        return None
    return DenseIndex.load_graph(first.path, first.dim, first.rows, extra=total - first.rows)


def convert_format_1(root: Path, generation: Path) -> SegmentEntry:
    """A generation of the first on-disk format (one index per generation) as one segment: its SQLite, vectors
    and graph are copied as they are; BM25 term counts are rebuilt from the analysed terms SQLite keeps."""
    name = next_name(root)
    partial = segments_dir(root) / f"{name}.partial"
    partial.mkdir(parents=True)
    try:
        for file in (store.DB_FILE, VECTORS_FILE, HNSW_FILE):
            if (generation / file).exists():
                shutil.copy2(generation / file, partial / file)
        db = store.open_readonly(partial)
        try:
            terms = [chunk.terms.split(" ") if chunk.terms else [] for chunk in store.iter_chunks(db)]
        finally:
            db.close()
        LexicalSegment.from_counts(TermCounts.count(terms)).save(partial / "bm25")
        (partial / SEGMENT_FILE).write_text(f'{{"rows": {len(terms)}, "converted_from": "{generation.name}"}}',
                                            encoding="utf-8")
        fsync_tree(partial)
        partial.rename(partial.with_name(name))
        fsync_dir(segments_dir(root))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return SegmentEntry(name, len(terms), len(terms))
