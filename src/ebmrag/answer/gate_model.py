"""The trainable gate labeller: labels from ICA-RAG's masking strategy, a classifier on sentence embeddings.

Annotation (ICA-RAG's two strategies), per case with a gold diagnosis R:
1. The model diagnoses from the whole record (D). If D matches R, each sentence is masked in turn:
   the sentence is C when the diagnosis from the rest still matches R, and A when it no longer does.
2. If D does not match R, each sentence is a BM25 query against the knowledge base: B when a hit
   names R (in its section or opening words), else C.
Matching is lenient on wording: the gold name is found in the prediction, or most of its content
words are. Costs n + 1 model calls per case (strategy 1), none for strategy 2. The prompt is the
`masking_diagnosis` step of llm/prompts/steps/{en,zh}.toml, in the record's language unless the caller names one.

The classifier is multinomial logistic regression (scikit-learn, balanced classes) over the bundled
sentence embeddings. It is saved as plain arrays (`.npz` + the label order and embedding model
name), not a pickle: a hospital can inspect it, and loading it runs no code. Prediction is a
softmax in NumPy, so scikit-learn is needed only to train.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, StrictStr

from ebmrag.answer.gate import Label, LabelledSentence, label_each
from ebmrag.errors import ConfigError, LLMError, require_extra
from ebmrag.llm.completion import complete_json
from ebmrag.llm.prompts import step_prompt
from ebmrag.models.text_classifier import LinearTextClassifier, fit_linear_classifier
from ebmrag.protocols import ChatClient, Embedder
from ebmrag.records.fragment import Fragment
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.text.language import prompt_language

log = logging.getLogger(__name__)
_WORD = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]")


def same_diagnosis(predicted: str, gold: str) -> bool:
    p, g = predicted.lower(), gold.lower().strip()
    if not g:
        return False
    if g in p:
        return True
    gold_words = set(_WORD.findall(g)) - {"of", "the", "and", "with", "disease", "syndrome"}
    return bool(gold_words) and len(gold_words & set(_WORD.findall(p))) / len(gold_words) >= 0.6


class DiagnosisReply(BaseModel):
    diagnosis: StrictStr


@dataclass(frozen=True)
class AnnotatedSentence:
    case_id: str
    text: str
    label: Label
    strategy: int  # 1: masking with a correct full diagnosis, 2: knowledge-base lookup

    def to_json(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "text": self.text, "label": self.label.value, "strategy": self.strategy}


class MaskingAnnotator:
    """Pipeline step: (case id, sentences, gold diagnosis) -> a label per sentence."""

    def __init__(self, client: ChatClient, retriever: HybridRetriever | None = None, lookup_depth: int = 10) -> None:
        if lookup_depth < 1:
            raise ValueError(f"lookup_depth must be >= 1, got {lookup_depth}")
        self.client, self.retriever, self.lookup_depth = client, retriever, lookup_depth

    def diagnose(self, sentences: Sequence[str], language: str | None = None) -> str:
        """The model's diagnosis; a reply that is not the JSON asked for is retried once, then taken as text.
        `language` picks the prompt (en, zh); without it, the sentences' own."""
        summary = " ".join(sentences)
        prompt = step_prompt("masking_diagnosis", language or prompt_language(summary))
        done = complete_json(self.client, prompt.messages(summary=summary), DiagnosisReply, max_tokens=64,
                             retry_hint=prompt.render("retry_hint"))
        if done.status == "failed":
            raise LLMError(done.error)
        return done.value.diagnosis if done.value is not None else done.text

    def annotate(self, case_id: str, sentences: Sequence[str], gold: str,
                 language: str | None = None) -> list[AnnotatedSentence]:
        """`language` picks the prompt for every call of the case (en, zh); without it, the whole record's."""
        if not sentences or not gold.strip():
            raise ValueError(f"case {case_id}: annotation needs sentences and a gold diagnosis")
        language = language or prompt_language(" ".join(sentences))
        try:
            correct = same_diagnosis(self.diagnose(sentences, language), gold)
            if correct:
                return [AnnotatedSentence(case_id, s, self._masked_label(sentences, i, gold, language), 1)
                        for i, s in enumerate(sentences)]
        except LLMError as exc:
            raise LLMError(f"case {case_id}: {exc}") from None
        return [AnnotatedSentence(case_id, s, self._lookup_label(s, gold), 2) for s in sentences]

    def _masked_label(self, sentences: Sequence[str], i: int, gold: str, language: str) -> Label:
        rest = [s for j, s in enumerate(sentences) if j != i]
        return Label.C if rest and same_diagnosis(self.diagnose(rest, language), gold) else Label.A

    def _lookup_label(self, sentence: str, gold: str) -> Label:
        if self.retriever is None or not sentence.strip():
            return Label.C
        hits = self.retriever.run(sentence, self.lookup_depth)
        return Label.B if any(same_diagnosis(f"{h.section} {h.text[:160]}", gold) for h in hits) else Label.C


