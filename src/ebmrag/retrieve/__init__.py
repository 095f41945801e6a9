"""Finding evidence in the knowledge base: BM25 / dense / hybrid search, fusion, reranking, the question's focus,
ICA-RAG's chunk-to-document vote and query rewriting (expansion, HyDE)."""
