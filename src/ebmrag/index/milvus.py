"""The Milvus backend: a knowledge base as two collections on a Milvus server, for corpora past one machine.

`<name>_chunks` holds one entity per chunk: its citation fields, its vector (HNSW, inner product) and its
BM25 terms, scored by Milvus's built-in BM25 function. `<name>_documents` holds one entity per document
(doc id, content hash, metadata) and the knowledge base's manifest (build settings, embedding model).

BM25 parity: Milvus analyses text with its own tokenizers, which would give other terms than ours (stems,
stop words, jieba for Chinese). So chunks are analysed here, as for the embedded backend, and each term is
written as an opaque alphanumeric token (a hash) that Milvus's standard tokenizer keeps whole. Milvus then
counts exactly our terms, and its BM25 (Lucene idf, k1, b, over live rows) equals ours. Dense and BM25
routes are searched apart and fused by our fusion, so a query ranks the same way on both backends up to
HNSW approximation.

Writes: a changed document's new chunks are inserted, stamped with this write's id, before its old chunks
are deleted and its document entity (with the new content hash) is upserted last. A crash part-way leaves
the old content hash in place, so the next ingest of the same files redoes that document; readers may
briefly see both versions of a document being replaced, never neither. Milvus compacts deletions itself;
`compact()` asks it to now.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.errors import IngestError, KnowledgeBaseError, require_extra
from ebmrag.index import store
from ebmrag.index.analyzer import Analyzer
from ebmrag.index.kb import classify, kb_embedder
from ebmrag.index.lexical import Rows, Scores
from ebmrag.index.milvus_schema import LIMITS, create_collections
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.index.prepare import EmbeddingPipeline, LocalPipeline, PreparedBatch
from ebmrag.index.types import Filters, IngestReport, KnowledgeBaseStats
from ebmrag.ingest.documents import Document
from ebmrag.models.embeddings import SentenceEmbedder, vectors_mismatch
from ebmrag.protocols import Progress

MANIFEST_ID = "__ebmrag_manifest__"
FORMAT = "ebmrag-milvus/1"
_BATCH = 500


def term_token(term: str) -> str:
    """An analysed term as a token Milvus's standard tokenizer keeps whole and no other term maps to."""
    return "t" + hashlib.blake2b(term.encode("utf-8"), digest_size=8).hexdigest()


