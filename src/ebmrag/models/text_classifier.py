"""A linear classifier over sentence embeddings, saved as plain arrays (never a pickle).

Used where rules are silent: the tier classifier's fallback (rules/tier_model.npz) and the retrieval
gate's trained A/B/C labeller. A file holds `weights` (labels × dim), `bias` and a JSON `meta` with
the label order and the embedding model it was trained on; loading it runs no code, and prediction
is a softmax in NumPy, so scikit-learn is needed only to train.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ConfigError, require_extra
from ebmrag.models.ngram_classifier import FORMAT, HashedNgramClassifier
from ebmrag.models.softmax import most_likely, softmax
from ebmrag.protocols import Embedder, TextClassifier

FloatMatrix = np.ndarray[Any, np.dtype[np.float64]]


class LinearTextClassifier:
    def __init__(self, path: str | Path, embedder: Embedder) -> None:
        self.path = Path(path)
        try:
            with np.load(self.path) as data:
                self.weights, self.bias = data["weights"], data["bias"]
                self.meta: dict[str, Any] = json.loads(str(data["meta"]))
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"classifier {self.path} could not be read: {exc}") from exc
        self.labels = [str(label) for label in self.meta["labels"]]
        self.embedder = embedder

    def probabilities(self, texts: Sequence[str]) -> FloatMatrix:
        return softmax(np.asarray(self.embedder.embed(list(texts)), np.float64) @ self.weights.T + self.bias)

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """(label, probability) per text, in one embedding call."""
        return most_likely(self.labels, self.probabilities(texts)) if texts else []


def fit_linear_classifier(texts: Sequence[str], labels: Sequence[str], embedder: Embedder, out: str | Path,
                          c: float = 1.0, extra_meta: dict[str, Any] | None = None) -> FloatMatrix:
    """Fit multinomial logistic regression (balanced classes) and save it; returns the embedded texts."""
    require_extra("sklearn", "train", "training a text classifier")
    from sklearn.linear_model import LogisticRegression

    vectors = np.asarray(embedder.embed(list(texts)), np.float64)
    model = LogisticRegression(max_iter=3000, C=c, class_weight="balanced").fit(vectors, np.asarray(labels))
    weights, bias = model.coef_, model.intercept_
    if len(model.classes_) == 2:  # scikit-learn stores one row for two classes: expand to a softmax pair
        weights, bias = np.vstack([-weights[0] / 2, weights[0] / 2]), np.array([-bias[0] / 2, bias[0] / 2])
    meta = {"labels": [str(c) for c in model.classes_], "embedding_model": getattr(embedder, "model_name", ""),
            **(extra_meta or {})}
    with Path(out).open("wb") as handle:
        np.savez(handle, weights=weights, bias=bias, meta=np.array(json.dumps(meta)))
    return vectors


def load_text_classifier(path: str | Path, embedder: Embedder) -> TextClassifier:
    """Either kind of saved classifier, told apart by its file: a hashed n-gram model (no embedder needed,
    models.ngram_classifier) or a linear model over `embedder`'s sentence vectors."""
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"classifier {path} could not be read: {exc}") from exc
    if isinstance(meta, dict) and meta.get("format") == FORMAT:
        return HashedNgramClassifier(path)
    return LinearTextClassifier(path, embedder)
