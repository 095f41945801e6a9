"""Chunk reranking after retrieval: any object with `rerank(query, hits)` (the `index.types.Reranker`
contract); the shipped one is a cross-encoder loaded from a local folder, because no reranker model
ships in a pip package and a hospital network cannot download one."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ebmrag.errors import ModelUnavailableError
from ebmrag.index.types import Reranker, SearchHit


class CrossEncoderReranker:
    """Scores (query, chunk text) pairs with a sentence-transformers cross-encoder from a local folder."""

    def __init__(self, model_path: str | Path, batch_size: int = 16, max_length: int = 512) -> None:
        if not Path(model_path).is_dir():
            raise ModelUnavailableError(f"reranker model path is not a local directory: {model_path}")
        if batch_size < 1 or max_length < 8:
            raise ValueError(f"batch_size must be >= 1 and max_length >= 8, got {batch_size}, {max_length}")
        self.model_path, self.batch_size, self.max_length = Path(model_path), batch_size, max_length
        self._model: Any = None

    def warm_up(self) -> None:
        if self._model is not None:
            return
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise ModelUnavailableError("sentence-transformers is missing: pip install 'ebmrag[embed]'") from exc
        try:
            self._model = CrossEncoder(str(self.model_path), device="cpu", max_length=self.max_length,
                                       local_files_only=True)
        except Exception as exc:  # the library raises many types for a bad folder
            raise ModelUnavailableError(f"could not load the reranker from {self.model_path}: {exc}") from exc

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        self.warm_up()
        values = self._model.predict([(query, text) for text in texts], batch_size=self.batch_size,
                                     show_progress_bar=False, convert_to_numpy=True)
        return [float(v) for v in values.reshape(len(texts), -1)[:, -1]]

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        if not hits:
            return []
        scored = zip(self.scores(query, [h.text for h in hits]), range(len(hits)), hits, strict=True)
        return [replace(hit, score=score) for score, _, hit in sorted(scored, key=lambda t: (-t[0], t[1]))]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "cross-encoder", "model_path": str(self.model_path), "batch_size": self.batch_size,
                "max_length": self.max_length}


def reranker_from_dict(data: dict[str, Any]) -> Reranker:
    settings = dict(data)
    kind = settings.pop("type", None)
    if kind != "cross-encoder":
        raise ValueError(f"unknown reranker type {kind!r}; known: 'cross-encoder'")
    return CrossEncoderReranker(**settings)