def collection_name(name: str) -> str:
    """A Milvus collection name (letters, digits, underscores, not starting with a digit) from a KB name."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name) or "ebmrag"
    return clean if not clean[0].isdigit() else f"kb_{clean}"


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _in(field: str, values: Sequence[str]) -> str:
    return f"{field} in [{', '.join(_quoted(v) for v in values)}]"


class MilvusKnowledgeBase:
    """A knowledge base in Milvus with the interface of `kb.KnowledgeBase` (see `backend.KnowledgeStore`)."""

    def __init__(self, uri: str, name: str, config: KnowledgeBaseConfig | None = None,
                 cache_dir: str | Path | None = None, embedder: SentenceEmbedder | None = None,
                 workers: int = 0) -> None:
        pymilvus = require_extra("pymilvus", "milvus", "the Milvus knowledge-base backend")
        self.uri, self.name = uri, collection_name(name)
        self.chunks, self.documents = f"{self.name}_chunks", f"{self.name}_documents"
        try:
            self.client = pymilvus.MilvusClient(uri=uri, timeout=10)
            stored = self._manifest()
        except pymilvus.MilvusException as exc:
            raise KnowledgeBaseError(f"Milvus at {uri}: {exc.message}") from exc
        except Exception as exc:  # grpc raises its own types for an unreachable server
            raise KnowledgeBaseError(f"Milvus at {uri} did not answer: {exc}") from exc
        stored_config = KnowledgeBaseConfig.from_manifest(stored["config"], Path(name)) if stored else None
        if stored_config and config and stored_config != config:
            raise KnowledgeBaseError(f"{self.root} was built with {stored_config}; it cannot be opened with {config}")
        self.config = stored_config or config or KnowledgeBaseConfig()
        self.embedder = embedder or kb_embedder(self.config, cache_dir)
        self.analyzer = Analyzer()
        self.workers, self.cache_dir = workers, cache_dir
        self._reader: MilvusReader | None = None
        why = vectors_mismatch(str(stored["embedding_model"]), self.embedder.model_name) if stored else None
        if why:
            raise KnowledgeBaseError(f"{self.root} {why}")

    @property
    def root(self) -> str:
        return f"{self.uri}#{self.name}"

    @property
    def exists(self) -> bool:
        return bool(self.client.has_collection(self.chunks))

    def _manifest(self) -> dict[str, Any] | None:
        """The stored manifest, or None for a new knowledge base. Loads both collections into the server's
        memory first: after a server restart they are released, and Milvus refuses queries until loaded."""
        if not self.client.has_collection(self.documents):
            return None
        for collection in (self.documents, self.chunks):
            if self.client.has_collection(collection):
                self.client.load_collection(collection)
        found = self.client.query(self.documents, filter=f"doc_id == {_quoted(MANIFEST_ID)}",
                                  output_fields=["metadata"])
        return json.loads(found[0]["metadata"]) if found else None

    def reader(self) -> MilvusReader:
        """One reader per write: callers key caches on it (the focus extractor), as on a generation's."""
        if self._reader is None:
            if not self.exists:
                raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; create it with `ebmrag ingest`")
            self._reader = MilvusReader(self)
        return self._reader

    def to_dict(self) -> dict[str, Any]:
        return {"backend": "milvus", "uri": self.uri, "name": self.name,
                "cache_dir": str(self.cache_dir) if self.cache_dir else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], embedder: SentenceEmbedder | None = None) -> MilvusKnowledgeBase:
        return cls(data["uri"], data["name"], cache_dir=data.get("cache_dir"), embedder=embedder)

    # --- writing -------------------------------------------------------------------------------------------

    def apply(self, documents: Sequence[Document], delete_ids: Sequence[str] = (),
              origins: dict[str, str] | None = None, progress: Progress | None = None,
              pipeline: EmbeddingPipeline | None = None) -> IngestReport:
        if not documents and not self.exists:
            raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; nothing to delete or add there")
        self._create()
        self._reader = None
        report = IngestReport()
        wanted = list(dict.fromkeys([*(d.doc_id for d in documents), *delete_ids]))
        incoming = classify(documents, delete_ids, self._hashes(wanted), report)
        changed = set(report.added) | set(report.updated)
        fresh = [d for d in incoming if d.doc_id in changed and self._fits(d, origins or {}, report)]
        writer = _MilvusWriter(self, time.time_ns(), origins or {}, report, progress)
        pipeline = pipeline or LocalPipeline(self.embedder, self.workers)
        writer.write(fresh, pipeline)
        report.seconds_embedding = pipeline.seconds_embedding
        for start in range(0, len(report.deleted), _BATCH):
            ids = report.deleted[start:start + _BATCH]
            self.client.delete(self.chunks, filter=_in("doc_id", ids))
            self.client.delete(self.documents, filter=_in("doc_id", ids))
        report.chunks_total = self._count(self.chunks)
        return report

    def compact(self, progress: Progress | None = None) -> IngestReport:
        """Ask Milvus to compact now (it drops deleted rows and merges its segments on its own schedule too)."""
        if not self.exists:
            raise KnowledgeBaseError(f"{self.root} is not a knowledge base yet; nothing to compact")
        self.client.compact(self.chunks)
        return IngestReport(chunks_total=self._count(self.chunks))

    def stats(self) -> KnowledgeBaseStats:
        reader = self.reader()
        by_type, by_authority = KnowledgeBaseStats.tally(reader.documents().values())
        manifest = self._manifest() or {}
        return KnowledgeBaseStats(self.root, 0, sum(by_type.values()), reader.live_chunks, 0, 0, 0,
                                  str(manifest.get("embedding_model", "")), str(manifest.get("created", "")),
                                  by_type, by_authority, True)

    def _count(self, collection: str) -> int:
        found = self.client.query(collection, filter="", output_fields=["count(*)"])
        return int(found[0]["count(*)"]) - (1 if collection == self.documents else 0)

    def _hashes(self, doc_ids: Sequence[str]) -> dict[str, tuple[str, Any]]:
        found: dict[str, tuple[str, Any]] = {}
        for start in range(0, len(doc_ids), _BATCH):
            rows = self.client.query(self.documents, filter=_in("doc_id", doc_ids[start:start + _BATCH]),
                                     output_fields=["doc_id", "content_hash"])
            found.update((r["doc_id"], (r["content_hash"], None)) for r in rows if r["doc_id"] != MANIFEST_ID)
        return found

    def _fits(self, document: Document, origins: dict[str, str], report: IngestReport) -> bool:
        """Milvus strings have a fixed maximum length: a document that exceeds one is refused, named."""
        values = {"doc_id": document.doc_id, "title": document.title, "source": document.source,
                  "origin": origins.get(document.doc_id, document.source),
                  "metadata": json.dumps(dict(document.metadata), ensure_ascii=False)}
        for field, value in values.items():
            if len(value) > LIMITS[field]:
                report.errors.append(IngestError(document.doc_id, f"{field} is {len(value)} characters; Milvus "
                                                                  f"stores at most {LIMITS[field]}; not ingested"))
                return False
        return True

    def _create(self) -> None:
        if self.exists:
            return
        create_collections(self.client, self.chunks, self.documents, self.embedder.dimension, self.config)
        manifest = {"format": FORMAT, "config": asdict(self.config), "dim": self.embedder.dimension,
                    "embedding_model": self.embedder.model_name,
                    "created": datetime.now(UTC).isoformat(timespec="seconds")}
        self.client.upsert(self.documents, [_document_entity(MANIFEST_ID, {"metadata": json.dumps(manifest)})])


