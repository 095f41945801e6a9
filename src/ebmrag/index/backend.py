"""The knowledge-base interface every backend offers, and the function that opens the configured one.

Two backends implement it: the embedded default (`kb.KnowledgeBase`: segments in a directory) and Milvus
(`milvus.MilvusKnowledgeBase`: a collection on a server). Everything above the index (ingest, search,
ask, research, the service) is written against these protocols, so it runs unchanged on either.
Rows are opaque integers that a reader hands out and takes back; a scope is what a reader makes of
`Filters` (a row mask for the embedded backend, a filter expression for Milvus).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ebmrag.index import store
from ebmrag.index.analyzer import Analyzer
from ebmrag.index.lexical import Rows, Scores
from ebmrag.index.params import KnowledgeBaseConfig, StorageSettings
from ebmrag.index.prepare import EmbeddingPipeline
from ebmrag.index.types import Filters, IngestReport, KnowledgeBaseStats
from ebmrag.ingest.documents import Document
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.protocols import Progress


class LexicalRoute(Protocol):
    def search(self, terms: Sequence[str], k: int, scope: Any = None) -> tuple[Rows, Scores]: ...

    def share(self, term: str) -> float: ...


class DenseRoute(Protocol):
    def search(self, query: npt.NDArray[np.float32], k: int, scope: Any = None) -> tuple[Rows, Scores]: ...

    def vectors_at(self, rows: Sequence[int]) -> npt.NDArray[np.float32]: ...


class KnowledgeReader(Protocol):
    """One consistent view of a knowledge base (a generation, or a server collection as of now)."""

    @property
    def live_chunks(self) -> int: ...

    @property
    def lexical(self) -> LexicalRoute: ...

    @property
    def dense(self) -> DenseRoute: ...

    def scope(self, filters: Filters) -> Any: ...

    def documents(self) -> dict[str, store.DocumentRow]: ...

    def document(self, doc_id: str) -> store.DocumentRow | None: ...

    def chunks_of(self, doc_id: str) -> list[store.ChunkRow]: ...

    def iter_chunks(self) -> Iterator[store.ChunkRow]: ...

    def chunks_by_rows(self, rows: Sequence[int]) -> dict[int, store.ChunkRow]: ...

    def titles_of(self, doc_ids: Sequence[str]) -> dict[str, str]: ...

    def titles(self) -> list[str]: ...


class KnowledgeStore(Protocol):
    """What the stages above the index hold: a knowledge base they can read, write and describe."""

    config: KnowledgeBaseConfig
    embedder: SentenceEmbedder
    analyzer: Analyzer

    @property
    def exists(self) -> bool: ...

    def reader(self) -> KnowledgeReader: ...

    def apply(self, documents: Sequence[Document], delete_ids: Sequence[str] = (),
              origins: dict[str, str] | None = None, progress: Progress | None = None,
              pipeline: EmbeddingPipeline | None = None) -> IngestReport: ...

    def compact(self, progress: Progress | None = None) -> IngestReport: ...

    def to_dict(self) -> dict[str, Any]: ...

    def stats(self) -> KnowledgeBaseStats: ...


def pinned(kb: KnowledgeStore) -> AbstractContextManager[object]:
    """`kb.pinned()` where the backend has one (the embedded knowledge base: one generation for a whole search,
    kept open while another thread moves it on), else nothing to hold (a Milvus reader holds no files)."""
    pin = getattr(kb, "pinned", None)
    return pin() if pin is not None else nullcontext()


def knowledge_base_from_dict(data: dict[str, Any] | str, embedder: SentenceEmbedder | None = None) -> KnowledgeStore:
    """The inverse of a backend's `to_dict()` (a bare string is an embedded knowledge base's directory)."""
    if isinstance(data, dict) and data.get("backend") == "milvus":
        from ebmrag.index.milvus import MilvusKnowledgeBase

        return MilvusKnowledgeBase.from_dict(data, embedder)
    from ebmrag.index.kb import KnowledgeBase

    return KnowledgeBase.from_dict(data, embedder)


def open_knowledge_base(config: KnowledgeBaseConfig, storage: StorageSettings, path: Path | None,
                        cache_dir: Path | None = None, embedder: SentenceEmbedder | None = None) -> KnowledgeStore:
    """The configured backend: `[kb] backend = "milvus"` opens the collection named by the path's last part
    (default "ebmrag") on `[kb] uri`; otherwise the directory `path`."""
    if storage.backend == "milvus":
        from ebmrag.index.milvus import MilvusKnowledgeBase

        name = path.name if path is not None else "ebmrag"
        return MilvusKnowledgeBase(storage.uri, name, config, cache_dir=cache_dir, embedder=embedder)
    from ebmrag.index.kb import KnowledgeBase

    if path is None:
        raise ValueError("the embedded knowledge base needs a directory (--kb DIR)")
    exists = (path / "CURRENT").exists()
    return KnowledgeBase(path, config if not exists else None, cache_dir=cache_dir, embedder=embedder,
                         storage=storage)
