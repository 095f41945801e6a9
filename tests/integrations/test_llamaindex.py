from __future__ import annotations

from typing import Any

import pytest

from ebmrag.evidence.tiering import Tiering
from ebmrag.integrations.core import EvidencePacker
from ebmrag.packing.packer import ContextPacker
from ebmrag.records.fragment import PatientRecord
from tests.integrations.conftest import ALLERGY, BUDGET, QUESTION, first_that_fit

pytest.importorskip("llama_index.core", reason="the [llamaindex] extra is not installed")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.schema import NodeWithScore, TextNode

from ebmrag.integrations.llamaindex import EbmPackPostprocessor, EbmragEmbedding

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def index(guidelines: list[dict[str, str]], record: PatientRecord, embedder: Any) -> VectorStoreIndex:
    """The chart and the guidelines in one LlamaIndex vector index, embedded by the bundled MiniLM."""
    chart = [Document(id_=f.id, text=f.text, metadata={"kind": "chart"}) for f in record.fragments]
    guides = [Document(id_=g["id"], text=g["text"], metadata={"title": g["title"], "authority": g["authority"]})
              for g in guidelines]
    return VectorStoreIndex.from_documents(chart + guides, embed_model=EbmragEmbedding(embedder))


def test_the_allergy_survives_a_budget_the_plain_retriever_loses(
        index: VectorStoreIndex, context_packer: ContextPacker, tiering: Tiering,
        evidence_packer: EvidencePacker) -> None:
    retrieved = index.as_retriever(similarity_top_k=12).retrieve(QUESTION)
    plain = first_that_fit([n.node.get_content() for n in retrieved], context_packer)
    allergy_text = next(f.text for f in evidence_packer.record.fragments if f.id == ALLERGY)  # type: ignore[union-attr]
    assert allergy_text not in plain  # LlamaIndex's own top-k cut at this budget loses it

    guideline_hits = [n for n in retrieved if n.node.metadata.get("kind") != "chart"]
    postprocessor = EbmPackPostprocessor(BUDGET, packer=context_packer, tiering=tiering, record="demo-colon")
    kept, selection = postprocessor.select(guideline_hits, QUESTION)
    assert f"patient:{ALLERGY}" in [n.node.node_id for n in kept]
    assert selection.tokens_used <= BUDGET
    allergy = next(n for n in kept if n.node.node_id == f"patient:{ALLERGY}")
    assert allergy.node.metadata["ebmrag_reason"] == "allergy" and allergy.node.metadata["ebmrag_tier"] == "T1"
    accounted = {p.id for p in selection.placed if p.kind == "evidence"} | {
        d.id for d in selection.dropped if d.kind == "evidence"}
    assert accounted == {n.node.node_id for n in guideline_hits}  # every retrieved node has a recorded fate
    for node in kept:  # the pack's bookkeeping stays out of what the LLM reads
        assert "ebmrag_reason" not in node.node.get_content(metadata_mode="llm")  # type: ignore[attr-defined]


def test_it_runs_inside_a_query_engine_as_a_node_postprocessor(index: VectorStoreIndex, context_packer: ContextPacker,
                                                                  tiering: Tiering) -> None:
    postprocessor = EbmPackPostprocessor(BUDGET, packer=context_packer, tiering=tiering, record="demo-colon")
    retriever = index.as_retriever(similarity_top_k=6)
    nodes = postprocessor.postprocess_nodes(retriever.retrieve(QUESTION), query_str=QUESTION)
    assert f"patient:{ALLERGY}" in [n.node.node_id for n in nodes]
    guideline = [n for n in nodes if n.node.metadata.get("ebmrag_kind") == "evidence"]
    assert all(n.score is not None for n in guideline)
    with pytest.raises(ValueError, match="needs the query"):
        postprocessor.postprocess_nodes(nodes)


def test_bad_arguments_are_clear_errors(context_packer: ContextPacker, tiering: Tiering) -> None:
    with pytest.raises(ValueError, match="window"):
        EbmPackPostprocessor(0, packer=context_packer, tiering=tiering)
    postprocessor = EbmPackPostprocessor(BUDGET, packer=context_packer, tiering=tiering)
    same = [NodeWithScore(node=TextNode(id_="x", text="a")), NodeWithScore(node=TextNode(id_="x", text="b"))]
    with pytest.raises(ValueError, match="unique"):
        postprocessor.postprocess_nodes(same, query_str=QUESTION)
