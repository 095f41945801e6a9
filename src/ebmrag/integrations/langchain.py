"""LangChain drop-in (`pip install 'ebmrag[langchain]'`): EBM-Pack as a document compressor, and the bundled
MiniLM as `Embeddings`, so a LangChain retriever runs offline.

    compressor = EbmPackCompressor(budget=600, record="patient.json")
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=store.as_retriever())

`compress_documents` returns, in context order, the patient's fragments EBM-Pack keeps (new `Document`s, id
`patient:<fragment id>`) and the retrieved documents it keeps, each with `ebmrag_kind`, `ebmrag_tier`,
`ebmrag_state` and `ebmrag_reason` in its metadata; `select` also returns every dropped document's reason.
A retrieved document is identified by its `id`, or by its position when it has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ebmrag.errors import require_extra

require_extra("langchain_core", "langchain", "the LangChain drop-in")

from langchain_core.callbacks import Callbacks  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.documents.compressor import BaseDocumentCompressor  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from pydantic import ConfigDict, PrivateAttr  # noqa: E402

from ebmrag.compose import Resources  # noqa: E402
from ebmrag.config import Settings  # noqa: E402
from ebmrag.evidence.tiering import Tiering  # noqa: E402
from ebmrag.integrations.core import PATIENT, EvidencePacker, Passage, Placed, RecordSource, Selection  # noqa: E402
from ebmrag.models.embeddings import SentenceEmbedder  # noqa: E402
from ebmrag.packing.packer import ContextPacker  # noqa: E402


def _metadata(placed: Placed) -> dict[str, str]:
    return {"ebmrag_kind": placed.kind, "ebmrag_tier": placed.tier, "ebmrag_state": placed.state,
            "ebmrag_reason": placed.reason}


class EbmPackCompressor(BaseDocumentCompressor):
    """Keeps what EBM-Pack places within `budget` tokens: the record's critical facts first, then evidence."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    budget: int
    authority_key: str = "authority"
    _packer: EvidencePacker = PrivateAttr()

    def __init__(self, budget: int, record: RecordSource | None = None, settings: Settings | None = None,
                 packer: ContextPacker | None = None, authority_key: str = "authority",
                 tiering: Tiering | None = None, **kwargs: Any) -> None:
        super().__init__(budget=budget, authority_key=authority_key, **kwargs)  # type: ignore[call-arg]
        self._packer = EvidencePacker(budget, record, settings, packer, tiering=tiering)

    def select(self, documents: Sequence[Document], query: str,
               record: RecordSource | None = None) -> tuple[list[Document], Selection]:
        """The kept documents in context order and the full selection (dropped documents with their reasons)."""
        keyed = {(d.id or f"doc-{i}"): d for i, d in enumerate(documents)}
        passages = [Passage(key, d.page_content, str(d.metadata.get(self.authority_key, "")))
                    for key, d in keyed.items()]
        selection = self._packer.run(query, passages, record)
        return [self._document(p, keyed) for p in selection.placed], selection

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        return self.select(documents, query)[0]

    @staticmethod
    def _document(placed: Placed, keyed: dict[str, Document]) -> Document:
        if placed.kind == PATIENT:
            return Document(page_content=placed.text, id=f"patient:{placed.id}", metadata=_metadata(placed))
        original = keyed[placed.id]
        return Document(page_content=original.page_content, id=original.id,
                        metadata={**original.metadata, **_metadata(placed)})


class EbmragEmbeddings(Embeddings):
    """LangChain's `Embeddings` over ebmrag's embedder (the bundled MiniLM by default); nothing downloaded."""

    def __init__(self, embedder: SentenceEmbedder | None = None) -> None:
        self.embedder = embedder or Resources(Settings()).embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self.embedder.embed(texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]
