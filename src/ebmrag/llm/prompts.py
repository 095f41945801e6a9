"""Prompt stages as data: four stages per language, read from TOML files that ship with ebmrag.

evidence_evaluator (0.1 / 600) grades the numbered context against the question; answer_generator
(0.3 / 1024) drafts a cited answer; critical_reviewer (0.0 / 600) hunts unsupported or overstated
claims in the draft; final_assembler (0.2 / 1200) applies the review. Each user template may use only
the placeholders its stage receives, checked at load, so a typo in a prompt file fails at start-up
and not in the middle of a consultation. A deployment can point `[llm] prompts` at its own file.
"""

from __future__ import annotations

import string
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
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
