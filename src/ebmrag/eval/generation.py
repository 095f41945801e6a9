"""Generation metrics for `ask` results: faithfulness, answer relevancy, context relevancy and
context recall, judged by a model when one is given and approximated offline when not; every score says which.

- faithfulness: the share of the answer's claims (the sentences `ask`'s own grounding check read: no warning, no
  headings) the packed context supports. Offline: that grounding check (embedding + words; a number or drug missing
  from the context fails the claim). Model: a verdict per claim.
- answer relevancy: how directly the answer addresses the question, 0-1. Offline: the cosine of question and answer
  in the packer's embedding space (clipped at 0). Model: a rating.
- context relevancy: the share of packed context lines that bear on the question. Offline: lines whose cosine to the
  question reaches `relevant_cosine` (0.3, the level at which MiniLM pairs share a topic). Model: a verdict per line.
- context recall: the share of the reference answer's sentences the context supports (only with a reference).
  Offline: the grounding check of those sentences against the context. Model: a verdict per sentence.
A model reply that cannot be used after one retry falls back to the offline method, and the row says so.
The judge's prompts are the `generation_judge` step of llm/prompts/steps/{en,zh}.toml, in the question's language.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ebmrag.answer.engine import Engine
from ebmrag.answer.result import AskResult
from ebmrag.demo import load_patient
from ebmrag.errors import EbmragError
from ebmrag.llm.completion import complete_json
from ebmrag.llm.prompts import LANGUAGES, StepPrompt, step_prompt
from ebmrag.protocols import ChatClient, Embedder
from ebmrag.text.sentences import split_sentences

METRICS = ("faithfulness", "answer_relevancy", "context_relevancy", "context_recall")


@dataclass(frozen=True)
class GenerationQuestion:
    question_id: str
    question: str
    patient: str  # a record file (relative to the questions file) or a bundled demo name
    reference: str = ""
    window: int | None = None


@dataclass(frozen=True)
class Score:
    value: float | None  # None: not measurable here (context recall without a reference)
    method: str  # "model", "offline", or "offline (model failed: ...)"


class Verdicts(BaseModel):
    supported: list[bool] = Field(description="one verdict per numbered item, in order")


class Rating(BaseModel):
    score: float = Field(ge=0.0, le=1.0)


def load_questions(path: Path) -> list[GenerationQuestion]:
    """JSON lines: {"id", "question", "patient", "reference"?, "window"?}; a bad line is named, never skipped."""
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            patient = str(row["patient"])
            local = path.parent / patient
            questions.append(GenerationQuestion(str(row.get("id", number)), str(row["question"]),
                                                str(local) if local.exists() else patient,
                                                str(row.get("reference", "")), row.get("window")))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EbmragError(f"{path}:{number}: not a question line ({exc!r}); "
                              "need {\"question\": ..., \"patient\": ...}") from None
    if not questions:
        raise EbmragError(f"{path}: no questions")
    return questions


class GenerationJudge:
    """Scores one `ask` result; `client` (optional) judges, the engine's embedder and grounding check approximate."""

    def __init__(self, engine: Engine, client: ChatClient | None = None, relevant_cosine: float = 0.3, *,
                 embedder: Embedder) -> None:
        """`embedder`: the packer's model (the composition root's `Resources.embedder`)."""
        if not 0 < relevant_cosine < 1:
            raise ValueError(f"relevant_cosine must be in (0, 1), got {relevant_cosine}")
        self.engine, self.client, self.relevant_cosine = engine, client, relevant_cosine
        self.embedder = embedder

    def run(self, result: AskResult, reference: str = "") -> dict[str, Score]:
        claims = list(result.claims) or [s.text for s in split_sentences(result.answer) if s.text.strip()]
        lines = [i.body for i in result.items]
        references = [s.text for s in split_sentences(reference) if s.text.strip()]
        prompt = step_prompt("generation_judge", result.language if result.language in LANGUAGES else "en")
        return {
            "faithfulness": self._share(prompt, "faithfulness", claims, lines, "claims of the answer",
                                        result.question),
            "answer_relevancy": self._rating(prompt, result.question, result.answer),
            "context_relevancy": self._relevant_lines(prompt, result.question, lines),
            "context_recall": self._share(prompt, "context_recall", references, lines,
                                          "sentences of a reference answer", result.question)
            if references else Score(None, "no reference answer"),
        }

    def _share(self, prompt: StepPrompt, metric: str, items: Sequence[str], context: Sequence[str], what: str,
               question: str) -> Score:
        if not items:
            return Score(None, f"no {what}")

        def offline() -> float:
            return sum(s.supported for s in self.engine.grounding.run(list(items), list(context))) / len(items)

        return self._judged(prompt, metric, dict(question=question, context=_numbered(context),
                                                 items=_numbered(items), count=len(items)),
                            Verdicts, lambda v: sum(v.supported) / len(items), offline,
                            lambda v: _count(v.supported, len(items)), _verdicts_schema(len(items)))

    def _rating(self, prompt: StepPrompt, question: str, answer: str) -> Score:
        if not answer.strip():
            return Score(0.0, "empty answer")

        def offline() -> float:
            vectors = self.embedder.embed([question, answer])
            return max(0.0, float(vectors[0] @ vectors[1]))

        return self._judged(prompt, "answer_relevancy", dict(question=question, answer=answer), Rating,
                            lambda v: v.score, offline)

    def _relevant_lines(self, prompt: StepPrompt, question: str, lines: Sequence[str]) -> Score:
        if not lines:
            return Score(None, "empty context")

        def offline() -> float:
            vectors = self.embedder.embed([question, *lines])
            return float(np.mean(vectors[1:] @ vectors[0] >= self.relevant_cosine))

        return self._judged(prompt, "context_relevancy", dict(question=question, context=_numbered(lines),
                                                              count=len(lines)),
                            Verdicts, lambda v: sum(v.supported) / len(lines), offline,
                            lambda v: _count(v.supported, len(lines)), _verdicts_schema(len(lines)))

    def _judged(self, prompt: StepPrompt, metric: str, values: dict[str, object], schema: type[Any],
                value: Callable[[Any], float], offline: Callable[[], float],
                check: Callable[[Any], None] | None = None, json_schema: dict[str, Any] | None = None) -> Score:
        if self.client is None:
            return Score(offline(), "offline")
        reply = complete_json(self.client, prompt.messages(metric, **values), schema, max_tokens=400, check=check,
                              json_schema=json_schema)
        if reply.value is None:
            return Score(offline(), f"offline (model failed: {reply.error})")
        return Score(value(reply.value), "model")


