"""EBM-Pack as a Haystack pipeline component, offline (pip install 'ebmrag[haystack]').

Run: python examples/haystack_pack.py [--budget 900]

BM25 over the bundled demo guidelines feeds EbmPack, which packs the retrieved documents with the bundled
colon-surgery patient's record into the budget; the kept documents and every left-out one are printed with reasons.
"""

from __future__ import annotations

import argparse

from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from ebmrag.demo import demo_guidelines
from ebmrag.integrations.haystack import EbmPack

QUESTION = "Which antibiotic should treat his post-operative wound infection?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=900)
    args = parser.parse_args()
    guides = demo_guidelines()
    store = InMemoryDocumentStore()
    store.write_documents([Document(id=g["id"], content=g["text"], meta={"authority": g["authority"]})
                           for g in guides])
    pipeline = Pipeline()
    pipeline.add_component("retriever", InMemoryBM25Retriever(store, top_k=8))
    pipeline.add_component("pack", EbmPack(budget=args.budget, record="demo-colon"))
    pipeline.connect("retriever.documents", "pack.documents")
    out = pipeline.run({"retriever": {"query": QUESTION}, "pack": {"query": QUESTION}})["pack"]
    for document in out["documents"]:
        meta = document.meta
        print(f"kept {document.id:32} {meta['ebmrag_tier']} {meta['ebmrag_state']:10} {meta['ebmrag_reason']}")
    for left in out["dropped"]:
        print(f"left {left['id']:32} {left['tier']} {left['reason']}")


if __name__ == "__main__":
    main()
