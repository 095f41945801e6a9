"""`[kb]`: what a knowledge base is (fixed at creation, stored in its manifest) and how it is written and stored."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ebmrag.errors import KnowledgeBaseError
from ebmrag.models.embeddings import EMBEDDING_PRECISIONS, EMBEDDING_RUNTIMES

__all__ = ["CHUNKERS", "EMBEDDING_PRECISIONS", "EMBEDDING_RUNTIMES", "KnowledgeBaseConfig", "StorageSettings"]

CHUNKERS = ("", "fixed", "recursive", "structure", "sentence")


def check_embedding(runtime: str, precision: str) -> None:
    """The runtime and precision of an embedder, as [models] and [kb] both name them: known, and compatible."""
    if precision not in EMBEDDING_PRECISIONS:
        raise ValueError(f"embedding_precision must be one of {EMBEDDING_PRECISIONS}, got {precision!r}")
    if runtime not in EMBEDDING_RUNTIMES:
        raise ValueError(f"embedding_runtime must be one of {EMBEDDING_RUNTIMES}, got {runtime!r}")
    if runtime == "onnx" and precision == "bf16":
        raise ValueError("embedding_precision bf16 runs on the torch runtime only; use fp32 or int8 with onnx")


@dataclass(frozen=True)
class KnowledgeBaseConfig:
    """Fixed when a knowledge base is created and stored in every generation's manifest."""

    embedding_model: str = ""  # "minilm-medquad": +0.07 nDCG@10 on the LiveQA check half, not yet the default
    embedding_max_tokens: int = 128
    embedding_precision: str = "auto"  # onnx: fp32; torch: bf16 where the CPU has it natively
    embedding_runtime: str = "auto"  # "onnx" (no torch), "torch", or auto: onnx wherever it can build the model
    chunker: str = ""
    contextual_prefix: bool = True
    k1: float = 1.5
    b: float = 0.75
    hnsw_min_rows: int = 20_000

    def __post_init__(self) -> None:
        if self.chunker not in CHUNKERS:
            raise ValueError(f"unknown chunker {self.chunker!r}")
        check_embedding(self.embedding_runtime, self.embedding_precision)
        if self.hnsw_min_rows < 0:
            raise ValueError("hnsw_min_rows must be >= 0")

    @classmethod
    def from_manifest(cls, stored: dict[str, Any], where: Path) -> KnowledgeBaseConfig:
        """The config a generation was built with; `quantize` (before precision profiles) maps to int8 / fp32, and
        a manifest from before runtimes was embedded by torch."""
        values = dict(stored)
        if "quantize" in values:
            values["embedding_precision"] = "int8" if values.pop("quantize") else "fp32"
        values.setdefault("embedding_precision", "fp32")
        values.setdefault("embedding_runtime", "torch")
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise KnowledgeBaseError(f"{where}: manifest has unknown settings {sorted(unknown)}; "
                                     "it was written by a newer ebmrag")
        return cls(**values)


@dataclass(frozen=True)
class StorageSettings:
    """How a knowledge base is written and stored; unlike `KnowledgeBaseConfig`, not part of what it is."""

    backend: str = "embedded"
    uri: str = ""
    workers: int = 0
    segment_rows: int = 250_000
    merge_factor: int = 10

    def __post_init__(self) -> None:
        if self.backend not in ("embedded", "milvus"):
            raise ValueError(f"backend must be 'embedded' or 'milvus', got {self.backend!r}")
        if self.backend == "milvus" and not self.uri:
            raise ValueError("backend 'milvus' needs uri = \"http://host:19530\"")
        if self.workers < 0 or self.segment_rows < 1:
            raise ValueError("workers must be >= 0 and segment_rows >= 1")
        if self.merge_factor != 0 and self.merge_factor < 2:
            raise ValueError(f"merge_factor must be 0 (never merge automatically) or >= 2, got {self.merge_factor}")
