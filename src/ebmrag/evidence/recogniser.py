"""The learned recogniser of critical facts: does a sentence state a critical fact of this patient, which kind, and
where are its drug, reaction, gene, variant, analyte and value?

Rules recognise what their vocabularies name; text written by people who never read the rule files ("rash two days
into the co-amoxiclav", a gene no list holds, "服用xx后第二天出现皮疹") needs a reader of meaning. This one is a small
multilingual encoder (multilingual-e5-small, its first layers, fine-tuned by `bench/train_recogniser.py` on openly
licensed corpora only; `models/recogniser/card.json` names them) with two sigmoid heads: one probability per kind
of fact (on the mean of the token states) and one per span type and token. It runs on ONNX Runtime from the graph
shipped in the package (`models/recogniser/recogniser.onnx`, written by `bench/export_recogniser.py`), with no
torch and nothing downloaded.

The tier classifier asks it only where its rules are silent or unsure, and takes its answer only when it is the
more protective one (evidence/tiers.py). A fragment is read sentence by sentence (the model was trained on
sentences, and a long note would be truncated): a kind holds for the fragment when any sentence states it, with
that sentence's spans.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ModelUnavailableError
from ebmrag.text.sentences import split_sentences

BUNDLED_RECOGNISER = Path(__file__).parent / "models" / "recogniser"
_FILES = ("recogniser.onnx", "tokenizer.json", "card.json")
_BATCH = 32  # sentences per forward pass of an fp32 graph; an int8 graph reads one at a time (see `_read`)
_SPAN_MIN = 0.5  # a token is inside a span when its span probability reaches this


@dataclass(frozen=True)
class EntitySpan:
    """A drug, reaction, gene, variant, analyte or value the model marks, with its characters in the text."""

    type: str
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Recognition:
    """What the model says of one text: the probability of each kind, the kinds at or above their threshold (the
    strongest first) and the spans of the sentence that states the strongest."""

    probabilities: Mapping[str, float]
    kinds: tuple[str, ...]
    spans: tuple[EntitySpan, ...] = ()

    def describe(self) -> str:
        """The spans as a tier decision's finding: "DRUG=co-amoxiclav; REACTION=rash"."""
        return "; ".join(dict.fromkeys(f"{s.type}={s.text}" for s in self.spans))


