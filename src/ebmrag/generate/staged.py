"""The staged answer: evaluate evidence -> draft -> review -> final, each reply validated before the next.

A reply must be one JSON object of the stage's shape (pydantic models below) and may cite only
numbers that exist in the context. An invalid reply is sent back once with the validation error;
a second failure, or a transport failure (timeout, 5xx after the client's retries), ends the stage
as failed and the pipeline degrades instead of stopping:
- evidence_evaluator failed: the draft is written without an evaluation;
- answer_generator failed: there is no model answer (the engine falls back to the extractive brief);
- critical_reviewer failed: the final stage is skipped and the draft is the answer;
- final_assembler failed: the draft is the answer.
Every stage leaves a `StageTrace`, whatever happened, so the trace is never lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from ebmrag.llm.completion import complete_json, parse_json
from ebmrag.llm.prompts import STAGE_ORDER, PromptStage, warning_block
from ebmrag.protocols import ChatClient

CITATION_MARK = re.compile(r"\[(\d+(?:\s*[,;，]\s*\d+)*)\]")


class Finding(BaseModel):
    statement: str = Field(min_length=1)
    citations: list[int] = Field(min_length=1)
    strength: Literal["high", "moderate", "low"]


class EvidenceEvaluation(BaseModel):
    findings: list[Finding]
    gaps: list[str] = []


class AnswerText(BaseModel):
    answer: str

    @field_validator("answer")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the answer is empty")
        return value.strip()


class Problem(BaseModel):
    claim: str
    issue: str


class Review(BaseModel):
    verdict: Literal["accept", "revise"]
    problems: list[Problem] = []


STAGE_SCHEMAS: dict[str, type[BaseModel]] = {"evidence_evaluator": EvidenceEvaluation,
                                             "answer_generator": AnswerText, "critical_reviewer": Review,
                                             "final_assembler": AnswerText}


def stage_schema(name: str, numbers: Collection[int], max_chars: int = 600, max_items: int = 6) -> dict[str, Any]:
    """The stage's JSON schema as a decoder can enforce it (`SchemaChatClient`): citation lists hold only the
    context's numbers (at most as many as there are: a repeated number adds nothing), strings end within
    `max_chars` and lists within `max_items`, so a small model neither cites what is not there nor runs on until
    the token limit cuts the JSON."""
    schema: dict[str, Any] = json.loads(json.dumps(STAGE_SCHEMAS[name].model_json_schema()))
    allowed = sorted(numbers) or [0]

    def tighten(node: Any, field: str = "") -> None:
        if isinstance(node, list):
            for child in node:
                tighten(child)
            return
        if not isinstance(node, dict):
            return
        if node.get("type") == "string" and "enum" not in node:
            node["maxLength"] = max_chars
        if node.get("type") == "array":
            node["maxItems"] = max_items
            if field == "citations":
                node["items"] = {"type": "integer", "enum": allowed}
                node["maxItems"] = min(max_items, len(allowed))
        for key, child in node.items():
            if key == "properties":
                for name_of_field, sub in child.items():
                    tighten(sub, name_of_field)
            else:
                tighten(child)

    tighten(schema)
    return schema


@dataclass(frozen=True)
class StageTrace:
    name: str
    status: str  # ok | invalid | failed | skipped
    attempts: int
    seconds: float
    output: dict[str, Any] | None = None
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "attempts": self.attempts,
                "seconds": round(self.seconds, 3), "output": self.output, "error": self.error,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached": self.cached}


@dataclass(frozen=True)
class StagedAnswer:
    answer: str | None  # None: no usable model answer
    stages: tuple[StageTrace, ...]
    fault: str  # why the pipeline degraded, '' when every stage succeeded


def cited_numbers(text: str) -> list[int]:
    return [int(n) for mark in CITATION_MARK.findall(text) for n in re.split(r"\s*[,;，]\s*", mark)]


def check_citations(value: BaseModel, numbers: Collection[int]) -> None:
    """A reply may cite only numbers that exist in the context."""
    cited = set(cited_numbers(value.model_dump_json()))
    for finding in getattr(value, "findings", []):
        cited.update(finding.citations)
    unknown = sorted(cited - set(numbers))
    if unknown:
        raise ValueError(f"it cites {unknown}, which are not numbers of the context")


def parse_reply(text: str, schema: type[BaseModel], numbers: Collection[int]) -> BaseModel:
    """The JSON object in a reply, validated against the stage's shape, citations checked."""
    value = parse_json(text, schema)
    check_citations(value, numbers)
    return value