def _document_entity(doc_id: str, values: dict[str, Any]) -> dict[str, Any]:
    entity: dict[str, Any] = {name: "" for name in store.DOCUMENT_COLUMNS}
    entity.update(doc_id=doc_id, n_chunks=0, marker=[1.0, 0.0])
    entity.update(values)
    return entity


class _MilvusWriter:
    """Fresh documents -> chunk entities (prepared in worker processes, embedded here) -> batched inserts."""

    def __init__(self, kb: MilvusKnowledgeBase, write_id: int, origins: dict[str, str], report: IngestReport,
                 progress: Progress | None) -> None:
        self.kb, self.write_id, self.origins, self.report = kb, write_id, origins, report
        self.progress = progress or (lambda stage, done, total: None)

    def write(self, fresh: list[Document], pipeline: EmbeddingPipeline) -> None:
        by_id = {d.doc_id: d for d in fresh}
        done = 0
        for batch, vectors in pipeline.run(fresh, self.kb.config.chunker, self.kb.config.contextual_prefix):
            started = time.perf_counter()
            self._store(batch, vectors, by_id)
            self.report.seconds_indexing += time.perf_counter() - started
            done += len(batch.chunks_per_document)
            self.progress("documents", done, len(fresh))

    def _store(self, batch: PreparedBatch, vectors: npt.NDArray[np.float32], by_id: dict[str, Document]) -> None:
        client, kb = self.kb.client, self.kb
        entities = [{"chunk_id": c.chunk_id, "doc_id": c.doc_id, "position": c.position, "section": c.section,
                     "section_id": c.section_id, "char_start": c.char_start, "char_end": c.char_end, "text": c.text,
                     "terms": " ".join(term_token(t) for t in c.terms.split(" ") if t), "vector": v.tolist(),
                     "source": c.source, "date": c.date, "authority": c.authority, "write_id": self.write_id}
                    for c, v in zip(batch.chunks, vectors, strict=True)]
        for start in range(0, len(entities), _BATCH):
            client.insert(kb.chunks, entities[start:start + _BATCH])
        ids = list(batch.chunks_per_document)
        client.delete(kb.chunks, filter=f"{_in('doc_id', ids)} and write_id != {self.write_id}")
        now = datetime.now(UTC).isoformat(timespec="seconds")
        client.upsert(kb.documents, [_document_entity(doc_id, {
            "content_hash": d.content_hash, "source": d.source, "source_type": d.source_type, "title": d.title,
            "date": d.date, "authority": d.authority, "origin": self.origins.get(doc_id, d.source),
            "metadata": json.dumps(dict(d.metadata), ensure_ascii=False), "n_chunks": n, "ingested_at": now})
            for doc_id, n in batch.chunks_per_document.items() if (d := by_id[doc_id])])
        self.report.chunks_written += len(entities)


