"""Prompts as data: the staged answer's four stages, and every other LLM step's templates, per language.

evidence_evaluator (0.1 / 600) grades the numbered context against the question; answer_generator
(0.3 / 1024) drafts a cited answer; critical_reviewer (0.0 / 600) hunts unsupported or overstated
claims in the draft; final_assembler (0.2 / 1200) applies the review. Each user template may use only
the placeholders its stage receives, checked at load, so a typo in a prompt file fails at start-up
and not in the middle of a consultation. A deployment can point `[llm] prompts` at its own file.

The other steps (query rewriting, the relevance filter, masking annotation, the research agent, question synthesis,
the LLM evaluations) read named templates from prompts/steps/{language}.toml, a table per step. Each template must
use exactly the placeholders `STEP_TEMPLATES` gives it, so a translation cannot drop or invent one.
"""

from __future__ import annotations

import functools
import string
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.protocols import ChatMessage

PROMPTS_DIR = Path(__file__).parent / "prompts"
LANGUAGES = ("en", "zh")
STAGE_ORDER = ("evidence_evaluator", "answer_generator", "critical_reviewer", "final_assembler")
STAGE_INPUTS = {
    "evidence_evaluator": {"question", "context", "warning"},
    "answer_generator": {"question", "context", "evaluation", "warning"},
    "critical_reviewer": {"question", "context", "draft"},
    "final_assembler": {"question", "draft", "review", "warning"},
}
# What each stage passes on: the later stage's prompt holds up to max_tokens of it.
STAGE_OUTPUT_PLACEHOLDER = {"evidence_evaluator": "evaluation", "answer_generator": "draft",
                            "critical_reviewer": "review"}


def warning_block(warning: str) -> str:
    """The gate's warning as the one line that heads a prompt, a brief or an answer ('' without one)."""
    return f"Warning: {warning}\n" if warning else ""


def with_warning(warning: str, text: str) -> str:
    """An answer or brief headed by the gate's warning, a blank line between them."""
    return f"{warning_block(warning)}\n{text}" if warning else text


@dataclass(frozen=True)
class PromptStage:
    name: str
    system_prompt: str
    user_prompt_template: str
    temperature: float
    max_tokens: int

    def __post_init__(self) -> None:
        if self.name not in STAGE_INPUTS:
            raise ValueError(f"unknown prompt stage {self.name!r}; stages: {', '.join(STAGE_ORDER)}")
        if not self.system_prompt.strip() or not self.user_prompt_template.strip():
            raise ValueError(f"stage {self.name}: the system prompt and the user template must not be empty")
        if not 0.0 <= self.temperature <= 2.0 or self.max_tokens < 1:
            raise ValueError(f"stage {self.name}: temperature must be in [0, 2] and max_tokens >= 1")
        unknown = self.placeholders - STAGE_INPUTS[self.name]
        if unknown:
            raise ValueError(f"stage {self.name}: the template uses {sorted(unknown)}, but this stage only receives "
                             f"{sorted(STAGE_INPUTS[self.name])} (write literal braces as {{{{ }}}})")

    @property
    def placeholders(self) -> set[str]:
        try:
            return {field for _, field, _, _ in string.Formatter().parse(self.user_prompt_template) if field}
        except ValueError as exc:
            raise ValueError(f"stage {self.name}: the user template is not a valid format string: {exc}") from exc

    def messages(self, **values: str) -> list[ChatMessage]:
        needed = {name: values.get(name, "") for name in self.placeholders}
        return [ChatMessage("system", self.system_prompt),
                ChatMessage("user", self.user_prompt_template.format(**needed))]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_prompts(language: str = "en", path: str | Path | None = None) -> dict[str, PromptStage]:
    """All four stages for a language, from `path` or the bundled prompts/{language}.toml."""
    if path is None and language not in LANGUAGES:
        raise ValueError(f"no prompts for language {language!r}; bundled: {', '.join(LANGUAGES)}")
    source = Path(path) if path else PROMPTS_DIR / f"{language}.toml"
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"prompt file {source} could not be read: {exc}") from exc
    missing = [name for name in STAGE_ORDER if name not in data]
    if missing:
        raise ConfigError(f"prompt file {source} lacks stages {missing}")
    try:
        return {name: PromptStage(name=name, **data[name]) for name in STAGE_ORDER}
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"prompt file {source}: {exc}") from exc


