"""Documents -> chunk rows, the texts to embed, and BM25 term counts: the CPU-bound half of ingest.

Chunking (tokenizer calls) and analysis (stemming, jieba) are pure Python per chunk and dominated a
1M-chunk build; here they run in worker processes, a batch of documents per task, while the parent
embeds what is ready. At most `2 x workers` batches are in flight, so memory stays bounded by the
batches being embedded, not by the corpus. Small inputs are prepared in-process (starting workers costs
about a second each). Workers are spawned, not forked: the parent may hold a PyTorch thread pool.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ebmrag.index import store
from ebmrag.index.analyzer import Analyzer
from ebmrag.index.lexical import TermCounts
from ebmrag.ingest.chunking import ChunkerBySource
from ebmrag.ingest.documents import Document
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.models.tokens import HuggingFaceTokenCounter

BATCH_DOCUMENTS = 64
MIN_DOCUMENTS_FOR_WORKERS = 256


@dataclass
class PreparedBatch:
    """Chunks of whole documents; chunk rows are numbered from 0 within the batch."""

    chunks: list[store.ChunkRow]
    texts: list[str]
    counts: TermCounts
    chunks_per_document: dict[str, int]


def index_text(title: str, section: str, text: str, prefix: bool) -> str:
    """What the retrievers see: the chunk, headed by its document title and section (field context)."""
    if not prefix:
        return text
    head = " — ".join(part for part in (title, section) if part)
    return f"{head}\n{text}" if head else text


class Preparer:
    """The knowledge base's chunker and analyzer, built once per process (a worker's, or this one)."""

    def __init__(self, chunker: str, prefix: bool) -> None:
        self.chunker = ChunkerBySource(HuggingFaceTokenCounter(), chunker)
        self.analyzer, self.prefix = Analyzer(), prefix

    def prepare(self, documents: Sequence[Document]) -> PreparedBatch:
        chunks: list[store.ChunkRow] = []
        texts: list[str] = []
        terms: list[list[str]] = []
        per_document: dict[str, int] = {}
        for doc in documents:
            pieces = self.chunker.chunk(doc)
            per_document[doc.doc_id] = len(pieces)
            for piece in pieces:
                text = index_text(doc.title, piece.section, piece.text, self.prefix)
                analysed = self.analyzer.terms(text)
                texts.append(text)
                terms.append(analysed)
                chunks.append(store.ChunkRow(
                    len(chunks), piece.chunk_id, doc.doc_id, piece.position, piece.section, piece.section_id,
                    piece.char_start, piece.char_end, piece.text, " ".join(analysed), doc.source, doc.date,
                    doc.authority))
        return PreparedBatch(chunks, texts, TermCounts.count(terms), per_document)


_worker: Preparer | None = None


def _start_worker(chunker: str, prefix: bool) -> None:
    global _worker
    _worker = Preparer(chunker, prefix)


def _prepare_in_worker(documents: Sequence[Document]) -> PreparedBatch:
    if _worker is None:
        raise RuntimeError("worker not initialised")
    return _worker.prepare(documents)


Embedded = tuple[PreparedBatch, npt.NDArray[np.float32]]


class EmbeddingPipeline(Protocol):
    """Fresh documents -> (prepared batch, its chunk vectors), in document order: the costly part of a write.
    `LocalPipeline` runs it on this machine; `distributed.RayPipeline` on a Ray cluster."""

    seconds_embedding: float

    def run(self, documents: Sequence[Document], chunker: str, prefix: bool) -> Iterator[Embedded]: ...


class LocalPipeline:
    """Preparation in worker processes, embedding in this process (one loaded model, batched)."""

    def __init__(self, embedder: SentenceEmbedder, workers: int = 0) -> None:
        self.embedder, self.workers = embedder, workers
        self.seconds_embedding = 0.0

    def run(self, documents: Sequence[Document], chunker: str, prefix: bool) -> Iterator[Embedded]:
        for batch in prepare_batches(documents, chunker, prefix, self.workers):
            started = time.perf_counter()
            vectors = self.embedder.embed(batch.texts) if batch.texts else \
                np.zeros((0, self.embedder.dimension), np.float32)
            self.seconds_embedding += time.perf_counter() - started
            yield batch, np.asarray(vectors, dtype=np.float32)


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def prepare_batches(documents: Sequence[Document], chunker: str, prefix: bool,
                    workers: int = 0) -> Iterator[PreparedBatch]:
    """Prepared batches in document order; `workers` 0 = one per core (at most 8), 1 = in this process."""
    workers = workers or default_workers()
    batches = [documents[i:i + BATCH_DOCUMENTS] for i in range(0, len(documents), BATCH_DOCUMENTS)]
    if workers == 1 or len(documents) < MIN_DOCUMENTS_FOR_WORKERS:
        local = Preparer(chunker, prefix)
        yield from (local.prepare(batch) for batch in batches)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                             initargs=(chunker, prefix)) as pool:
        pending: deque[Future[PreparedBatch]] = deque()
        queue = iter(batches)
        for batch in queue:
            pending.append(pool.submit(_prepare_in_worker, batch))
            if len(pending) >= 2 * workers:
                break
        while pending:
            yield pending.popleft().result()
            following = next(queue, None)
            if following is not None:
                pending.append(pool.submit(_prepare_in_worker, following))
