"""EBM-Pack as a LangChain document compressor, offline (pip install 'ebmrag[langchain]').

Run: python examples/langchain_pack.py [--budget 900]

The bundled demo guidelines go into LangChain's in-memory vector store embedded by the bundled MiniLM; a
ContextualCompressionRetriever with EbmPackCompressor returns what EBM-Pack keeps of the retrieved documents and
the bundled colon-surgery patient's record within the budget.
"""

from __future__ import annotations

import argparse

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from ebmrag.demo import demo_guidelines
from ebmrag.integrations.langchain import EbmPackCompressor, EbmragEmbeddings

QUESTION = "Which antibiotic should treat his post-operative wound infection?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=900)
    args = parser.parse_args()
    guides = demo_guidelines()
    store = InMemoryVectorStore(EbmragEmbeddings())
    store.add_documents([Document(page_content=g["text"], id=g["id"], metadata={"authority": g["authority"]})
                         for g in guides])
    retriever = ContextualCompressionRetriever(
        base_compressor=EbmPackCompressor(budget=args.budget, record="demo-colon"),
        base_retriever=store.as_retriever(search_kwargs={"k": 8}))
    for document in retriever.invoke(QUESTION):
        meta = document.metadata
        print(f"{document.id:32} {meta['ebmrag_tier']} {meta['ebmrag_state']:10} {meta['ebmrag_reason']}")


if __name__ == "__main__":
    main()
