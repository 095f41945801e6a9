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
from collections.abc import Sequence
from pathlib import Path

from ebmrag.index import store
from ebmrag.index.kb import IngestReport, KnowledgeBase
from ebmrag.ingest.pipeline import FileBatch, collect
from ebmrag.ingest.readers import DEFAULT_MAX_FILE_BYTES, FieldMap
from ebmrag.protocols import Progress

log = logging.getLogger(__name__)


def stale_documents(kb: KnowledgeBase, paths: Sequence[Path], batch: FileBatch) -> list[str]:
    """Documents whose origin lies under one of `paths` but that this batch did not read again."""
    if not kb.exists:
        return []
    roots = [str(p.resolve()) for p in paths if p.exists()]
    seen = {d.doc_id for d in batch.documents}
    stale = []
    for doc_id, row in store.documents(kb.reader().db).items():
        under = any(row.origin == r or row.origin.startswith(r.rstrip("/") + "/") for r in roots)
        if under and doc_id not in seen and row.origin not in batch.failed_files:
            stale.append(doc_id)
    return stale


def ingest_paths(kb: KnowledgeBase, paths: Sequence[Path], sync: bool = False, field_map: FieldMap | None = None,
                 max_bytes: int = DEFAULT_MAX_FILE_BYTES, progress: Progress | None = None) -> IngestReport:
    batch = collect(paths, field_map, max_bytes, progress)
    deletions = stale_documents(kb, paths, batch) if sync else []
    report = kb.apply(batch.documents, deletions, batch.origins, progress)
    report.errors[:0] = batch.errors
    for error in report.errors:
        log.info("%s", error)
    return report
