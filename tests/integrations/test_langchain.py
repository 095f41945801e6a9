from __future__ import annotations

from typing import Any

import pytest

from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.records.fragment import PatientRecord
from tests.integrations.conftest import ALLERGY, BUDGET, QUESTION, first_that_fit

pytest.importorskip("langchain_classic", reason="the [langchain] extra is not installed")

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from ebmrag.integrations.langchain import EbmPackCompressor, EbmragEmbeddings

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def store(guidelines: list[dict[str, str]], record: PatientRecord, embedder: Any) -> InMemoryVectorStore:
    """The chart and the guidelines in one LangChain vector store, embedded by the bundled MiniLM."""
    vectors = InMemoryVectorStore(EbmragEmbeddings(embedder))
    vectors.add_documents([Document(page_content=f.text, id=f.id, metadata={"kind": "chart"})
                           for f in record.fragments])
    vectors.add_documents([Document(page_content=g["text"], id=g["id"],
                                    metadata={"title": g["title"], "authority": g["authority"]}) for g in guidelines])
    return vectors


def test_the_allergy_survives_a_budget_the_plain_retriever_loses(
        store: InMemoryVectorStore, record: PatientRecord, context_packer: ContextPacker,
        tiering: Tiering) -> None:
    plain_docs = store.as_retriever(search_kwargs={"k": 12}).invoke(QUESTION)
    allergy_text = next(f.text for f in record.fragments if f.id == ALLERGY)
    assert allergy_text not in first_that_fit([d.page_content for d in plain_docs], context_packer)

    guides_only = store.as_retriever(search_kwargs={"k": 8, "filter": lambda d: d.metadata.get("kind") != "chart"})
    compressor = EbmPackCompressor(BUDGET, record="demo-colon", packer=context_packer, tiering=tiering)
    pipeline = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=guides_only)
    documents = pipeline.invoke(QUESTION)
    allergy = next(d for d in documents if d.id == f"patient:{ALLERGY}")
    assert allergy.metadata["ebmrag_reason"] == "allergy" and allergy.metadata["ebmrag_kind"] == "patient"
    assert sum(context_packer.token_counter.count(d.page_content) for d in documents) <= BUDGET
    kept, selection = compressor.select(guides_only.invoke(QUESTION), QUESTION)
    assert [d.id for d in kept] == [d.id for d in documents]
    evidence = {d.id for d in documents if d.metadata["ebmrag_kind"] == "evidence"}
    assert {d.id for d in selection.dropped if d.kind == "evidence"} | evidence == {
        d.id for d in guides_only.invoke(QUESTION)}  # every retrieved document has a recorded fate

    roomy = EbmPackCompressor(900, record="demo-colon", packer=context_packer,
                              tiering=tiering).compress_documents(guides_only.invoke(QUESTION), QUESTION)
    guideline = [d for d in roomy if d.metadata["ebmrag_kind"] == "evidence"]
    assert guideline and all(d.metadata["authority"] == "guideline" and d.metadata["ebmrag_tier"] == "T3"
                             for d in guideline)
    assert f"patient:{ALLERGY}" in [d.id for d in roomy]


def test_documents_without_ids_are_tracked_by_position(context_packer: ContextPacker, tiering: Tiering) -> None:
    compressor = EbmPackCompressor(BUDGET, packer=context_packer, tiering=tiering)
    documents = [Document(page_content="Cefazolin covers skin flora in surgical wound infection."),
                 Document(page_content="Vancomycin needs dose adjustment in kidney impairment.")]
    kept, selection = compressor.select(documents, QUESTION)
    assert {d.page_content for d in kept} == {d.page_content for d in documents}
    assert {p.id for p in selection.placed} == {"doc-0", "doc-1"}
    with pytest.raises(ValueError, match="question is empty"):
        compressor.compress_documents(documents, " ")
