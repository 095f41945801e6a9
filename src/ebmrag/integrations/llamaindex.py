"""LlamaIndex drop-in (`pip install 'ebmrag[llamaindex]'`): EBM-Pack as a node postprocessor, and the bundled
MiniLM as an embedding model, so a LlamaIndex pipeline runs offline.

    postprocessor = EbmPackPostprocessor(budget=600, record="patient.json")
    engine = index.as_query_engine(similarity_top_k=10, node_postprocessors=[postprocessor])

The postprocessor returns, in context order, the patient's fragments EBM-Pack keeps (new `TextNode`s, id
`patient:<fragment id>`) and the retrieved nodes it keeps; each carries `ebmrag_kind`, `ebmrag_tier`,
`ebmrag_state` and `ebmrag_reason` in its metadata (hidden from the LLM and the embedder). `select` also returns the
whole `Selection`, with every dropped node's reason.
"""

from __future__ import annotations

from typing import Any

from ebmrag.errors import require_extra

require_extra("llama_index.core", "llamaindex", "the LlamaIndex drop-in")

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402
from pydantic import Field, PrivateAttr  # noqa: E402

from ebmrag.compose import Resources  # noqa: E402
from ebmrag.config import Settings  # noqa: E402
from ebmrag.evidence.tiering import Tiering  # noqa: E402
from ebmrag.integrations.core import PATIENT, EvidencePacker, Passage, Placed, RecordSource, Selection  # noqa: E402
from ebmrag.models.embeddings import SentenceEmbedder  # noqa: E402
from ebmrag.packing.packer import ContextPacker  # noqa: E402

METADATA_KEYS = ("ebmrag_kind", "ebmrag_tier", "ebmrag_state", "ebmrag_reason")


def pack_metadata(placed: Placed) -> dict[str, str]:
    return dict(zip(METADATA_KEYS, (placed.kind, placed.tier, placed.state, placed.reason), strict=True))


class EbmPackPostprocessor(BaseNodePostprocessor):
    """Keeps what EBM-Pack places within `budget` tokens: the record's critical facts first, then evidence."""

    budget: int = Field(description="Tokens for the packed context (patient fragments and retrieved nodes).")
    authority_key: str = Field(default="authority",
                               description="Node metadata naming the source's authority (guideline -> tier T3).")
    _packer: EvidencePacker = PrivateAttr()

    def __init__(self, budget: int, record: RecordSource | None = None, settings: Settings | None = None,
                 packer: ContextPacker | None = None, authority_key: str = "authority",
                 tiering: Tiering | None = None, **kwargs: Any) -> None:
        super().__init__(budget=budget, authority_key=authority_key, **kwargs)  # type: ignore[call-arg]
        self._packer = EvidencePacker(budget, record, settings, packer, tiering=tiering)

    @classmethod
    def class_name(cls) -> str:
        return "EbmPackPostprocessor"

    def select(self, nodes: list[NodeWithScore], query: str,
               record: RecordSource | None = None) -> tuple[list[NodeWithScore], Selection]:
        """The kept nodes in context order and the full selection (dropped nodes with their reasons)."""
        passages = [Passage(n.node.node_id, n.node.get_content(),
                            str(n.node.metadata.get(self.authority_key, ""))) for n in nodes]
        selection = self._packer.run(query, passages, record)
        by_id = {n.node.node_id: n for n in nodes}
        return [self._node(p, by_id) for p in selection.placed], selection

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("EbmPackPostprocessor needs the query: pass query_bundle or query_str")
        return self.select(nodes, query_bundle.query_str)[0]

    @staticmethod
    def _node(placed: Placed, by_id: dict[str, NodeWithScore]) -> NodeWithScore:
        if placed.kind == PATIENT:
            node = TextNode(id_=f"patient:{placed.id}", text=placed.text, metadata=pack_metadata(placed),
                            excluded_llm_metadata_keys=list(METADATA_KEYS),
                            excluded_embed_metadata_keys=list(METADATA_KEYS))
            return NodeWithScore(node=node, score=None)
        original = by_id[placed.id]
        copy = original.node.model_copy(deep=True)
        copy.metadata.update(pack_metadata(placed))
        copy.excluded_llm_metadata_keys = [*copy.excluded_llm_metadata_keys, *METADATA_KEYS]
        copy.excluded_embed_metadata_keys = [*copy.excluded_embed_metadata_keys, *METADATA_KEYS]
        return NodeWithScore(node=copy, score=original.score)


class EbmragEmbedding(BaseEmbedding):
    """LlamaIndex's embedding interface over ebmrag's embedder (the bundled MiniLM by default): same weights, cache
    and precision as the knowledge base, nothing downloaded."""

    _embedder: SentenceEmbedder = PrivateAttr()

    def __init__(self, embedder: SentenceEmbedder | None = None, **kwargs: Any) -> None:
        embedder = embedder or Resources(Settings()).embedder
        super().__init__(model_name=embedder.model_name, embed_batch_size=512, **kwargs)
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "EbmragEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return [float(x) for x in self._embedder.embed([query])[0]]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._embedder.embed(texts)]