def _numbered(items: Sequence[str]) -> str:
    return "\n".join(f"{n}. {text}" for n, text in enumerate(items, 1))


def _verdicts_schema(count: int) -> dict[str, Any]:
    """`Verdicts` with exactly `count` values, for a client that decodes under the schema (a local model)."""
    schema: dict[str, Any] = Verdicts.model_json_schema()
    schema["properties"]["supported"].update(minItems=count, maxItems=count)
    return schema


def _count(values: Sequence[bool], expected: int) -> None:
    if len(values) != expected:
        raise ValueError(f"give exactly {expected} values, one per numbered item (got {len(values)})")


@dataclass(frozen=True)
class GenerationRow:
    question_id: str
    scores: dict[str, Score]
    answer: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.question_id, "answer": self.answer, "seconds": round(self.seconds, 3),
                **{name: {"value": None if s.value is None else round(s.value, 4), "method": s.method}
                   for name, s in self.scores.items()}}


def evaluate_generation(engine: Engine, judge: GenerationJudge, questions: Sequence[GenerationQuestion],
                        progress: Callable[[int], None] | None = None) -> list[GenerationRow]:
    rows = []
    for done, q in enumerate(questions, 1):
        started = time.perf_counter()
        result = engine.ask(q.question, load_patient(q.patient), q.window)
        rows.append(GenerationRow(q.question_id, judge.run(result, q.reference), result.answer,
                                  time.perf_counter() - started))
        if progress is not None:
            progress(done)
    return rows


def summary(rows: Sequence[GenerationRow]) -> dict[str, Any]:
    """Mean of each metric over the questions where it was measurable, and how it was measured."""
    out: dict[str, Any] = {"questions": len(rows)}
    for name in METRICS:
        scores = [r.scores[name] for r in rows]
        values = [s.value for s in scores if s.value is not None]
        methods = sorted({s.method.split(" (")[0] for s in scores if s.value is not None})
        out[name] = {"mean": round(statistics.fmean(values), 4) if values else None, "measured": len(values),
                     "method": "+".join(methods) or "-"}
    return out


def markdown(rows: Sequence[GenerationRow]) -> str:
    total = summary(rows)
    lines = ["| question | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for row in rows:
        cells = [("–" if s.value is None else f"{s.value:.3f}") + f" ({s.method.split(' (')[0]})"
                 for s in (row.scores[m] for m in METRICS)]
        lines.append(f"| {row.question_id} | " + " | ".join(cells) + " |")
    means = [("–" if total[m]["mean"] is None else f"**{total[m]['mean']:.3f}**") + f" ({total[m]['method']})"
             for m in METRICS]
    lines.append(f"| mean of {total['questions']} | " + " | ".join(means) + " |")
    return "\n".join(lines) + "\n"
