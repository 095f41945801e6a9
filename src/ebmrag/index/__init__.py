"""The knowledge base on disk: SQLite metadata, BM25 and dense indexes in atomic generations; hybrid search."""
