"""Ingestion on a Ray cluster: read -> chunk -> embed on the cluster, write from here.

Files are read by Ray tasks (their paths must be visible to every node: shared storage), documents are
chunked and analysed by tasks a batch at a time, and chunks are embedded by a pool of actors that each
load the knowledge base's model once. The driver (this process) receives (batch, vectors) in document
order and writes them through the backend as any write: the embedded backend commits one generation,
Milvus receives batched upserts. At most two batches per actor are in flight, so the object store holds
a bounded window, not the corpus.

`ebmrag ingest PATHS --kb DIR --ray auto|ADDRESS` (the 'ray' extra). Every node runs the same ebmrag.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ebmrag.errors import IngestError, require_extra
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.index.prepare import BATCH_DOCUMENTS, Embedded, PreparedBatch, Preparer
from ebmrag.ingest.documents import Document
from ebmrag.ingest.pipeline import read_one
from ebmrag.ingest.readers import FieldMap, ReadResult

FILES_PER_TASK = 16
CPU_SHARE = 0.5  # an actor and a chunking task share a CPU, so a pool of one actor per CPU never starves the tasks
_preparers: dict[tuple[str, bool], Preparer] = {}


def _prepare(documents: Sequence[Document], chunker: str, prefix: bool) -> PreparedBatch:
    """A Ray task: one batch chunked and analysed (the chunker loads once per worker process)."""
    key = (chunker, prefix)
    if key not in _preparers:
        _preparers[key] = Preparer(chunker, prefix)
    return _preparers[key].prepare(documents)


def _read(files: Sequence[tuple[str, str]], field_map: FieldMap | None,
          max_bytes: int) -> list[ReadResult | IngestError]:
    """A Ray task: a group of files read where the task runs."""
    return [read_one(Path(file), doc_id, field_map, max_bytes) for file, doc_id in files]


class _Embedder:
    """A Ray actor: the knowledge base's embedding model, loaded once."""

    def __init__(self, config: dict[str, Any], cache_dir: str | None) -> None:
        from ebmrag.index.kb import kb_embedder

        self.model = kb_embedder(KnowledgeBaseConfig(**config), cache_dir)
        self.model.warm_up()

    def embed(self, batch: PreparedBatch) -> npt.NDArray[np.float32]:
        if not batch.texts:
            return np.zeros((0, self.model.dimension), np.float32)
        return np.asarray(self.model.embed(batch.texts), dtype=np.float32)


class RayPipeline:
    """An `EmbeddingPipeline` (and file reader) on a Ray cluster; `actors` embedding actors (0: one per CPU)."""

    def __init__(self, address: str, config: KnowledgeBaseConfig, cache_dir: str | Path | None = None,
                 actors: int = 0) -> None:
        if actors < 0:
            raise ValueError(f"actors must be >= 0, got {actors}")
        self.ray = require_extra("ray", "ray", "distributed ingestion (--ray)")
        if not self.ray.is_initialized():
            self.ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        self.config, self.cache_dir = config, str(cache_dir) if cache_dir else None
        self.actors = actors or max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        self.seconds_embedding = 0.0  # time the driver waited for vectors (the work itself runs in parallel)
        self._pool: list[Any] = []

    def read_many(self, files: Sequence[tuple[Path, str]], field_map: FieldMap | None,
                  max_bytes: int) -> Iterator[ReadResult | IngestError]:
        task = self.ray.remote(num_cpus=CPU_SHARE)(_read)
        groups = [[(str(f), d) for f, d in files[i:i + FILES_PER_TASK]] for i in range(0, len(files), FILES_PER_TASK)]
        for result in self.ray.get([task.remote(group, field_map, max_bytes) for group in groups]):
            yield from result

    def run(self, documents: Sequence[Document], chunker: str, prefix: bool) -> Iterator[Embedded]:
        ray = self.ray
        prepare = ray.remote(num_cpus=CPU_SHARE)(_prepare)
        if not self._pool:
            actor = ray.remote(num_cpus=CPU_SHARE)(_Embedder)
            self._pool = [actor.remote(asdict(self.config), self.cache_dir) for _ in range(self.actors)]
        batches = iter([documents[i:i + BATCH_DOCUMENTS] for i in range(0, len(documents), BATCH_DOCUMENTS)])
        in_flight: deque[tuple[Any, Any]] = deque()
        for turn, batch in enumerate(batches):
            prepared = prepare.remote(batch, chunker, prefix)
            in_flight.append((prepared, self._pool[turn % len(self._pool)].embed.remote(prepared)))
            if len(in_flight) >= 2 * len(self._pool):
                yield self._collect(in_flight.popleft())
        while in_flight:
            yield self._collect(in_flight.popleft())

    def _collect(self, refs: tuple[Any, Any]) -> Embedded:
        started = time.perf_counter()
        batch, vectors = self.ray.get(list(refs))
        self.seconds_embedding += time.perf_counter() - started
        return batch, vectors

    def close(self) -> None:
        for actor in self._pool:
            self.ray.kill(actor)
        self._pool = []
