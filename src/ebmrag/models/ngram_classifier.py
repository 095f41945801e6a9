"""A multinomial logistic regression over hashed word and character n-grams, saved as plain arrays (never a pickle).

The tier classifier's fallback where no rule speaks (rules/tier_ngram.npz, trained by bench/train_tier_model.py).
It needs no embedding, so a fragment costs tens of microseconds instead of milliseconds. Features: lower-cased
NFKC word unigrams and bigrams for Latin text (every number collapsed to its shape, so '6.8' and '7.2' are one
feature), character 1- to n-grams (n = 3 by default) inside each run of Chinese characters, and a few shape
features (a number with a unit, a length bucket). Each feature is hashed with `zlib.crc32` (stable across processes
and Python versions, unlike `hash()`) into a power-of-two number of buckets; a text is the set of its buckets,
L2-normalized.

A file holds `columns` (the buckets with a non-zero weight, increasing), `weights` (labels × columns), `bias` and a
JSON `meta` (labels, buckets, the feature spec, training sources and date). Loading runs no code and checks every
array; prediction is a gather, a sum and a softmax in NumPy, so scikit-learn is needed only to train.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import unicodedata
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ConfigError, require_extra
from ebmrag.models.softmax import most_likely, softmax

FORMAT = "ebmrag-hashed-ngram/1"
FloatMatrix = np.ndarray[Any, np.dtype[np.float64]]

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# One match per token: a run of Chinese characters, a number, a Latin (or Greek) word, or a comparison/percent sign.
_TOKEN = re.compile(rf"([{_CJK}]+)|(\d+(?:[.,]\d+)*)|([a-z\u00df-\u024f\u03b1-\u03c9]+(?:'[a-z]+)?)|([%<>=≤≥±])")
_DIGITS = re.compile(r"\d+")
_NUMBER_UNIT = re.compile(
    r"\d\s*(?:%|‰|×\s*10|x\s*10|mg|mcg|µg|μg|ng|pg|g/|kg|mmol|µmol|μmol|umol|nmol|pmol|mol/|meq|miu|iu|u/|ml|dl|"
    r"mmhg|mm\s*hg|mm|cm|bpm|/min|/h|/mm|/µl|/μl|/ul|/hpf|s\b|sec|ms|°|fl\b|pg\b|g\b|l\b|u\b|"
    r"次/分|毫米汞柱|克|毫克|升|厘米|毫米)")


@dataclass(frozen=True)
class NgramFeatures:
    """Which features a text yields; stored in the model file so training and prediction cannot disagree."""

    buckets: int = 2**16
    word_ngrams: int = 2  # Latin word n-grams, 1..n
    char_ngrams: int = 3  # character n-grams inside Chinese runs, 1..n
    shapes: bool = True  # number+unit, any number, length bucket

    def __post_init__(self) -> None:
        if self.buckets < 2**8 or self.buckets > 2**24 or self.buckets & (self.buckets - 1):
            raise ValueError(f"buckets must be a power of two in [2**8, 2**24], got {self.buckets}")
        if not 1 <= self.word_ngrams <= 3 or not 1 <= self.char_ngrams <= 4:
            raise ValueError(f"word_ngrams must be 1..3 and char_ngrams 1..4, got {self.word_ngrams}, "
                             f"{self.char_ngrams}")

    def features(self, text: str) -> list[str]:
        """The feature strings of a text, before hashing (repeats kept; hashing makes a set)."""
        normalized = unicodedata.normalize("NFKC", text).lower()
        out: list[str] = []
        words: list[str] = []  # Latin tokens since the last Chinese run (a run breaks word n-grams)
        numbers = False
        for cjk, number, word, sign in _TOKEN.findall(normalized):
            if cjk:
                self._word_grams(words, out)
                words = []
                for n in range(1, min(self.char_ngrams, len(cjk)) + 1):
                    out += ["c" + cjk[i:i + n] for i in range(len(cjk) - n + 1)]
            elif number:
                numbers = True
                words.append(_DIGITS.sub("0", number))
            else:
                words.append(word or sign)
        self._word_grams(words, out)
        if self.shapes:
            if numbers:
                out.append("#num")
                if _NUMBER_UNIT.search(normalized):
                    out.append("#num+unit")
            out.append(f"#len{min(len(normalized).bit_length(), 12)}")
        return out

    def _word_grams(self, words: list[str], out: list[str]) -> None:
        out += ["w" + w for w in words]
        if self.word_ngrams >= 2:
            out += [f"w{a} {b}" for a, b in pairwise(words)]
        if self.word_ngrams >= 3:
            out += [f"w{a} {b} {c}" for a, b, c in zip(words, words[1:], words[2:], strict=False)]

    def buckets_of(self, text: str) -> list[int]:
        """The sorted, distinct buckets of a text: crc32 of each feature's UTF-8 bytes, modulo `buckets`.

        Never empty when `shapes` is on (the length bucket is always there)."""
        mask = self.buckets - 1
        return sorted({zlib.crc32(f.encode()) & mask for f in self.features(text)})

    def to_dict(self) -> dict[str, Any]:
        return {"hash": "crc32-utf8", "normalize": "NFKC+lower", "norm": "l2-binary", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NgramFeatures:
        if data.get("hash") != "crc32-utf8" or data.get("norm") != "l2-binary":
            raise ValueError(f"unknown feature hashing or norm: {data.get('hash')!r}, {data.get('norm')!r}")
        return cls(buckets=int(data["buckets"]), word_ngrams=int(data["word_ngrams"]),
                   char_ngrams=int(data["char_ngrams"]), shapes=bool(data["shapes"]))


class HashedNgramClassifier:
    """Same interface as LinearTextClassifier (`path`, `labels`, `predict`), without an embedder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with np.load(self.path, allow_pickle=False) as data:
                columns, weights, bias = data["columns"], data["weights"], data["bias"]
                self.meta: dict[str, Any] = json.loads(str(data["meta"]))
            if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
                raise ValueError(f"meta is not a {FORMAT} description")
            self.spec = NgramFeatures.from_dict(self.meta["features"])
            self.labels = [str(label) for label in self.meta["labels"]]
            self._weights = self._validated(columns, weights, bias)  # (buckets, labels), float32
            self.bias = np.asarray(bias, np.float32)
        except (OSError, KeyError, ValueError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"n-gram classifier {self.path} could not be read: {exc}") from exc

    def _validated(self, columns: np.ndarray[Any, Any], weights: np.ndarray[Any, Any],
                   bias: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
        n = len(self.labels)
        if n < 2 or len(set(self.labels)) != n:
            raise ValueError(f"labels must be two or more distinct names, got {self.labels}")
        if columns.ndim != 1 or not np.issubdtype(columns.dtype, np.integer):
            raise ValueError(f"columns must be a 1-D integer array, got {columns.dtype} {columns.shape}")
        columns = columns.astype(np.int64)  # np.diff of unsigned integers wraps around
        if columns.size and (columns[0] < 0 or columns[-1] >= self.spec.buckets or np.any(np.diff(columns) <= 0)):
            raise ValueError(f"columns must be increasing buckets in [0, {self.spec.buckets})")
        if weights.shape != (n, columns.size) or bias.shape != (n,):
            raise ValueError(f"weights {weights.shape} / bias {bias.shape} do not fit {n} labels and "
                             f"{columns.size} columns")
        if not (np.all(np.isfinite(weights)) and np.all(np.isfinite(bias))):
            raise ValueError("weights or bias are not finite")
        dense = np.zeros((self.spec.buckets, n), np.float32)
        dense[columns] = weights.T
        return dense

    def probabilities(self, texts: Sequence[str]) -> FloatMatrix:
        """Softmax probabilities, one row per text, columns in `labels` order."""
        logits = np.empty((len(texts), len(self.labels)), np.float64)
        for row, text in enumerate(texts):
            buckets = self.spec.buckets_of(text) or [0]  # [0]: an empty text without shape features (as in fitting)
            logits[row] = self._weights[buckets].sum(axis=0) / math.sqrt(len(buckets))
        return softmax(logits + self.bias)

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """(label, probability) per text."""
        return most_likely(self.labels, self.probabilities(texts)) if texts else []


def fit_ngram_classifier(texts: Sequence[str], labels: Sequence[str], out: str | Path, c: float = 1.0,
                         features: NgramFeatures = NgramFeatures(), sample_weight: Sequence[float] | None = None,
                         extra_meta: dict[str, Any] | None = None, prune: float = 1e-3) -> HashedNgramClassifier:
    """Fit multinomial logistic regression (balanced classes, times `sample_weight`) and save it.

    Weights whose magnitude is below `prune` for every label are dropped (they barely move a logit), which
    with float16 keeps a 2**16-bucket model well under a megabyte. Returns the saved model, loaded."""
    require_extra("sklearn", "train", "training an n-gram classifier")
    sparse = require_extra("scipy.sparse", "embed", "training an n-gram classifier")
    from sklearn.linear_model import LogisticRegression

    if len(texts) != len(labels) or not texts:
        raise ValueError(f"need as many labels as texts (and some texts), got {len(texts)} and {len(labels)}")
    rows = [features.buckets_of(text) or [0] for text in texts]
    indptr = np.concatenate(([0], np.cumsum([len(r) for r in rows])))
    values = np.concatenate([np.full(len(r), 1.0 / math.sqrt(len(r))) for r in rows])
    columns = np.fromiter((b for row in rows for b in row), np.int64, int(indptr[-1]))
    matrix = sparse.csr_matrix((values, columns, indptr), shape=(len(texts), features.buckets))
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
    model.fit(matrix, np.asarray(labels), sample_weight=None if sample_weight is None else np.asarray(sample_weight))
    weights, bias = np.asarray(model.coef_), np.asarray(model.intercept_)
    if len(model.classes_) == 2:  # scikit-learn stores one row for two classes: expand to a softmax pair
        weights, bias = np.vstack([-weights[0] / 2, weights[0] / 2]), np.array([-bias[0] / 2, bias[0] / 2])
    kept = np.flatnonzero(np.abs(weights).max(axis=0) >= prune).astype(np.uint32)
    meta = {"format": FORMAT, "labels": [str(label) for label in model.classes_], "features": features.to_dict(),
            "c": c, "trained": datetime.date.today().isoformat(), "texts": len(texts), "kept_buckets": int(kept.size),
            **(extra_meta or {})}
    with Path(out).open("wb") as handle:
        np.savez_compressed(handle, columns=kept, weights=weights[:, kept].astype(np.float16),
                            bias=bias.astype(np.float32), meta=np.array(json.dumps(meta, ensure_ascii=False)))
    return HashedNgramClassifier(out)
