from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.errors import EbmragError
from ebmrag.packing.packer import ContextPacker
from ebmrag.records.fragment import PatientRecord
from tests.integrations.conftest import ALLERGY, BUDGET, QUESTION, first_that_fit

pytest.importorskip("haystack", reason="the [haystack] extra is not installed")

from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from ebmrag.integrations.haystack import EbmPack

pytestmark = pytest.mark.model


def store_of(documents: list[Document]) -> InMemoryDocumentStore:
    store = InMemoryDocumentStore()
    store.write_documents(documents)
    return store


def test_the_allergy_survives_a_budget_the_plain_retriever_loses(
        guidelines: list[dict[str, str]], record: PatientRecord, context_packer: ContextPacker) -> None:
    guides = [Document(id=g["id"], content=g["text"], meta={"authority": g["authority"]}) for g in guidelines]
    chart = [Document(id=f.id, content=f.text) for f in record.fragments]
    plain = InMemoryBM25Retriever(store_of(chart + guides)).run(query=QUESTION)["documents"]  # its top_k 10
    allergy_text = next(f.text for f in record.fragments if f.id == ALLERGY)
    assert allergy_text not in first_that_fit([d.content or "" for d in plain], context_packer)

    pipeline = Pipeline()
    pipeline.add_component("retriever", InMemoryBM25Retriever(store_of(guides)))
    pipeline.add_component("pack", EbmPack(BUDGET, record="demo-colon"))
    pipeline.connect("retriever.documents", "pack.documents")
    out = pipeline.run({"retriever": {"query": QUESTION}, "pack": {"query": QUESTION}})["pack"]
    allergy = next(d for d in out["documents"] if d.id == f"patient:{ALLERGY}")
    assert allergy.meta["ebmrag_reason"] == "allergy" and allergy.meta["ebmrag_tier"] == "T1"
    assert sum(context_packer.token_counter.count(d.content or "") for d in out["documents"]) <= BUDGET
    retrieved = {d.id for d in InMemoryBM25Retriever(store_of(guides)).run(query=QUESTION)["documents"]}
    placed = {d.id for d in out["documents"] if d.meta["ebmrag_kind"] == "evidence"}
    dropped = {d["id"] for d in out["dropped"] if d["kind"] == "evidence"}
    assert placed | dropped == retrieved and all(d["reason"] for d in out["dropped"])

    rebuilt = Pipeline.loads(pipeline.dumps(), allowed_modules=["ebmrag.integrations.haystack"])  # serialises
    assert rebuilt.get_component("pack").to_dict() == pipeline.get_component("pack").to_dict()


def test_constructor_refuses_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="window"):
        EbmPack(0)
    with pytest.raises(EbmragError):
        EbmPack(BUDGET, record=str(tmp_path / "missing.json"))
    component = EbmPack(BUDGET, record="demo-colon", strategy="fifo")
    assert EbmPack.from_dict(component.to_dict()).to_dict() == component.to_dict()