STEPS_DIR = PROMPTS_DIR / "steps"
_NONE: frozenset[str] = frozenset()
# Every LLM step besides the staged answer: its templates, and the placeholders each must use (all of them, no other).
STEP_TEMPLATES: dict[str, dict[str, frozenset[str]]] = {
    "query_rewrite": {"system": _NONE, "expansion": frozenset({"question", "n"}), "hyde": frozenset({"question"})},
    "relevance_filter": {"system": _NONE, "user": frozenset({"findings", "question", "document"}),
                         "no_findings": _NONE, "retry_hint": _NONE},
    "masking_diagnosis": {"system": _NONE, "user": frozenset({"summary"}), "retry_hint": _NONE},
    "research_agent": {"system": _NONE, "text_protocol": frozenset({"tools"}),
                       "tool_line": frozenset({"name", "description", "parameters"}), "reminder_tools": _NONE,
                       "reminder_text": _NONE, "no_format": _NONE, "unknown_tool": frozenset({"tool", "tools"}),
                       "repeated_call": frozenset({"tool", "step"}),
                       "unseen_citations": frozenset({"unseen", "allowed"}), "no_sources": _NONE, "step_limit": _NONE},
    "question_synthesis": {"user": frozenset({"steps"})},
    "multiple_choice": {"system": _NONE, "context": frozenset({"context"}),
                        "user": frozenset({"context_block", "question", "options"})},
    "diagnosis_list": {"system": _NONE},
    "generation_judge": {"system": _NONE, "faithfulness": frozenset({"question", "context", "items", "count"}),
                         "context_recall": frozenset({"question", "context", "items", "count"}),
                         "answer_relevancy": frozenset({"question", "answer"}),
                         "context_relevancy": frozenset({"question", "context", "count"})},
}


@dataclass(frozen=True)
class StepPrompt:
    """One step's templates in one language; format strings, so literal braces are doubled in the file."""

    step: str
    language: str
    templates: Mapping[str, str]

    def render(self, template: str, /, **values: object) -> str:
        """The template filled in; `values` must hold its placeholders and may hold more (they are ignored)."""
        needed = STEP_TEMPLATES[self.step][template]
        missing = needed - values.keys()
        if missing:
            raise ValueError(f"step {self.step}, template {template}: no value for {sorted(missing)}")
        return self.templates[template].format(**{key: values[key] for key in needed})

    def messages(self, template: str = "user", /, **values: object) -> list[ChatMessage]:
        """The step's system prompt, then `template` as the user turn."""
        return [ChatMessage("system", self.render("system", **values)),
                ChatMessage("user", self.render(template, **values))]


def step_prompt(step: str, language: str = "en", folder: str | Path | None = None) -> StepPrompt:
    """A step's templates from `folder` (the bundled prompts/steps) /{language}.toml, read and checked once."""
    if language not in LANGUAGES:
        raise ValueError(f"no step prompts for language {language!r}; bundled: {', '.join(LANGUAGES)}")
    source = Path(folder or STEPS_DIR) / f"{language}.toml"
    if step not in STEP_TEMPLATES:
        raise ConfigError(f"prompt file {source}: no step {step!r}; steps: {', '.join(STEP_TEMPLATES)}")
    return _step_file(source, language)[step]


@functools.cache
def _step_file(source: Path, language: str) -> dict[str, StepPrompt]:
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"prompt file {source} could not be read: {exc}") from exc
    unknown, missing = sorted(data.keys() - STEP_TEMPLATES.keys()), [s for s in STEP_TEMPLATES if s not in data]
    if unknown or missing:
        raise ConfigError(f"prompt file {source}: unknown steps {unknown}, missing steps {missing}; "
                          f"steps: {', '.join(STEP_TEMPLATES)}")
    return {step: StepPrompt(step, language, MappingProxyType(_templates(source, step, data[step])))
            for step in STEP_TEMPLATES}


def _templates(source: Path, step: str, table: Any) -> dict[str, str]:
    where, expected = f"prompt file {source}, step {step}", STEP_TEMPLATES[step]
    if not isinstance(table, dict) or set(table) != set(expected):
        found = sorted(table) if isinstance(table, dict) else type(table).__name__
        raise ConfigError(f"{where}: the templates are {found}, expected {sorted(expected)}")
    for name, text in table.items():
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}: template {name} must be a non-empty string")
        try:
            used = {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}
        except ValueError as exc:
            raise ConfigError(f"{where}: template {name} is not a valid format string: {exc}") from exc
        if used != expected[name]:
            raise ConfigError(f"{where}: template {name} uses {sorted(used)}, but must use exactly "
                              f"{sorted(expected[name])} (write literal braces as {{{{ }}}})")
    return dict(table)
