"""Segments: the immutable parts a knowledge-base generation is made of.

A segment directory (`segments/seg-NNNNNN/`) holds its documents and chunks (SQLite), its BM25 term
frequencies, its vectors and, when large enough, its HNSW graph. It is written as `seg-NNNNNN.partial/`,
fsynced and renamed, and never changed afterwards. What a later write removes from it is recorded beside
it in a deletion file `deletes-GGGGGG.npz` (the generation that wrote it): a bitmap of deleted rows and
the deleted document ids. A generation's manifest names its segments and, for each, the deletion file in
force, so every generation is a consistent snapshot and older files are removed only when no live
generation names them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.index import store
from ebmrag.index.dense import DenseIndex, Vectors
from ebmrag.index.generations import fsync_dir
from ebmrag.index.lexical import LexicalSegment, Mask, TermCounts

SEGMENTS = "segments"
SEGMENT_FILE = "segment.json"
_NAME = re.compile(r"^seg-(\d{6})$")


@dataclass(frozen=True)
class SegmentEntry:
    """A generation manifest's view of one segment."""

    name: str
    rows: int
    live: int
    deletes: str | None = None  # the deletion file in force, None when nothing was deleted

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "live": self.live, "deletes": self.deletes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SegmentEntry:
        return cls(str(data["name"]), int(data["rows"]), int(data["live"]), data.get("deletes"))


def segments_dir(root: Path) -> Path:
    return root / SEGMENTS


def next_name(root: Path) -> str:
    """A name no segment has used yet (partials included, so a crashed writer's number is not reused)."""
    numbers = [int(m.group(1)) for p in segments_dir(root).glob("seg-*")
               if (m := _NAME.match(p.name.removesuffix(".partial")))]
    return f"seg-{max(numbers, default=0) + 1:06d}"


def fsync_tree(directory: Path) -> None:
    """Every file a new segment wrote, and its folder, to disk (before the rename that makes it final)."""
    for path in [*directory.rglob("*"), directory]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class SegmentBuilder:
    """Writes one segment: documents and chunks streamed in, then term counts and vectors, then sealed."""

    def __init__(self, root: Path, name: str) -> None:
        segments_dir(root).mkdir(parents=True, exist_ok=True)
        self.final = segments_dir(root) / name
        self.partial = self.final.with_name(name + ".partial")
        self.partial.mkdir()
        self.db: sqlite3.Connection = store.create(self.partial)
        self.rows = 0

    def add_documents(self, rows: Iterable[store.DocumentRow]) -> None:
        store.insert_documents(self.db, rows)

    def add_chunks(self, rows: list[store.ChunkRow]) -> None:
        """Chunks in row order; their `row` must continue from the previous call's."""
        if rows and rows[0].row != self.rows:
            raise ValueError(f"segment rows must be consecutive: expected {self.rows}, got {rows[0].row}")
        store.insert_chunks(self.db, rows)
        self.rows += len(rows)

    def finish(self, counts: TermCounts, vectors: Vectors, hnsw_min_rows: int, graph: Any = None) -> SegmentEntry:
        """`graph`: an HNSW graph that already holds the first rows (extended here instead of rebuilt)."""
        if len(counts.lengths) != self.rows or vectors.shape[0] != self.rows:
            raise ValueError(f"segment has {self.rows} chunks, {len(counts.lengths)} term rows, "
                             f"{vectors.shape[0]} vectors")
        store.seal(self.db)
        LexicalSegment.from_counts(counts).save(self.partial / "bm25")
        if graph is not None:
            DenseIndex.extend(self.partial, vectors, graph)
        else:
            DenseIndex.write(self.partial, vectors, hnsw_min_rows)
        info = {"rows": self.rows, "created": datetime.now(UTC).isoformat(timespec="seconds")}
        (self.partial / SEGMENT_FILE).write_text(json.dumps(info), encoding="utf-8")
        fsync_tree(self.partial)
        self.partial.rename(self.final)
        fsync_dir(self.final.parent)
        return SegmentEntry(self.final.name, self.rows, self.rows)

    def abandon(self) -> None:
        try:
            self.db.close()
        finally:
            shutil.rmtree(self.partial, ignore_errors=True)


class Segment:
    """One segment opened read-only, with the deletions of the generation that opened it."""

    def __init__(self, root: Path, entry: SegmentEntry, dim: int) -> None:
        self.entry = entry
        self.path = segments_dir(root) / entry.name
        self.deleted_docs: frozenset[str] = frozenset()
        self.live: Mask | None = None
        if entry.deletes:
            self.deleted_docs, self.live = read_deletes(self.path / entry.deletes, entry.rows)
        self.db = store.open_readonly(self.path)
        self.dim = dim

    @cached_property
    def lexical(self) -> LexicalSegment:
        """Loaded on first search: a write only needs the catalog."""
        return LexicalSegment.load(self.path / "bm25")

    @cached_property
    def dense(self) -> DenseIndex:
        deleted = None if self.live is None else np.flatnonzero(~self.live)
        return DenseIndex.load(self.path, self.dim, deleted=deleted)

    @property
    def rows(self) -> int:
        return self.entry.rows

    def successor(self, root: Path, entry: SegmentEntry) -> Segment:
        """This segment as a later generation names it. Only deletions can differ, and they only grow, so the
        loaded indexes are shared and the new deletions are marked in the graph: a write that deletes from a
        large segment does not make readers load its graph again."""
        follower = Segment(root, entry, self.dim)
        for name in ("lexical", "dense"):
            if name in self.__dict__:
                follower.__dict__[name] = self.__dict__[name]
        if "dense" in follower.__dict__ and follower.live is not None:
            before = self.live if self.live is not None else np.ones(entry.rows, bool)
            follower.dense.mark_deleted(np.flatnonzero(before & ~follower.live))
        return follower

    def close(self) -> None:
        self.db.close()


def read_deletes(path: Path, rows: int) -> tuple[frozenset[str], Mask]:
    with np.load(path, allow_pickle=False) as data:
        live = ~np.unpackbits(data["deleted"], count=rows).astype(bool)
        return frozenset(str(d) for d in data["docs"].tolist()), live


def write_deletes(segment: Path, generation: int, docs: Iterable[str], deleted: npt.NDArray[np.bool_]) -> str:
    """A new deletion file for `segment` (the union of what was deleted so far); returns its file name."""
    name = f"deletes-{generation:06d}.npz"
    doc_array = np.asarray(sorted(docs), dtype=str)
    temporary = segment / (name + ".tmp")
    with open(temporary, "wb") as handle:
        np.savez(handle, deleted=np.packbits(deleted), docs=doc_array)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, segment / name)
    fsync_dir(segment)  # the rename itself must be durable before a generation names the file
    return name


def collect_garbage(root: Path, referenced: dict[str, str | None]) -> None:
    """Remove segments and deletion files the live generation does not name, and leftover partials."""
    folder = segments_dir(root)
    if not folder.exists():
        return
    for path in folder.iterdir():
        name = path.name
        if name not in referenced:
            shutil.rmtree(path, ignore_errors=True)
            continue
        for deletes in path.glob("deletes-*"):
            if deletes.name != referenced[name]:
                deletes.unlink(missing_ok=True)
