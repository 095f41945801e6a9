"""Files and folders -> one knowledge-base write: `ingest.pipeline` reads them, the KB chunks, embeds and
commits them. With `sync`, documents that came from a given folder or file and are no longer there
are deleted, except those of files that failed to read this time (a transient error must never
delete knowledge).

The direction between the two packages: ingest knows nothing of the index (files -> normalized
`Document`s, and the chunkers); the knowledge base receives documents and owns when they are
chunked, because the chunker is part of its manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from ebmrag.errors import IngestError
from ebmrag.index.backend import KnowledgeStore
from ebmrag.index.prepare import EmbeddingPipeline
from ebmrag.index.types import IngestReport
from ebmrag.ingest.pipeline import FileBatch, collect, read_in_processes
from ebmrag.ingest.readers import DEFAULT_MAX_FILE_BYTES, FieldMap, ReadResult
from ebmrag.protocols import Progress

log = logging.getLogger(__name__)


class Cluster(EmbeddingPipeline, Protocol):
    """Somewhere else to read files and to chunk and embed documents (see `distributed.RayPipeline`)."""

    def read_many(self, files: Sequence[tuple[Path, str]], field_map: FieldMap | None,
                  max_bytes: int) -> Iterator[ReadResult | IngestError]: ...


def stale_documents(kb: KnowledgeStore, paths: Sequence[Path], batch: FileBatch) -> list[str]:
    """Documents whose origin lies under one of `paths` but that this batch did not read again."""
    if not kb.exists:
        return []
    roots = [str(p.resolve()) for p in paths if p.exists()]
    seen = {d.doc_id for d in batch.documents}
    stale = []
    for doc_id, row in kb.reader().documents().items():
        under = any(row.origin == r or row.origin.startswith(r.rstrip("/") + "/") for r in roots)
        if under and doc_id not in seen and row.origin not in batch.failed_files:
            stale.append(doc_id)
    return stale


def reconcile_ids(kb: KnowledgeStore, batch: FileBatch) -> list[IngestError]:
    """Keep ids stable and unique across sources, in place:
    - a file the KB already holds under another id (the same file spelled another way) keeps its stored id;
    - an id the KB already gives to a document from another file that still exists is a collision: the
      new document is refused, named, and not written (never a silent replacement)."""
    if not kb.exists:
        return []
    stored = kb.reader().documents()
    by_origin: dict[str, list[str]] = {}
    for doc_id, stored_row in stored.items():
        by_origin.setdefault(stored_row.origin, []).append(doc_id)
    per_file: dict[str, int] = {}
    for document in batch.documents:
        origin = batch.origins.get(document.doc_id, "")
        per_file[origin] = per_file.get(origin, 0) + 1
    errors, kept = [], []
    for document in batch.documents:
        origin = batch.origins.get(document.doc_id, "")
        known = by_origin.get(origin, [])
        if len(known) == 1 and per_file[origin] == 1 and known[0] != document.doc_id:
            del batch.origins[document.doc_id]
            document = replace(document, doc_id=known[0])
            batch.origins[document.doc_id] = origin
        row = stored.get(document.doc_id)
        if row is not None and row.origin != origin and Path(row.origin).exists():
            errors.append(IngestError(origin, f"id {document.doc_id!r} already names {row.origin}; not ingested "
                                              "(give --source NAME to keep both, or delete the other first)"))
            continue
        kept.append(document)
    batch.documents[:] = kept
    return errors


def ingest_paths(kb: KnowledgeStore, paths: Sequence[Path], sync: bool = False, field_map: FieldMap | None = None,
                 max_bytes: int = DEFAULT_MAX_FILE_BYTES, progress: Progress | None = None,
                 source: str = "", cluster: Cluster | None = None, workers: int = 1) -> IngestReport:
    """`cluster` (e.g. `distributed.RayPipeline`) reads the files and chunks and embeds the documents elsewhere;
    without one, `workers` processes read the files (1: this one)."""
    read_many = cluster.read_many if cluster is not None else read_in_processes(workers)
    batch = collect(paths, field_map, max_bytes, progress, source, read_many)
    batch.errors.extend(reconcile_ids(kb, batch))
    deletions = stale_documents(kb, paths, batch) if sync else []
    report = kb.apply(batch.documents, deletions, batch.origins, progress, cluster)
    report.errors[:0] = batch.errors
    for error in report.errors:
        log.info("%s", error)
    return report
