"""Softmax and the most likely label: the last step of every linear text classifier here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

FloatMatrix = np.ndarray[Any, np.dtype[np.float64]]


def softmax(logits: FloatMatrix) -> FloatMatrix:
    """Row-wise softmax, shifted by each row's maximum so exp never overflows."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=1, keepdims=True))


def most_likely(labels: Sequence[str], probabilities: FloatMatrix) -> list[tuple[str, float]]:
    """(label, probability) of each row's most probable label."""
    best = probabilities.argmax(axis=1)
    return [(labels[int(b)], float(probabilities[i, b])) for i, b in enumerate(best)]