CHUNK_FIELDS = ["row", *store.CHUNK_COLUMNS[1:9], "source", "date", "authority"]


class MilvusReader:
    """The collections as of now (Milvus has no generations: a concurrent write shows as it lands)."""

    def __init__(self, kb: MilvusKnowledgeBase) -> None:
        self.kb, self.client = kb, kb.client
        self.lexical = MilvusLexical(self)
        self.dense = MilvusDense(self)

    @cached_property
    def live_chunks(self) -> int:
        return self.kb._count(self.kb.chunks)

    def scope(self, filters: Filters) -> str | None:
        """Filters as a Milvus expression over the chunk fields (the embedded backend's SQL, term for term)."""
        clauses = [f"{name} == {_quoted(value)}" for name in ("source", "section", "authority")
                   if (value := getattr(filters, name))]
        if filters.date_from:
            clauses.append(f'(date != "" and date >= {_quoted(filters.date_from)})')
        if filters.date_to:
            clauses.append(f'(date != "" and date <= {_quoted(filters.date_to + chr(0xFFFF))})')
        return " and ".join(clauses) or None

    def _chunk(self, entity: dict[str, Any]) -> store.ChunkRow:
        return store.ChunkRow(int(entity["row"]), entity["chunk_id"], entity["doc_id"], int(entity["position"]),
                              entity["section"], entity["section_id"], int(entity["char_start"]),
                              int(entity["char_end"]), entity["text"], "", entity["source"], entity["date"],
                              entity["authority"])

    def _query(self, collection: str, expression: str, fields: list[str]) -> Iterator[dict[str, Any]]:
        iterator = self.client.query_iterator(collection, batch_size=1000, filter=expression, output_fields=fields)
        try:
            while batch := iterator.next():
                yield from batch
        finally:
            iterator.close()

    def documents(self) -> dict[str, store.DocumentRow]:
        fields = list(store.DOCUMENT_COLUMNS)
        return {e["doc_id"]: store.DocumentRow(*(e[f] for f in fields))
                for e in self._query(self.kb.documents, f"doc_id != {_quoted(MANIFEST_ID)}", fields)}

    def document(self, doc_id: str) -> store.DocumentRow | None:
        if doc_id == MANIFEST_ID:
            return None
        fields = list(store.DOCUMENT_COLUMNS)
        found = self.client.query(self.kb.documents, filter=f"doc_id == {_quoted(doc_id)}", output_fields=fields)
        return store.DocumentRow(*(found[0][f] for f in fields)) if found else None

    def chunks_of(self, doc_id: str) -> list[store.ChunkRow]:
        found = self.client.query(self.kb.chunks, filter=f"doc_id == {_quoted(doc_id)}", output_fields=CHUNK_FIELDS)
        return sorted((self._chunk(e) for e in found), key=lambda c: c.position)

    def iter_chunks(self) -> Iterator[store.ChunkRow]:
        yield from (self._chunk(e) for e in self._query(self.kb.chunks, "", CHUNK_FIELDS))

    def chunks_by_rows(self, rows: Sequence[int]) -> dict[int, store.ChunkRow]:
        found: dict[int, store.ChunkRow] = {}
        for start in range(0, len(rows), _BATCH):
            part = [int(r) for r in rows[start:start + _BATCH]]
            found.update((int(e["row"]), self._chunk(e))
                         for e in self.client.get(self.kb.chunks, ids=part, output_fields=CHUNK_FIELDS))
        return found

    def titles_of(self, doc_ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        unique = list(dict.fromkeys(doc_ids))
        for start in range(0, len(unique), _BATCH):
            rows = self.client.query(self.kb.documents, filter=_in("doc_id", unique[start:start + _BATCH]),
                                     output_fields=["doc_id", "title"])
            found.update((r["doc_id"], r["title"]) for r in rows)
        return found

    def titles(self) -> list[str]:
        return sorted({row.title for row in self.documents().values() if row.title})

    def close(self) -> None:
        return None


def _ranked(results: Any, bm25: bool = False) -> tuple[Rows, Scores]:
    """Milvus hits -> (rows, scores), best first. A BM25 score is never negative, but Milvus Lite reports it
    negated (a distance): its magnitude is the score. Inner products are scores as they are."""
    hits = results[0] if results else []
    rows = np.asarray([int(h["row"]) for h in hits], np.int64)
    scores = np.asarray([abs(float(h["distance"])) if bm25 else float(h["distance"]) for h in hits], np.float32)
    return rows, scores


class MilvusLexical:
    def __init__(self, reader: MilvusReader) -> None:
        self.reader = reader
        self._shares: dict[str, float] = {}

    def search(self, terms: Sequence[str], k: int, scope: str | None = None) -> tuple[Rows, Scores]:
        if not terms or k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        kb = self.reader.kb
        results = kb.client.search(kb.chunks, data=[" ".join(term_token(t) for t in terms)], anns_field="sparse",
                                   limit=k, filter=scope or "", search_params={"metric_type": "BM25"},
                                   output_fields=["row"])
        return _ranked(results, bm25=True)

    def share(self, term: str) -> float:
        """A count query per new term (the focus extractor asks for every title word once per reader)."""
        if term not in self._shares:
            kb = self.reader.kb
            found = kb.client.query(kb.chunks, filter=f'TEXT_MATCH(terms, "{term_token(term)}")',
                                    output_fields=["count(*)"])
            self._shares[term] = int(found[0]["count(*)"]) / max(self.reader.live_chunks, 1)
        return self._shares[term]


class MilvusDense:
    def __init__(self, reader: MilvusReader, ef_search: int = 64) -> None:
        self.reader, self.ef_search = reader, ef_search

    def search(self, query: npt.NDArray[np.float32], k: int, scope: str | None = None) -> tuple[Rows, Scores]:
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        kb = self.reader.kb
        results = kb.client.search(kb.chunks, data=[np.asarray(query, np.float32).tolist()], anns_field="vector",
                                   limit=k, filter=scope or "",
                                   search_params={"metric_type": "IP", "params": {"ef": max(self.ef_search, k)}},
                                   output_fields=["row"])
        return _ranked(results)

    def vectors_at(self, rows: Sequence[int]) -> npt.NDArray[np.float32]:
        kb = self.reader.kb
        found = {int(e["row"]): e["vector"] for start in range(0, len(rows), _BATCH)
                 for e in kb.client.get(kb.chunks, ids=[int(r) for r in rows[start:start + _BATCH]],
                                        output_fields=["vector"])}
        return np.asarray([found[int(r)] for r in rows], np.float32).reshape(len(rows), -1)
