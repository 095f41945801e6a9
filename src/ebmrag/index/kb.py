"""A knowledge base directory: writes add segments and deletions, reads open the live generation.

A write (upsert / delete) chunks and embeds only the changed documents into one new segment (several
when it holds more than `segment_rows` chunks), records the replaced or deleted documents in deletion
bitmaps of the segments holding them, and commits a new generation naming the segments in force. Its
cost follows the changed documents, not the size of the knowledge base; BM25 statistics are global
at query time (`lexical.py`), so scores do not depend on how rows are split. A tiered merge policy
(`merge.py`) keeps the segment count bounded; `compact()` merges everything into one segment.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import IngestError, KnowledgeBaseError
from ebmrag.index import generations, merge, store
from ebmrag.index.analyzer import Analyzer
from ebmrag.index.dense import HNSW_FILE
from ebmrag.index.lexical import TermCounts
from ebmrag.index.params import KnowledgeBaseConfig, StorageSettings
from ebmrag.index.prepare import EmbeddingPipeline, LocalPipeline, PreparedBatch, index_text
from ebmrag.index.reader import FORMAT_VERSION, MANIFEST, REBUILD, Reader, load_manifest, read_manifest
from ebmrag.index.segment import SegmentBuilder, SegmentEntry, collect_garbage, next_name, write_deletes
from ebmrag.index.types import IngestReport, KnowledgeBaseStats
from ebmrag.ingest.documents import Document
from ebmrag.models.embeddings import SentenceEmbedder, vectors_mismatch
from ebmrag.protocols import Progress

__all__ = ["IngestReport", "KnowledgeBase", "Reader", "index_text", "kb_embedder", "require_readable"]

# What a first write that crashed can leave in a directory before it has a CURRENT file (module doc of generations)
_LEFTOVERS = re.compile(r"^(\.lock|CURRENT\.tmp|segments|gen-\d{6}\.partial)$")
_GENERATION = re.compile(r"^gen-\d{6}$")


def kb_embedder(config: KnowledgeBaseConfig, cache_dir: str | Path | None = None) -> SentenceEmbedder:
    """The embedder a knowledge base was built with (its manifest's model, length, precision and runtime)."""
    return SentenceEmbedder(config.embedding_model or None, cache_dir=cache_dir,
                            max_tokens=config.embedding_max_tokens, precision=config.embedding_precision,
                            runtime=config.embedding_runtime)


def _refuse_foreign(root: Path) -> None:
    """A directory without CURRENT becomes a new knowledge base only when it is empty or holds what a crashed first
    write leaves: never over other files, nor over a knowledge base that lost its CURRENT file (its generations
    would be garbage-collected by the first write)."""
    names = sorted(p.name for p in root.iterdir() if not _LEFTOVERS.match(p.name))
    if any(_GENERATION.match(name) for name in names):
        raise KnowledgeBaseError(f"{root} holds generations but no CURRENT file naming the live one: the knowledge "
                                 f"base is damaged; {REBUILD}")
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise KnowledgeBaseError(f"{root} is not a knowledge base and not empty ({shown}): give a new or empty "
                                 "directory (ebmrag never writes a knowledge base over other files)")


def require_readable(root: Path) -> None:
    """Raise now, in one line naming what to run, unless `root` holds a knowledge base this ebmrag reads as it is:
    what a service checks at start-up (opening one is lazy), and a command before it loads a model."""
    if root.exists() and not root.is_dir():
        raise KnowledgeBaseError(f"{root} exists and is not a directory")
    live = generations.current_generation(root) if root.is_dir() else None
    if live is None:
        if root.is_dir():
            _refuse_foreign(root)
        raise KnowledgeBaseError(f"{root} holds no knowledge base yet; create it with "
                                 f"`ebmrag ingest FILES --kb {root}`")
    read_manifest(live)


class KnowledgeBase:
    """Writer and reader of one knowledge-base directory."""

    def __init__(self, root: str | Path, config: KnowledgeBaseConfig | None = None,
                 cache_dir: str | Path | None = None, embedder: SentenceEmbedder | None = None,
                 storage: StorageSettings | None = None) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise KnowledgeBaseError(f"{self.root} exists and is not a directory")
        live = generations.current_generation(self.root) if self.root.exists() else None
        if live is None and self.root.exists():
            _refuse_foreign(self.root)
        manifest = load_manifest(live) if live else None  # a newer or unknown format is refused here
        stored = KnowledgeBaseConfig.from_manifest(manifest["config"], live) if manifest and live else None
        self.format: int = manifest["format"] if manifest else FORMAT_VERSION  # older: only `compact` reads it
        if stored and config and stored != config:
            raise KnowledgeBaseError(f"{self.root} was built with {stored}; it cannot be opened with {config}")
        self.config = stored or config or KnowledgeBaseConfig()
        self.storage = storage or StorageSettings()
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.embedder = embedder or kb_embedder(self.config, cache_dir)
        self.analyzer = Analyzer()  # query terms; chunks are analysed by the same rules in `prepare`
        self._reader: Reader | None = None
        self._readers = threading.Lock()  # the reader's swap to a new generation, and the counts below
        self._users: dict[Reader, int] = {}  # searches in progress per reader (`pinned`)
        self._retired: set[Reader] = set()  # superseded readers still in use: closed when their last search ends
        self._pins = threading.local()  # this thread's pinned reader

    @property
    def exists(self) -> bool:
        return self.root.exists() and generations.current_generation(self.root) is not None

    def reader(self) -> Reader:
        """The live generation's reader (this thread's pinned one inside `pinned`)."""
        held: Reader | None = getattr(self._pins, "reader", None)
        if held is not None:
            return held
        with self._readers:
            return self._current()

    @contextmanager
    def pinned(self) -> Iterator[Reader]:
        """One generation for a whole search: inside the block `reader()` returns it in this thread, whatever
        another thread or process writes meanwhile (a search's rows are only valid in the generation that
        produced them), and its files stay open until the last search using it ends."""
        held: Reader | None = getattr(self._pins, "reader", None)
        if held is not None:
            yield held
            return
        with self._readers:
            reader = self._current()
            self._users[reader] = self._users.get(reader, 0) + 1
        self._pins.reader = reader
        try:
            yield reader
        finally:
            self._pins.reader = None
            with self._readers:
                self._users[reader] -= 1
                if not self._users[reader]:
                    del self._users[reader]
                    if reader in self._retired:
                        self._retired.discard(reader)
                        self._close_unused(reader)

    def _current(self) -> Reader:
        """Under self._readers: the reader, moved on to the live generation when the knowledge base has."""
        live = generations.current_generation(self.root) if self.root.exists() else None
        if live is None:
            raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; create it with `ebmrag ingest`")
        if self._reader is None or self._reader.path != live:
            self._check_model(read_manifest(live))  # before the swap: a refused generation is never read
            previous = self._reader
            self._reader = Reader(live, self.config, previous)
            if previous is not None and previous in self._users:
                self._retired.add(previous)  # a search still reads it: closed when the search ends
            elif previous is not None:
                self._close_unused(previous)  # the KB moved on: release what is no longer named
        return self._reader

    def _close_unused(self, old: Reader) -> None:
        """Close `old`'s segments except those the current reader or a search in progress still uses."""
        in_use = [s for reader in (self._reader, *self._users) if reader is not None for s in reader.segments]
        old.close(keep=in_use)

    def _check_model(self, manifest: dict[str, Any]) -> None:
        """Queries must be embedded by the model, runtime and precision the chunks were: another delta, folder,
        runtime or int8 would rank silently wrong. The length may differ, and torch's fp32 and bf16 (chosen per
        machine) are one family."""
        why = vectors_mismatch(str(manifest["embedding_model"]), self.embedder.model_name)
        if why:
            raise KnowledgeBaseError(f"{self.root} {why}. Rebuild the knowledge base or open it with its own settings")

    def to_dict(self) -> dict[str, Any]:
        """Where the KB is; its build settings live in its manifest, not here."""
        return {"root": str(self.root), "cache_dir": str(self.cache_dir) if self.cache_dir else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | str, embedder: SentenceEmbedder | None = None) -> KnowledgeBase:
        """`data` is `to_dict()` (or a bare path); `embedder` shares a model instance of the same profile."""
        spec = {"root": data} if isinstance(data, str) else dict(data)
        return cls(spec["root"], cache_dir=spec.get("cache_dir"), embedder=embedder)

    def _release(self) -> None:
        """After a write: move the open reader on to the new generation (segments it still names are carried
        over with their loaded indexes; the rest are closed)."""
        if self._reader is not None:
            self.reader()

    def apply(self, documents: Sequence[Document], delete_ids: Sequence[str] = (),
              origins: dict[str, str] | None = None, progress: Progress | None = None,
              pipeline: EmbeddingPipeline | None = None) -> IngestReport:
        """Upsert `documents` and delete `delete_ids` in one new generation (none if nothing changed). With no
        document to add, a path that is not a knowledge base yet is an error, not a new empty directory.
        `pipeline` chunks and embeds the changed documents (default: on this machine)."""
        if not documents and not self.exists:
            raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; nothing to delete or add there")
        report = IngestReport()
        with generations.writer_lock(self.root):
            live, catalog = self._open_for_writing()
            try:
                wanted = list(dict.fromkeys([*(d.doc_id for d in documents), *delete_ids]))
                old_docs = catalog.content_hashes(wanted) if catalog else {}
                incoming = classify(documents, delete_ids, old_docs, report)
                report.generation = generations.generation_number(live)
                if not report.changed:
                    report.chunks_total = catalog.live_chunks if catalog else 0
                    return report
                number = report.generation + 1
                changed = set(report.added) | set(report.updated)
                fresh = [d for d in incoming if d.doc_id in changed]
                entries = _tombstone(catalog, old_docs, set(report.updated) | set(report.deleted), number)
                pipeline = pipeline or LocalPipeline(self.embedder, self.storage.workers)
                new_entries = _SegmentWriter(self, progress).write(fresh, pipeline, origins or {}, report)
                report.seconds_embedding = pipeline.seconds_embedding
            finally:
                if catalog is not None:
                    catalog.close()
            final = entries + new_entries
            self._commit(number, final)
            report.chunks_written = sum(e.rows for e in new_entries)
            report.chunks_total = sum(e.live for e in final)
            report.segments_merged, report.generation = self._merge_tiers(final, number)
        self._release()
        return report

    def compact(self, progress: Progress | None = None) -> IngestReport:
        """Merge every segment into one without deleted rows (and convert an older on-disk format)."""
        report = IngestReport()
        with generations.writer_lock(self.root):
            live = generations.current_generation(self.root)
            if live is None:
                raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; nothing to compact")
            generations.remove_partials(self.root)
            report.generation = generations.generation_number(live)
            if load_manifest(live)["format"] == 1:
                if not (live / store.DB_FILE).exists():
                    raise KnowledgeBaseError(f"{self.root} records knowledge-base format 1 but {live.name} holds no "
                                             f"format-1 index ({store.DB_FILE}): it is damaged; {REBUILD}")
                entries = [merge.convert_format_1(self.root, live)]
            else:
                entries = [SegmentEntry.from_json(e) for e in read_manifest(live)["segments"]]
                if len(entries) < 2 and not any(e.deletes for e in entries):
                    report.chunks_total = sum(e.live for e in entries)
                    return report
                report.segments_merged = len(entries)
                entries = [merge.merge_segments(self.root, entries, self.config, progress)]
            report.generation += 1
            self._commit(report.generation, entries)
            report.chunks_total = sum(e.live for e in entries)
        self._release()
        return report

    def stats(self) -> KnowledgeBaseStats:
        with self.pinned() as reader:
            return self._stats(reader)

    def _stats(self, reader: Reader) -> KnowledgeBaseStats:
        by_type, by_authority = KnowledgeBaseStats.tally(reader.documents().values())
        folders = [reader.path, *(s.path for s in reader.segments)]
        size = sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file())
        return KnowledgeBaseStats(
            str(self.root), generations.generation_number(reader.path), sum(by_type.values()), reader.live_chunks,
            len(reader.segments), reader.size - reader.live_chunks, size, str(reader.manifest["embedding_model"]),
            str(reader.manifest["created"]), by_type, by_authority,
            any((s.path / HNSW_FILE).exists() for s in reader.segments))

    def _open_for_writing(self) -> tuple[Path | None, Reader | None]:
        """Leftovers of a crashed writer go first; then the live generation's catalog (no search index loads)."""
        generations.remove_partials(self.root)
        live = generations.current_generation(self.root)
        if live is None:
            collect_garbage(self.root, {})
            return None, None
        catalog = Reader(live, self.config)
        collect_garbage(self.root, {s.entry.name: s.entry.deletes for s in catalog.segments})
        return live, catalog

    def _commit(self, number: int, entries: list[SegmentEntry]) -> None:
        partial = self.root / f"gen-{number:06d}.partial"
        partial.mkdir()
        try:
            manifest = {"format": FORMAT_VERSION, "config": asdict(self.config), "dim": self.embedder.dimension,
                        "embedding_model": self.embedder.model_name, "segments": [e.to_json() for e in entries],
                        "chunks": sum(e.live for e in entries),
                        "created": datetime.now(UTC).isoformat(timespec="seconds")}
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
            generations.commit(self.root, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        collect_garbage(self.root, {e.name: e.deletes for e in entries})

    def _merge_tiers(self, entries: list[SegmentEntry], number: int) -> tuple[int, int]:
        """Apply the merge policy until it is satisfied; each merge is its own committed generation."""
        merged = 0
        while self.storage.merge_factor and (group := merge.plan(entries, self.storage.merge_factor)):
            combined = merge.merge_segments(self.root, [entries[i] for i in group], self.config)
            absorbed = set(group[1:])
            entries = [combined if i == group[0] else e for i, e in enumerate(entries) if i not in absorbed]
            number += 1
            self._commit(number, entries)
            merged += len(group)
        return merged, number


def classify(documents: Sequence[Document], delete_ids: Sequence[str], old_docs: dict[str, tuple[str, Any]],
             report: IngestReport) -> list[Document]:
    """Sort a write's documents into added / updated / unchanged (by content hash) and its deletions, into
    `report`; `old_docs` maps the stored ones it names to (content hash, where they are). Returns the batch
    without duplicate ids (each reported)."""
    incoming = _dedupe(documents, report)
    for doc in incoming:
        previous = old_docs.get(doc.doc_id)
        bucket = report.added if previous is None else (
            report.unchanged if previous[0] == doc.content_hash else report.updated)
        bucket.append(doc.doc_id)
    incoming_ids = {d.doc_id for d in incoming}
    for doc_id in dict.fromkeys(delete_ids):
        if doc_id in old_docs and doc_id not in incoming_ids:
            report.deleted.append(doc_id)
        elif doc_id not in old_docs:
            report.errors.append(IngestError(doc_id, "not in the knowledge base; nothing to delete"))
    return incoming


def _dedupe(documents: Sequence[Document], report: IngestReport) -> list[Document]:
    seen: dict[str, Document] = {}
    for doc in documents:
        if doc.doc_id in seen:
            report.errors.append(IngestError(f"{doc.source}#{doc.doc_id}",
                                             "duplicate doc_id in this batch; the first occurrence was kept"))
            continue
        seen[doc.doc_id] = doc
    return list(seen.values())


def _tombstone(catalog: Reader | None, old_docs: dict[str, tuple[str, int]], replaced: set[str],
               number: int) -> list[SegmentEntry]:
    """The live segments with `replaced` documents added to their deletions (a new deletion file for each
    segment touched); a segment left with no live row is dropped."""
    if catalog is None:
        return []
    by_segment: dict[int, list[str]] = {}
    for doc_id in replaced:
        by_segment.setdefault(old_docs[doc_id][1], []).append(doc_id)
    entries = []
    for i, segment in enumerate(catalog.segments):
        entry = segment.entry
        if i in by_segment:
            deleted = np.zeros(entry.rows, bool) if segment.live is None else ~segment.live
            deleted[store.rows_of_documents(segment.db, by_segment[i])] = True
            if deleted.all():
                continue
            name = write_deletes(segment.path, number, segment.deleted_docs | set(by_segment[i]), deleted)
            entry = SegmentEntry(entry.name, entry.rows, entry.rows - int(deleted.sum()), name)
        entries.append(entry)
    return entries


class _SegmentWriter:
    """Fresh documents -> new segments: prepared in worker processes, embedded here, flushed every
    `segment_rows` chunks so memory stays bounded whatever the batch size."""

    def __init__(self, kb: KnowledgeBase, progress: Progress | None) -> None:
        self.kb = kb
        self.progress: Callable[[str, int, int], None] = progress or (lambda stage, done, total: None)

    def write(self, fresh: list[Document], pipeline: EmbeddingPipeline, origins: dict[str, str],
              report: IngestReport) -> list[SegmentEntry]:
        if not fresh:
            return []
        kb, entries = self.kb, list[SegmentEntry]()
        by_id = {d.doc_id: d for d in fresh}
        builder, parts, vectors = SegmentBuilder(kb.root, next_name(kb.root)), [], []
        try:
            done = 0
            for batch, batch_vectors in pipeline.run(fresh, kb.config.chunker, kb.config.contextual_prefix):
                vectors.append(batch_vectors)
                started = time.perf_counter()
                self._add(builder, batch, by_id, origins)
                parts.append(batch.counts)
                report.seconds_indexing += time.perf_counter() - started
                done += len(batch.chunks_per_document)
                self.progress("documents", done, len(fresh))
                if self._full(builder.rows, sum(e.rows for e in entries) + builder.rows, done, len(fresh)):
                    entries.append(self._finish(builder, parts, vectors, report))
                    builder, parts, vectors = SegmentBuilder(kb.root, next_name(kb.root)), [], []
            entries.append(self._finish(builder, parts, vectors, report))
        except BaseException:
            builder.abandon()
            raise
        return entries

    def _full(self, rows: int, written: int, done: int, total: int) -> bool:
        """Flush at `segment_rows`, unless what is left would make a tail of under a quarter of that (it joins
        this segment instead: a tiny segment costs a search per query until a merge removes it)."""
        limit = self.kb.storage.segment_rows
        left = (total - done) * written / max(done, 1)  # chunks still to come, at this write's rate so far
        return rows >= limit and left >= limit / 4

    @staticmethod
    def _add(builder: SegmentBuilder, batch: PreparedBatch, by_id: dict[str, Document],
             origins: dict[str, str]) -> None:
        builder.add_documents(_document_row(by_id[doc_id], origins.get(doc_id, by_id[doc_id].source), n)
                              for doc_id, n in batch.chunks_per_document.items())
        start = builder.rows
        builder.add_chunks([replace(c, row=start + c.row) for c in batch.chunks])

    def _finish(self, builder: SegmentBuilder, parts: list[TermCounts], vectors: list[np.ndarray],
                report: IngestReport) -> SegmentEntry:
        started = time.perf_counter()
        self.progress("indexing", 0, 1)
        dim = self.kb.embedder.dimension
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)
        entry = builder.finish(TermCounts.concat(parts), matrix, self.kb.config.hnsw_min_rows)
        self.progress("indexing", 1, 1)
        report.seconds_indexing += time.perf_counter() - started
        return entry


def _document_row(doc: Document, origin: str, n_chunks: int) -> store.DocumentRow:
    return store.DocumentRow(doc.doc_id, doc.content_hash, doc.source, doc.source_type, doc.title, doc.date,
                             doc.authority, origin, json.dumps(dict(doc.metadata), ensure_ascii=False), n_chunks,
                             datetime.now(UTC).isoformat(timespec="seconds"))
