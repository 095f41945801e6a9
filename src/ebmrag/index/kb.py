"""A knowledge base directory: ingest (upsert / delete) into a new generation, open the live one for search.

Every write builds a complete new generation from the old one plus the changes: kept chunks are
copied with their vectors (no re-embedding), changed documents are re-chunked and embedded, deleted
ones are simply not copied, so no chunk, vector or posting of a removed document survives. Cost of
a write is O(total chunks) for copying and re-indexing plus O(changed chunks) for embedding.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.config import KnowledgeBaseConfig
from ebmrag.errors import IngestError, KnowledgeBaseError
from ebmrag.evidence.embeddings import SentenceEmbedder
from ebmrag.evidence.tokens import HuggingFaceTokenCounter
from ebmrag.index import generations, store
from ebmrag.index.analyzer import Analyzer
from ebmrag.index.dense import DenseIndex
from ebmrag.index.lexical import LexicalIndex
from ebmrag.ingest.chunking import Chunk, ChunkerBySource
from ebmrag.ingest.documents import Document
from ebmrag.protocols import Progress, Vectors

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[IngestError] = field(default_factory=list)
    chunks_written: int = 0
    chunks_total: int = 0
    generation: int = 0
    seconds_embedding: float = 0.0
    seconds_indexing: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.deleted)


def kb_embedder(config: KnowledgeBaseConfig, cache_dir: str | Path | None = None) -> SentenceEmbedder:
    """The embedder a knowledge base was built with (its manifest's model, length and precision)."""
    return SentenceEmbedder(config.embedding_model or None, cache_dir=cache_dir,
                            max_tokens=config.embedding_max_tokens, precision=config.embedding_precision)


def index_text(document: Document | store.DocumentRow, chunk: Chunk | store.ChunkRow, prefix: bool) -> str:
    """What the retrievers see: the chunk, headed by its document title and section (field context)."""
    if not prefix:
        return chunk.text
    head = " — ".join(part for part in (document.title, chunk.section) if part)
    return f"{head}\n{chunk.text}" if head else chunk.text


def read_manifest(generation: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((generation / MANIFEST).read_text(encoding="utf-8"))
    if data.get("format") != FORMAT_VERSION:
        raise KnowledgeBaseError(f"{generation}: index format {data.get('format')} is not {FORMAT_VERSION}")
    return data


class KnowledgeBase:
    """Writer and reader of one knowledge-base directory."""

    def __init__(self, root: str | Path, config: KnowledgeBaseConfig | None = None,
                 cache_dir: str | Path | None = None, embedder: SentenceEmbedder | None = None) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise KnowledgeBaseError(f"{self.root} exists and is not a directory")
        live = generations.current_generation(self.root) if self.root.exists() else None
        stored = KnowledgeBaseConfig.from_manifest(read_manifest(live)["config"], live) if live else None
        if stored and config and stored != config:
            raise KnowledgeBaseError(f"{self.root} was built with {stored}; it cannot be opened with {config}")
        self.config = stored or config or KnowledgeBaseConfig()
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.embedder = embedder or kb_embedder(self.config, cache_dir)
        self.analyzer = Analyzer()
        self._reader: Reader | None = None

    @property
    def exists(self) -> bool:
        return self.root.exists() and generations.current_generation(self.root) is not None

    def reader(self) -> Reader:
        live = generations.current_generation(self.root) if self.root.exists() else None
        if live is None:
            raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; create it with `ebmrag ingest`")
        if self._reader is None or self._reader.path != live:
            if self._reader is not None:
                self._reader.close()  # the KB moved on to a newer generation: release the old one's SQLite
            self._reader = Reader(live, self.config)
            self._check_model(self._reader.manifest)
        return self._reader

    def _check_model(self, manifest: dict[str, Any]) -> None:
        """Queries must be embedded by the model the chunks were: a different one (another delta, another folder)
        would rank silently wrong. Length and precision suffixes may differ (bf16 is chosen per machine)."""
        built, ours = str(manifest["embedding_model"]).split("|")[0], self.embedder.model_name.split("|")[0]
        if built != ours:
            raise KnowledgeBaseError(f"{self.root} was embedded with {built}; this embedder is {ours}. "
                                     "Rebuild the knowledge base or open it with its own settings")

    def to_dict(self) -> dict[str, Any]:
        """Where the KB is; its build settings live in its manifest, not here."""
        return {"root": str(self.root), "cache_dir": str(self.cache_dir) if self.cache_dir else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | str, embedder: SentenceEmbedder | None = None) -> KnowledgeBase:
        """`data` is `to_dict()` (or a bare path); `embedder` shares a model instance of the same profile."""
        spec = {"root": data} if isinstance(data, str) else dict(data)
        return cls(spec["root"], cache_dir=spec.get("cache_dir"), embedder=embedder)

    def apply(self, documents: Sequence[Document], delete_ids: Sequence[str] = (),
              origins: dict[str, str] | None = None, progress: Progress | None = None) -> IngestReport:
        """Upsert `documents` and delete `delete_ids` in one new generation (none if nothing changed). With no
        document to add, a path that is not a knowledge base yet is an error, not a new empty directory."""
        if not documents and not self.exists:
            raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; nothing to delete or add there")
        report = IngestReport()
        with generations.writer_lock(self.root):
            generations.remove_partials(self.root)
            live = generations.current_generation(self.root)
            old_docs = _old_documents(live)
            incoming = _dedupe(documents, report)
            for doc in incoming:
                previous = old_docs.get(doc.doc_id)
                bucket = report.added if previous is None else (
                    report.unchanged if previous.content_hash == doc.content_hash else report.updated)
                bucket.append(doc.doc_id)
            incoming_ids = {d.doc_id for d in incoming}
            for doc_id in dict.fromkeys(delete_ids):
                if doc_id in old_docs and doc_id not in incoming_ids:
                    report.deleted.append(doc_id)
                elif doc_id not in old_docs:
                    report.errors.append(IngestError(doc_id, "not in the knowledge base; nothing to delete"))
            report.generation = generations.generation_number(live)
            if not report.changed:
                report.chunks_total = sum(d.n_chunks for d in old_docs.values())
                return report
            changed = set(report.added) | set(report.updated)
            fresh = [d for d in incoming if d.doc_id in changed]
            partial = generations.new_partial(self.root)
            try:
                _GenerationWriter(self, partial, live, progress).write(old_docs, fresh, report, origins or {})
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            report.generation = generations.generation_number(generations.commit(self.root, partial))
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        return report


def _old_documents(live: Path | None) -> dict[str, store.DocumentRow]:
    if live is None:
        return {}
    db = store.open_readonly(live)
    try:
        return store.documents(db)
    finally:
        db.close()


def _dedupe(documents: Sequence[Document], report: IngestReport) -> list[Document]:
    seen: dict[str, Document] = {}
    for doc in documents:
        if doc.doc_id in seen:
            report.errors.append(IngestError(f"{doc.source}#{doc.doc_id}",
                                             "duplicate doc_id in this batch; the first occurrence was kept"))
            continue
        seen[doc.doc_id] = doc
    return list(seen.values())


class _GenerationWriter:
    def __init__(self, kb: KnowledgeBase, partial: Path, live: Path | None, progress: Progress | None) -> None:
        self.kb, self.partial, self.live = kb, partial, live
        self.progress = progress or (lambda stage, done, total: None)

    def write(self, old_docs: dict[str, store.DocumentRow], fresh: list[Document], report: IngestReport,
              origins: dict[str, str]) -> None:
        replaced = {d.doc_id for d in fresh} | set(report.deleted)
        db = store.create(self.partial)
        kept_terms, kept_vectors = self._copy_kept(db, old_docs, replaced)
        started = time.perf_counter()
        new_rows, new_vectors = self._new_chunks(fresh, start_row=len(kept_terms))
        report.seconds_embedding = time.perf_counter() - started
        started = time.perf_counter()
        per_document = Counter(row.doc_id for row in new_rows)
        store.insert_documents(db, [_document_row(d, origins.get(d.doc_id, d.source), per_document[d.doc_id])
                                    for d in fresh])
        store.insert_chunks(db, new_rows)
        terms = kept_terms + [row.terms.split(" ") if row.terms else [] for row in new_rows]
        vectors = np.concatenate([kept_vectors, new_vectors]) if len(new_vectors) else kept_vectors
        self._write_indexes(terms, vectors)
        store.seal(db)
        report.chunks_written = len(new_rows)
        report.chunks_total = len(terms)
        self._write_manifest(report.chunks_total, vectors.shape[1])
        report.seconds_indexing = time.perf_counter() - started

    def _copy_kept(self, db: sqlite3.Connection, old_docs: dict[str, store.DocumentRow],
                   replaced: set[str]) -> tuple[list[list[str]], Vectors]:
        dim = self.kb.embedder.dimension
        if self.live is None:
            return [], np.zeros((0, dim), np.float32)
        store.insert_documents(db, [row for doc_id, row in old_docs.items() if doc_id not in replaced])
        old_db = store.open_readonly(self.live)
        old_vectors = DenseIndex.load(self.live, dim).vectors
        kept_old_rows: list[int] = []
        terms: list[list[str]] = []
        batch: list[store.ChunkRow] = []
        for chunk in store.iter_chunks(old_db):
            if chunk.doc_id in replaced:
                continue
            batch.append(replace(chunk, row=len(terms)))
            kept_old_rows.append(chunk.row)
            terms.append(chunk.terms.split(" ") if chunk.terms else [])
            if len(batch) >= 5000:
                store.insert_chunks(db, batch)
                batch.clear()
        store.insert_chunks(db, batch)
        old_db.close()
        return terms, np.asarray(old_vectors[np.asarray(kept_old_rows, dtype=np.int64)], dtype=np.float32)

    def _new_chunks(self, fresh: list[Document], start_row: int) -> tuple[list[store.ChunkRow], Vectors]:
        kb = self.kb
        chunker = ChunkerBySource(HuggingFaceTokenCounter(), kb.config.chunker)
        rows: list[store.ChunkRow] = []
        texts: list[str] = []
        for doc in fresh:
            for chunk in chunker.chunk(doc):
                text = index_text(doc, chunk, kb.config.contextual_prefix)
                texts.append(text)
                rows.append(store.ChunkRow(
                    start_row + len(rows), chunk.chunk_id, doc.doc_id, chunk.position, chunk.section, chunk.section_id,
                    chunk.char_start, chunk.char_end, chunk.text, " ".join(kb.analyzer.terms(text)), doc.source,
                    doc.date, doc.authority))
        vectors = [np.zeros((0, kb.embedder.dimension), np.float32)]
        step = 512
        for start in range(0, len(texts), step):
            self.progress("embedding", start, len(texts))
            vectors.append(kb.embedder.embed(texts[start:start + step]))
        self.progress("embedding", len(texts), len(texts))
        return rows, np.concatenate(vectors)

    def _write_indexes(self, terms: list[list[str]], vectors: Vectors) -> None:
        self.progress("indexing", 0, 1)
        lexical = LexicalIndex(self.kb.config.k1, self.kb.config.b)
        lexical.build(terms)
        lexical.save(self.partial / "bm25")
        DenseIndex.write(self.partial, vectors, self.kb.config.hnsw_min_rows)
        self.progress("indexing", 1, 1)

    def _write_manifest(self, chunks: int, dim: int) -> None:
        manifest = {"format": FORMAT_VERSION, "config": asdict(self.kb.config), "chunks": chunks, "dim": dim,
                    "embedding_model": self.kb.embedder.model_name,
                    "created": datetime.now(UTC).isoformat(timespec="seconds")}
        (self.partial / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def _document_row(doc: Document, origin: str, n_chunks: int) -> store.DocumentRow:
    return store.DocumentRow(doc.doc_id, doc.content_hash, doc.source, doc.source_type, doc.title, doc.date,
                             doc.authority, origin, json.dumps(dict(doc.metadata), ensure_ascii=False), n_chunks,
                             datetime.now(UTC).isoformat(timespec="seconds"))


class Reader:
    """The live generation opened read-only: SQLite, BM25 (memory-mapped) and vectors (memory-mapped)."""

    def __init__(self, path: Path, config: KnowledgeBaseConfig) -> None:
        self.path = path
        self.manifest = read_manifest(path)
        self.db = store.open_readonly(path)
        self.size = int(self.manifest["chunks"])
        self.lexical = LexicalIndex.load(path / "bm25", self.size, config.k1, config.b)
        self.dense = DenseIndex.load(path, int(self.manifest["dim"]))

    def close(self) -> None:
        self.db.close()


@dataclass(frozen=True)
class KnowledgeBaseStats:
    path: str
    generation: int
    documents: int
    chunks: int
    bytes_on_disk: int
    embedding_model: str
    created: str
    by_source_type: dict[str, int]
    by_authority: dict[str, int]
    hnsw: bool


def knowledge_base_stats(kb: KnowledgeBase) -> KnowledgeBaseStats:
    reader = kb.reader()
    db = reader.db
    by_type = dict(db.execute("SELECT source_type, COUNT(*) FROM documents GROUP BY source_type").fetchall())
    by_authority = dict(db.execute("SELECT authority, COUNT(*) FROM documents GROUP BY authority").fetchall())
    size = sum(f.stat().st_size for f in reader.path.rglob("*") if f.is_file())
    return KnowledgeBaseStats(
        str(kb.root), generations.generation_number(reader.path), sum(by_type.values()), reader.size, size,
        str(reader.manifest["embedding_model"]), str(reader.manifest["created"]), by_type, by_authority,
        (reader.path / "dense.hnsw").exists(),
    )
