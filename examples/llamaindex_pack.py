"""EBM-Pack inside a LlamaIndex retriever pipeline, offline (pip install 'ebmrag[llamaindex]').

Run: python examples/llamaindex_pack.py [--budget 900]

The bundled demo guidelines go into a LlamaIndex vector index embedded by the bundled MiniLM; the node
postprocessor packs the retrieved nodes with the bundled colon-surgery patient's record into the budget and prints
what it kept, and why, and what it left out.
"""

from __future__ import annotations

import argparse

from llama_index.core import Document, VectorStoreIndex

from ebmrag.demo import demo_guidelines
from ebmrag.integrations.llamaindex import EbmPackPostprocessor, EbmragEmbedding

QUESTION = "Which antibiotic should treat his post-operative wound infection?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=900)
    args = parser.parse_args()
    guides = demo_guidelines()
    index = VectorStoreIndex.from_documents(
        [Document(id_=g["id"], text=g["text"], metadata={"title": g["title"], "authority": g["authority"]})
         for g in guides], embed_model=EbmragEmbedding())
    postprocessor = EbmPackPostprocessor(budget=args.budget, record="demo-colon")
    nodes = index.as_retriever(similarity_top_k=8).retrieve(QUESTION)
    kept, selection = postprocessor.select(nodes, QUESTION)
    print(f"{selection.tokens_used} of {args.budget} tokens")
    for node in kept:
        meta = node.node.metadata
        print(f"  kept {node.node.node_id:32} {meta['ebmrag_tier']} {meta['ebmrag_state']:10} {meta['ebmrag_reason']}")
    for left in selection.dropped:
        print(f"  left {left.id:32} {left.tier} {left.reason}")


if __name__ == "__main__":
    main()