@dataclass(frozen=True)
class TrainReport:
    examples: int
    held_out: int
    accuracy: float
    per_label: dict[str, dict[str, float]]


class ClassifierLabeller:
    """A trained A/B/C classifier as a gate labeller (the `SentenceLabeller` protocol)."""

    def __init__(self, path: str | Path, embedder: Embedder) -> None:
        self.model = LinearTextClassifier(path, embedder)
        self.path, self.embedder = self.model.path, embedder
        self.labels = [Label(v) for v in self.model.labels]

    def probabilities(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float64]]:
        return self.model.probabilities(texts)

    def label(self, text: str, section: str | None) -> tuple[Label, str]:
        label, p = self.model.predict([text])[0]
        return Label(label), f"classifier p={p:.2f}"

    def label_fragments(self, fragments: Sequence[Fragment]) -> list[list[LabelledSentence]]:
        return label_each(self, fragments)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "classifier", "path": str(self.path)}


def train_classifier(examples: Sequence[AnnotatedSentence], embedder: Embedder, out: str | Path,
                     held_out: float = 0.2, seed: int = 0) -> TrainReport:
    """Fit on a stratified share, report on the rest, then refit on everything and save."""
    require_extra("sklearn", "train", "training the gate classifier")
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import classification_report
    from sklearn.model_selection import train_test_split

    labels = [e.label.value for e in examples]
    if len(set(labels)) < 2 or len(examples) < 10:
        raise ValueError(f"training needs at least 10 sentences of at least 2 labels, got {len(examples)} "
                         f"with labels {sorted(set(labels))}")
    vectors = np.asarray(embedder.embed([e.text for e in examples]), np.float64)
    y = np.asarray(labels)
    train_x, test_x, train_y, test_y = train_test_split(vectors, y, test_size=held_out, random_state=seed,
                                                        stratify=y if min(np.unique(y, return_counts=True)[1]) > 1
                                                        else None)
    model = LogisticRegression(max_iter=2000, class_weight="balanced").fit(train_x, train_y)
    report = classification_report(test_y, model.predict(test_x), output_dict=True, zero_division=0)
    fit_linear_classifier([e.text for e in examples], labels, embedder, out)
    per_label = {k: {m: round(float(v[m]), 4) for m in ("precision", "recall", "f1-score", "support")}
                 for k, v in report.items() if k in {"A", "B", "C"}}
    return TrainReport(len(examples), len(test_y), round(float(report["accuracy"]), 4), per_label)


def read_annotations(path: str | Path) -> list[AnnotatedSentence]:
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            rows.append(AnnotatedSentence(str(raw["case_id"]), str(raw["text"]), Label(raw["label"]),
                                          int(raw.get("strategy", 0))))
        except (json.JSONDecodeError, KeyError, ValueError) as exc:
            raise ConfigError(f"{path}:{number}: not an annotation line ({exc})") from exc
    return rows