class CriticalRecogniser:
    """Component: `run(texts)` -> one `Recognition` per text.

    `folder` holds `recogniser.onnx`, `tokenizer.json` and `card.json` (kinds, span types, per-kind thresholds
    chosen on the development set, the token limit); the bundled one by default. Built once by the composition
    root; a folder that is missing a file or whose card does not fit the graph stops start-up with a clear error."""

    def __init__(self, folder: str | Path = BUNDLED_RECOGNISER, threads: int = 0) -> None:
        self.folder = Path(folder)
        missing = [name for name in _FILES if not (self.folder / name).is_file()]
        if missing:
            raise ModelUnavailableError(f"recogniser folder {self.folder}: missing {', '.join(missing)}")
        if threads < 0:
            raise ValueError(f"recogniser threads must be >= 0, got {threads}")
        self.threads = threads
        card = _read_card(self.folder / "card.json")
        self.kinds: tuple[str, ...] = tuple(card["kinds"])
        self.span_types: tuple[str, ...] = tuple(card["span_types"])
        self.thresholds = {kind: float(card["thresholds"][kind]) for kind in self.kinds}
        # a kind whose threshold no probability reaches is not the model's to decide (too few to check on dev)
        self.confirmable = tuple(kind for kind in self.kinds if self.thresholds[kind] <= 1.0)
        self.max_tokens = int(card["max_tokens"])
        self.batch = 1 if str(card.get("precision", "")).startswith("int8") else _BATCH
        self.fingerprint = _digest(self.folder)
        self._tokenizer, self._session = _load(self.folder.resolve(), self.max_tokens, threads, self.fingerprint)
        self._check_outputs()

    def run(self, texts: Sequence[str]) -> list[Recognition]:
        """Every text read sentence by sentence, all sentences in length-sorted batches (little padding)."""
        sentences = [(i, s) for i, text in enumerate(texts) for s in split_sentences(text)]
        read = self._read([s.text for _, s in sentences])
        kinds: dict[int, np.ndarray] = {}
        spans: dict[int, tuple[float, tuple[EntitySpan, ...]]] = {}
        for (owner, sentence), (probabilities, marked) in zip(sentences, read, strict=True):
            kinds[owner] = np.maximum(kinds[owner], probabilities) if owner in kinds else probabilities
            if owner not in spans or probabilities.max() > spans[owner][0]:  # offsets into the text, not the sentence
                spans[owner] = (float(probabilities.max()), tuple(
                    replace(m, start=m.start + sentence.start, end=m.end + sentence.start) for m in marked))
        nothing = np.zeros(len(self.kinds), np.float32)
        return [self._recognition(kinds.get(i, nothing), spans.get(i, (0.0, ()))[1]) for i in range(len(texts))]

    def _recognition(self, probabilities: np.ndarray, spans: tuple[EntitySpan, ...]) -> Recognition:
        scores = {kind: round(float(p), 4) for kind, p in zip(self.kinds, probabilities, strict=True)}
        above = sorted((k for k in self.kinds if scores[k] >= self.thresholds[k]), key=lambda k: -scores[k])
        return Recognition(scores, tuple(above), spans if above else ())

    def _read(self, sentences: list[str]) -> list[tuple[np.ndarray, tuple[EntitySpan, ...]]]:
        """Probabilities and spans per sentence. An int8 graph quantizes its activations with one scale per
        tensor, so a sentence read beside others would score by its neighbours (0.73 alone, 0.78 in a batch of
        three, measured): one sentence a pass keeps a fragment's decision independent of its chart."""
        out: list[tuple[np.ndarray, tuple[EntitySpan, ...]]] = [(np.zeros(0), ())] * len(sentences)
        encodings = self._tokenizer.encode_batch(sentences) if sentences else []
        order = sorted(range(len(sentences)), key=lambda i: len(encodings[i].ids))
        for at in range(0, len(order), self.batch):
            rows = order[at:at + self.batch]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), np.int64)
            mask = np.zeros((len(rows), width), np.int64)
            for r, i in enumerate(rows):
                ids[r, :len(encodings[i].ids)] = encodings[i].ids
                mask[r, :len(encodings[i].ids)] = 1
            kinds, spans = self._session.run(["kinds", "spans"], {"input_ids": ids, "attention_mask": mask})
            for r, i in enumerate(rows):
                out[i] = (kinds[r], self._spans(sentences[i], encodings[i].offsets, spans[r]))
        return out

    def _spans(self, sentence: str, offsets: Sequence[tuple[int, int]], probabilities: np.ndarray) -> tuple[
            EntitySpan, ...]:
        """Runs of tokens inside each span type, as character spans of the sentence."""
        found: list[EntitySpan] = []
        for column, kind in enumerate(self.span_types):
            start = end = -1
            for (a, b), p in zip(offsets, probabilities[:len(offsets), column], strict=True):
                if b <= a:
                    continue
                if p >= _SPAN_MIN and start >= 0 and a <= end + 1:
                    end = b
                elif p >= _SPAN_MIN:
                    if start >= 0:
                        found.append(EntitySpan(kind, start, end, sentence[start:end].strip()))
                    start, end = a, b
            if start >= 0:
                found.append(EntitySpan(kind, start, end, sentence[start:end].strip()))
        return tuple(sorted((s for s in found if s.text), key=lambda s: s.start))

    def _check_outputs(self) -> None:
        names = {o.name: o.shape for o in self._session.get_outputs()}
        if set(names) != {"kinds", "spans"} or names["kinds"][-1] != len(self.kinds) \
                or names["spans"][-1] != len(self.span_types):
            raise ModelUnavailableError(f"recogniser {self.folder}: the graph's outputs {names} do not fit its card "
                                        f"({len(self.kinds)} kinds, {len(self.span_types)} span types)")

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "threads": self.threads}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CriticalRecogniser:
        return cls(data.get("folder") or BUNDLED_RECOGNISER, int(data.get("threads", 0)))


def _read_card(path: Path) -> dict[str, Any]:
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelUnavailableError(f"recogniser card {path} cannot be read: {exc}") from None
    lacking = [key for key in ("kinds", "span_types", "thresholds", "max_tokens") if key not in card]
    if lacking or not isinstance(card.get("thresholds"), dict) or set(card["thresholds"]) < set(card["kinds"]):
        raise ModelUnavailableError(f"recogniser card {path}: needs kinds, span_types, max_tokens and a threshold "
                                    f"per kind ({', '.join(lacking) or 'thresholds'} missing)")
    return dict(card)


def _digest(folder: Path) -> str:
    """sha256 over the folder's three files: stored decisions are stale when the model changes."""
    digest = hashlib.sha256()
    for name in _FILES:
        digest.update(name.encode() + b"\0" + hashlib.sha256((folder / name).read_bytes()).digest())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=4)  # one session per model file and settings in a process (weights only; sessions are thread-safe)
def _load(folder: Path, max_tokens: int, threads: int, fingerprint: str) -> tuple[Any, Any]:
    """The tokenizer and ONNX session; `fingerprint` keys the cache to the files' content."""
    try:
        from tokenizers import Tokenizer

        from ebmrag.models.onnx_bert import open_session
    except ImportError as exc:
        raise ModelUnavailableError("the recogniser needs onnxruntime and tokenizers: pip install 'ebmrag[embed]'") \
            from exc
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.no_padding()
    try:
        session = open_session(folder / "recogniser.onnx", threads)
    except Exception as exc:  # onnxruntime raises its own types for a file that is not a model
        raise ModelUnavailableError(f"recogniser {folder / 'recogniser.onnx'} does not load: {exc}") from None
    return tokenizer, session