class StagedAnswerer:
    """Pipeline step: question + numbered context -> a validated, reviewed answer and a trace per stage."""

    def __init__(self, client: ChatClient, prompts: Mapping[str, PromptStage],
                 on_stage: Callable[[StageTrace], None] | None = None) -> None:
        """`on_stage` hears each stage as it ends (the service streams them to the client)."""
        missing = [name for name in STAGE_ORDER if name not in prompts]
        if missing:
            raise ValueError(f"prompt stages missing: {missing}")
        self.client, self.prompts, self.on_stage = client, dict(prompts), on_stage
        self._deadline: float | None = None

    def run(self, question: str, context: str, numbers: Collection[int], warning: str = "",
            deadline: float | None = None) -> StagedAnswer:
        """`deadline` (time.monotonic()) bounds all the stages' model calls together; a stage that would start
        after it fails at once and the answer degrades as for any failed stage."""
        self._deadline = deadline
        values = {"question": question, "context": context, "warning": warning_block(warning)}
        traces: list[StageTrace] = []
        evaluation = self._stage("evidence_evaluator", values, numbers, traces)
        values["evaluation"] = _render(evaluation) if evaluation else "(no evaluation available)"
        draft = self._stage("answer_generator", values, numbers, traces)
        if draft is None:
            return StagedAnswer(None, tuple(_skip_rest(traces)), _fault(traces))
        values["draft"] = str(draft["answer"])
        review = self._stage("critical_reviewer", values, numbers, traces)
        if review is None:
            return StagedAnswer(values["draft"], tuple(_skip_rest(traces)), _fault(traces))
        if review["verdict"] == "accept":
            traces.append(StageTrace("final_assembler", "skipped", 0, 0.0, error="the reviewer accepted the draft"))
            return StagedAnswer(values["draft"], tuple(traces), _fault(traces))
        values["review"] = _render(review)
        final = self._stage("final_assembler", values, numbers, traces)
        answer = str(final["answer"]) if final else values["draft"]
        return StagedAnswer(answer, tuple(traces), _fault(traces))

    def _stage(self, name: str, values: Mapping[str, str], numbers: Collection[int],
               traces: list[StageTrace]) -> dict[str, Any] | None:
        stage = self.prompts[name]
        done = complete_json(self.client, stage.messages(**values), STAGE_SCHEMAS[name],
                             temperature=stage.temperature, max_tokens=stage.max_tokens,
                             check=lambda value: check_citations(value, numbers),
                             retry_hint="Reply again with only the JSON object, citing only numbers of the context.",
                             deadline=self._deadline, json_schema=stage_schema(name, numbers))
        output = done.value.model_dump() if done.value is not None else None
        traces.append(StageTrace(name, done.status, done.attempts, done.seconds, output, done.error,
                                 done.prompt_tokens, done.completion_tokens, done.cached))
        if self.on_stage is not None:
            self.on_stage(traces[-1])
        return output

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": {name: stage.to_dict() for name, stage in self.prompts.items()}}


def _render(output: Mapping[str, Any]) -> str:
    return json.dumps(output, ensure_ascii=False, indent=1)


def _skip_rest(traces: list[StageTrace]) -> list[StageTrace]:
    done = {t.name for t in traces}
    return [*traces, *(StageTrace(name, "skipped", 0, 0.0, error="an earlier stage failed")
                       for name in STAGE_ORDER if name not in done)]


def _fault(traces: list[StageTrace]) -> str:
    failed = [t for t in traces if t.status in ("failed", "invalid")]
    return "; ".join(f"{t.name} {t.status}: {t.error}" for t in failed)
