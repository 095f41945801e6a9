"""The two Milvus collections of a knowledge base (see `milvus.py`): fields, the BM25 function and indexes."""

from __future__ import annotations

from typing import Any

from ebmrag.errors import require_extra
from ebmrag.index.params import KnowledgeBaseConfig

HNSW_M, HNSW_EF_CONSTRUCTION = 16, 200  # as the embedded backend's graphs
# Milvus strings have a fixed maximum length: a document whose value exceeds one is refused, named.
LIMITS = {"doc_id": 1024, "chunk_id": 1100, "section": 4096, "section_id": 1024, "text": 65_535, "terms": 65_535,
          "source": 1024, "date": 64, "authority": 64, "title": 4096, "origin": 4096, "metadata": 65_535,
          "content_hash": 128, "source_type": 64, "ingested_at": 64}


def create_collections(client: Any, chunks: str, documents: str, dim: int, config: KnowledgeBaseConfig) -> None:
    """Create both collections, strongly consistent (a search right after a write sees it)."""
    pymilvus = require_extra("pymilvus", "milvus", "the Milvus knowledge-base backend")
    DataType, Function, FunctionType = pymilvus.DataType, pymilvus.Function, pymilvus.FunctionType  # noqa: N806

    schema = client.create_schema(auto_id=True, description="ebmrag chunks")
    schema.add_field("row", DataType.INT64, is_primary=True)
    for name in ("chunk_id", "doc_id", "section", "section_id", "text", "source", "date", "authority"):
        schema.add_field(name, DataType.VARCHAR, max_length=LIMITS[name])
    for name in ("position", "char_start", "char_end", "write_id"):
        schema.add_field(name, DataType.INT64)
    schema.add_field("terms", DataType.VARCHAR, max_length=LIMITS["terms"], enable_analyzer=True, enable_match=True,
                     analyzer_params={"tokenizer": "standard"})
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_function(Function(name="bm25", function_type=FunctionType.BM25, input_field_names=["terms"],
                                 output_field_names=["sparse"]))
    indexes = client.prepare_index_params()
    indexes.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25",
                      params={"bm25_k1": config.k1, "bm25_b": config.b})
    indexes.add_index(field_name="vector", index_type="HNSW", metric_type="IP",
                      params={"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION})
    indexes.add_index(field_name="doc_id", index_type="INVERTED")
    client.create_collection(chunks, schema=schema, index_params=indexes, consistency_level="Strong")

    catalog = client.create_schema(auto_id=False, description="ebmrag documents and manifest")
    catalog.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=LIMITS["doc_id"])
    for name in ("content_hash", "source", "source_type", "title", "date", "authority", "origin", "metadata",
                 "ingested_at"):
        catalog.add_field(name, DataType.VARCHAR, max_length=LIMITS[name])
    catalog.add_field("n_chunks", DataType.INT64)
    catalog.add_field("marker", DataType.FLOAT_VECTOR, dim=2)  # Milvus wants a vector field in every collection
    catalog_indexes = client.prepare_index_params()
    catalog_indexes.add_index(field_name="marker", index_type="FLAT", metric_type="IP")
    client.create_collection(documents, schema=catalog, index_params=catalog_indexes, consistency_level="Strong")
