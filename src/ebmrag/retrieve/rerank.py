"""Chunk reranking after retrieval: any object with `rerank(query, hits)` (the `index.types.Reranker`
contract). The shipped one is a cross-encoder: a local sentence-transformers folder, or the bundled MiniLM plus a
delta file (`evidence.adapters`), because a hospital network cannot download a model. No reranker model ships: the
one trained here on MedQuAD lowered LiveQA-Med nDCG@10 (docs/results/retrieval.md).

A cross-encoder reads each (question, chunk) pair together, so it sees what a bi-encoder's two separate vectors
miss (which of a page's sections answers this question); it costs a model call per pair, so only the first
`depth` hits are rescored. Its score is mixed with the retriever's (`mix`, both min-max normalised over those
hits): a reranker trained on one kind of question should refine the first stage, not overrule it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ModelUnavailableError
from ebmrag.index.types import Reranker, SearchHit
from ebmrag.models.adapters import delta_digest, load_delta
from ebmrag.models.embeddings import TurnLock, float32_weights, native_bf16
from ebmrag.models.tokens import bundled_model_dir
from ebmrag.retrieve.fusion import min_max


def shown_text(hit: SearchHit) -> str:
    """What the cross-encoder reads: the chunk headed by its document title and section, as the index embeds it."""
    head = " — ".join(part for part in (hit.title, hit.section) if part)
    return f"{head}\n{hit.text}" if head else hit.text


class CrossEncoderReranker:
    """Scores (query, chunk) pairs with a cross-encoder: a local folder or a `.npz` delta over the bundled MiniLM."""

    def __init__(self, model_path: str | Path, batch_size: int = 16, max_length: int = 512, depth: int = 0,
                 mix: float = 1.0) -> None:
        self._delta = Path(model_path) if str(model_path).endswith(".npz") else None
        if self._delta is None and not Path(model_path).is_dir():
            raise ModelUnavailableError(f"reranker model is not a local directory or a .npz delta: {model_path}")
        if self._delta is not None:
            delta_digest(self._delta)  # a missing file is an error now, not at the first question
        if batch_size < 1 or max_length < 8:
            raise ValueError(f"batch_size must be >= 1 and max_length >= 8, got {batch_size}, {max_length}")
        if depth < 0 or not 0.0 <= mix <= 1.0:
            raise ValueError(f"depth must be >= 0 (0: every hit) and mix in [0, 1], got {depth}, {mix}")
        self.model_path, self.batch_size, self.max_length = str(model_path), batch_size, max_length
        self.depth, self.mix = depth, mix
        self._model: Any = None
        self._loading = threading.Lock()  # one model, however many threads ask for it first
        self._forward = TurnLock()  # one scoring call at a time, in order of arrival (as the embedder's passes)

    def warm_up(self) -> None:
        if self._model is not None:
            return
        with self._loading:
            if self._model is None:
                self._model = self._load()

    def _load(self) -> Any:
        """The cross-encoder from the local folder only (`local_files_only`: never a hub), its parameters float32
        whatever the file stores (transformers 5 would keep the bundled model's float16)."""
        try:
            import torch  # noqa: F401  (the runtime needs it: a clear error when it is missing)
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise ModelUnavailableError("sentence-transformers is missing: pip install 'ebmrag[train]'") from exc
        path = bundled_model_dir() if self._delta else Path(self.model_path)
        try:
            model = CrossEncoder(str(path), device="cpu", max_length=self.max_length, local_files_only=True,
                                 num_labels=1 if self._delta else None, model_kwargs=float32_weights())
        except Exception as exc:  # the library raises many types for a bad folder
            raise ModelUnavailableError(f"could not load the reranker from {self.model_path}: {exc}") from exc
        if self._delta:
            delta = load_delta(self._delta)
            if "classifier.weight" not in delta.tensors:
                raise ModelUnavailableError(f"{self._delta} is not a cross-encoder delta: it has no scoring head "
                                            "(an embedding delta belongs in [kb] embedding_model)")
            delta.apply(model.model)
        return model

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        """Raw model scores (logits for a delta profile), one per text; higher is more relevant."""
        import torch

        self.warm_up()
        with self._forward, torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
            values = self._model.predict([(query, text) for text in texts], batch_size=self.batch_size,
                                         show_progress_bar=False, convert_to_numpy=True,
                                         activation_fn=torch.nn.Identity())
        return [float(v) for v in np.asarray(values, dtype=np.float32).reshape(len(texts), -1)[:, -1]]

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        """The first `depth` hits reordered by the mixed score, written into `score` (the model's own score when
        `mix` is 1); the rest follow unchanged."""
        if not hits:
            return []
        head, tail = (list(hits[:self.depth]), list(hits[self.depth:])) if self.depth else (list(hits), [])
        raw = self.scores(query, [shown_text(h) for h in head])
        mixed = np.asarray(raw) if self.mix == 1.0 else (
            self.mix * min_max(raw) + (1 - self.mix) * min_max([h.score for h in head]))
        ordered = sorted(zip(mixed.tolist(), range(len(head)), head, strict=True), key=lambda t: (-t[0], t[1]))
        return [replace(hit, score=score) for score, _, hit in ordered] + tail

    def to_dict(self) -> dict[str, Any]:
        return {"type": "cross-encoder", "model_path": self.model_path, "batch_size": self.batch_size,
                "max_length": self.max_length, "depth": self.depth, "mix": self.mix}


def reranker_from_dict(data: dict[str, Any]) -> Reranker:
    settings = dict(data)
    kind = settings.pop("type", None)
    if kind != "cross-encoder":
        raise ValueError(f"unknown reranker type {kind!r}; known: 'cross-encoder'")
    return CrossEncoderReranker(**settings)
