"""The live generation opened read-only: its segments laid end to end as one row space.

Segment i's local row r is global row offsets[i] + r. Searches fan out over segments and merge; the
catalog queries (documents, chunks, titles, filters) run on each segment's SQLite and leave out what
the generation's deletions removed, so callers see one knowledge base. Global rows are valid for the
generation that produced them (compare `Reader.path`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import KnowledgeBaseError
from ebmrag.index import store
from ebmrag.index.dense import Vectors
from ebmrag.index.lexical import LexicalIndex, Mask, Rows, Scores
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.index.segment import Segment, SegmentEntry
from ebmrag.index.types import Filters

FORMAT_VERSION = 2  # the on-disk format this ebmrag writes; every generation's manifest records its own
CONVERTIBLE_FORMATS = frozenset({1})  # older formats `KnowledgeBase.compact` converts in place
MANIFEST = "manifest.json"
ROW_CACHE = 20_000  # chunk rows a reader keeps in memory (~1 KB of text each)
REBUILD = "rebuild it from its sources into a new directory: `ebmrag ingest FILES --kb NEW_DIR`"


def load_manifest(generation: Path) -> dict[str, Any]:
    """A generation's manifest as written, refused in one line when this ebmrag cannot know what it holds: a
    newer format (upgrade ebmrag), no format recorded, or a manifest that does not read. Every ebmrag release has
    recorded `format` in every manifest, so one without it was not written by ebmrag, or was damaged. An older,
    convertible format is returned as it is: only `KnowledgeBase.compact` reads it."""
    root = generation.parent
    try:
        data = json.loads((generation / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # missing, unreadable, not UTF-8, not JSON
        raise KnowledgeBaseError(f"{root}: {generation.name}/{MANIFEST} does not read ({exc}); the knowledge "
                                 f"base is damaged: {REBUILD}") from None
    found = data.get("format") if isinstance(data, dict) else None
    if found is None:
        raise KnowledgeBaseError(f"{root}: {generation.name}/{MANIFEST} records no on-disk format, which every "
                                 f"ebmrag knowledge base does: it was not written by ebmrag or is damaged; {REBUILD}")
    if type(found) is not int or found < 1:
        raise KnowledgeBaseError(f"{root} records an unknown on-disk format {found!r}; {REBUILD}")
    if found > FORMAT_VERSION:
        raise KnowledgeBaseError(f"{root} was written by a newer ebmrag (knowledge-base format {found}; this ebmrag "
                                 f"reads format {FORMAT_VERSION} and converts older ones): upgrade ebmrag to open it")
    if not isinstance(data.get("config"), dict):
        raise KnowledgeBaseError(f"{root}: {generation.name}/{MANIFEST} names no build settings; the knowledge base "
                                 f"is damaged: {REBUILD}")
    return dict(data)


def read_manifest(generation: Path) -> dict[str, Any]:
    """The manifest of a generation in this ebmrag's format; an older one is refused with the command that
    converts it."""
    data = load_manifest(generation)
    if data["format"] in CONVERTIBLE_FORMATS:
        raise KnowledgeBaseError(f"{generation.parent} was written by an older ebmrag (knowledge-base format "
                                 f"{data['format']}, one index per generation); convert it once with "
                                 f"`ebmrag kb compact --kb {generation.parent}`")
    return data


class SegmentedDense:
    """Dense search over every segment, merged by score. A segment with an HNSW graph has its deleted rows
    marked in the graph; an exact scan is masked."""

    def __init__(self, segments: Sequence[Segment], offsets: Sequence[int]) -> None:
        self.segments, self.offsets = list(segments), list(offsets)
        self.size = sum(s.rows for s in segments)

    def search(self, query: Vectors, k: int, mask: Mask | None = None) -> tuple[Rows, Scores]:
        found_rows, found_scores = [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
        for segment, offset in zip(self.segments, self.offsets, strict=True):
            local = None if mask is None else mask[offset:offset + segment.rows]
            if segment.live is not None and (local is not None or not segment.dense.has_graph):
                local = segment.live if local is None else local & segment.live
            rows, scores = segment.dense.search(query, k, local)
            found_rows.append(rows + offset)
            found_scores.append(scores)
        rows, scores = np.concatenate(found_rows), np.concatenate(found_scores)
        order = np.lexsort((rows, -scores))[:k]
        return rows[order], scores[order]

    def vectors_at(self, rows: Sequence[int]) -> Vectors:
        out = np.zeros((len(rows), self.dimension), np.float32)
        for i, row in enumerate(rows):
            segment, local = self._locate(int(row))
            out[i] = segment.dense.vectors[local]
        return out

    @property
    def dimension(self) -> int:
        return int(self.segments[0].dense.vectors.shape[1]) if self.segments else 0

    @property
    def vectors(self) -> Vectors:
        """Every row's vector (deleted rows included, so global rows index it); one segment's is its memory map."""
        if len(self.segments) == 1:
            return self.segments[0].dense.vectors
        return np.concatenate([np.asarray(s.dense.vectors) for s in self.segments]) if self.segments else \
            np.zeros((0, 0), np.float32)

    def _locate(self, row: int) -> tuple[Segment, int]:
        i = int(np.searchsorted(self.offsets, row, side="right")) - 1
        if i < 0 or row - self.offsets[i] >= self.segments[i].rows:
            raise IndexError(f"row {row} is outside this generation")
        return self.segments[i], row - self.offsets[i]


class Reader:
    """Search indexes and catalog of one generation."""

    def __init__(self, path: Path, config: KnowledgeBaseConfig, previous: Reader | None = None) -> None:
        """`previous`: the reader of an earlier generation, whose segments (and loaded indexes) are carried over
        where this generation still names them; the caller closes it with `close(keep=self.segments)`."""
        self.path = path
        self.manifest = read_manifest(path)
        dim = int(self.manifest["dim"])
        entries = [SegmentEntry.from_json(e) for e in self.manifest["segments"]]
        known = {s.entry.name: s for s in previous.segments} if previous else {}
        self.segments: list[Segment] = []
        try:
            for entry in entries:
                earlier = known.get(entry.name)
                self.segments.append(earlier if earlier is not None and earlier.entry == entry else
                                     earlier.successor(path.parent, entry) if earlier is not None else
                                     Segment(path.parent, entry, dim))
        except BaseException:
            self.close(keep=previous.segments if previous else ())
            raise
        self.offsets = [int(x) for x in np.cumsum([0] + [e.rows for e in entries])[:-1]]
        self.size = sum(e.rows for e in entries)  # the row space, deleted rows included
        self.live_chunks = sum(e.live for e in entries)
        self.config = config
        self._rows: OrderedDict[int, store.ChunkRow] = OrderedDict()  # recently read chunk rows (chunks_by_rows)
        self._rows_lock = threading.Lock()

    @cached_property
    def lexical(self) -> LexicalIndex:
        """BM25 over every segment with global statistics (loaded on first use: a write reads only the catalog)."""
        return LexicalIndex(self.config.k1, self.config.b).over([s.lexical for s in self.segments],
                                                                [s.live for s in self.segments])

    @cached_property
    def dense(self) -> SegmentedDense:
        return SegmentedDense(self.segments, self.offsets)

    def close(self, keep: Sequence[Segment] = ()) -> None:
        """Release this generation's files, except segments a newer reader carried over."""
        kept = {id(s) for s in keep}
        for segment in self.segments:
            if id(segment) not in kept:
                segment.close()

    # --- catalog -------------------------------------------------------------------------------------------

    def _global(self, i: int, chunk: store.ChunkRow) -> store.ChunkRow:
        return replace(chunk, row=self.offsets[i] + chunk.row)

    def _alive(self, i: int, local_row: int) -> bool:
        live = self.segments[i].live
        return live is None or bool(live[local_row])

    def content_hashes(self, doc_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """doc id -> (content hash, segment index) for those of `doc_ids` that are live: a write looks up only
        the documents it touches, never the whole catalog."""
        found: dict[str, tuple[str, int]] = {}
        for i, segment in enumerate(self.segments):
            for doc_id, content_hash in store.hashes_of(segment.db, doc_ids).items():
                if doc_id not in segment.deleted_docs:
                    found[doc_id] = (content_hash, i)
        return found

    def documents(self) -> dict[str, store.DocumentRow]:
        """Every live document (the whole catalog: for listings and sync, not for a write's lookups)."""
        found: dict[str, store.DocumentRow] = {}
        for segment in self.segments:
            found.update((doc_id, row) for doc_id, row in store.documents(segment.db).items()
                         if doc_id not in segment.deleted_docs)
        return found

    def document(self, doc_id: str) -> store.DocumentRow | None:
        for segment in reversed(self.segments):  # an updated document lives in a later segment
            row = store.document(segment.db, doc_id)
            if row is not None and doc_id not in segment.deleted_docs:
                return row
        return None

    def chunks_of(self, doc_id: str) -> list[store.ChunkRow]:
        for i in reversed(range(len(self.segments))):
            segment = self.segments[i]
            if doc_id in segment.deleted_docs:
                continue
            chunks = store.chunks_of(segment.db, doc_id)
            if chunks:
                return [self._global(i, c) for c in chunks]
        return []

    def iter_chunks(self) -> Iterator[store.ChunkRow]:
        """Live chunks in global row order."""
        for i, segment in enumerate(self.segments):
            for chunk in store.iter_chunks(segment.db):
                if self._alive(i, chunk.row):
                    yield self._global(i, chunk)

    def chunks_by_rows(self, rows: Sequence[int]) -> dict[int, store.ChunkRow]:
        """The chunk rows of these global rows. The last ROW_CACHE rows read are kept: an ask's record sentences
        vote with m = 100 chunks each, mostly the same chunks from one ask to the next, and reading and building
        them was most of a follow-up ask's retrieval. A generation's rows never change."""
        found: dict[int, store.ChunkRow] = {}
        missing: list[int] = []
        with self._rows_lock:
            for row in map(int, rows):
                chunk = self._rows.get(row)
                if chunk is None:
                    missing.append(row)
                else:
                    found[row] = chunk
                    self._rows.move_to_end(row)
        read = self._read_rows(missing) if missing else {}
        with self._rows_lock:
            self._rows.update(read)
            while len(self._rows) > ROW_CACHE:
                self._rows.popitem(last=False)
        found.update(read)
        return found

    def _read_rows(self, rows: Sequence[int]) -> dict[int, store.ChunkRow]:
        by_segment: dict[int, list[int]] = {}
        for row in rows:
            i = int(np.searchsorted(self.offsets, int(row), side="right")) - 1
            by_segment.setdefault(i, []).append(int(row) - self.offsets[i])
        found: dict[int, store.ChunkRow] = {}
        for i, local in by_segment.items():
            for row, chunk in store.chunks_by_rows(self.segments[i].db, local).items():
                found[self.offsets[i] + row] = self._global(i, chunk)
        return found

    def scope(self, filters: Filters) -> Mask | None:
        """What searches take for `filters`: a mask over the row space of the live rows that match (None: all)."""
        where, params = filters.sql()
        if not where:
            return None
        mask = np.zeros(self.size, dtype=bool)
        for i, segment in enumerate(self.segments):
            local = np.asarray(store.rows_matching(segment.db, where, params), dtype=np.int64)
            if segment.live is not None and len(local):
                local = local[segment.live[local]]
            mask[self.offsets[i] + local] = True
        return mask

    def titles_of(self, doc_ids: Sequence[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(doc_ids))
        found: dict[str, str] = {}
        for segment in self.segments:
            for doc_id, title in store.titles_of(segment.db, wanted).items():
                if doc_id not in segment.deleted_docs:
                    found[doc_id] = title
        return found

    def titles(self) -> list[str]:
        """Every distinct non-empty title of a live document."""
        return sorted({row.title for row in self.documents().values() if row.title})
