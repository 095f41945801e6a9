"""The window is the whole prompt budget: system + context + history + question + output reserve.

With a model, every stage that carries the context must fit: its system prompt, its template with
the question filled in, the history, what earlier stages hand it (up to their max_tokens) and its own
reply. The context gets what the most demanding of those stages leaves. With the extractive backend
the "prompt" is the brief itself: its question line, warning and headings; there is no system prompt
and no reply to reserve. Counts use the configured tokenizer (the bundled WordPiece by default, an
approximation of a chat model's own; set `[models] tokenizer` to the model's for exact budgets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ebmrag.generate.context import EVIDENCE_HEADING, PATIENT_HEADING
from ebmrag.generate.extractive import EVIDENCE_HEADINGS, TIER_HEADINGS
from ebmrag.llm.prompts import STAGE_OUTPUT_PLACEHOLDER, PromptStage, warning_block
from ebmrag.protocols import TokenCounter

MIN_CONTEXT_TOKENS = 32


class BudgetError(ValueError):
    """The window cannot hold the fixed parts of the prompt plus a minimal context."""


@dataclass(frozen=True)
class PromptBudget:
    window: int
    system: int
    prompt: int  # template, question and warning of the most demanding stage
    history: int
    handed_on: int  # earlier stages' replies that stage receives
    output_reserve: int
    stage: str

    @property
    def fixed(self) -> int:
        return self.system + self.prompt + self.history + self.handed_on + self.output_reserve

    @property
    def context(self) -> int:
        return self.window - self.fixed

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fixed": self.fixed, "context": self.context}


def _check(budget: PromptBudget) -> PromptBudget:
    if budget.context < MIN_CONTEXT_TOKENS:
        raise BudgetError(
            f"window {budget.window} is too small: the fixed parts of the {budget.stage} prompt take {budget.fixed} "
            f"tokens (system {budget.system}, template and question {budget.prompt}, history {budget.history}, "
            f"earlier replies {budget.handed_on}, output reserve {budget.output_reserve}), leaving "
            f"{max(budget.context, 0)} for context; use a window of at least {budget.fixed + MIN_CONTEXT_TOKENS}")
    return budget


def staged_budget(window: int, counter: TokenCounter, prompts: Mapping[str, PromptStage], question: str,
                  warning: str = "", history: str = "") -> PromptBudget:
    """The budget of the most demanding stage that carries {context}."""
    history_tokens = counter.count(history) if history else 0
    section_headings = counter.count(f"{PATIENT_HEADING}\n\n{EVIDENCE_HEADING}")
    budgets = []
    for stage in prompts.values():
        if "context" not in stage.placeholders:
            continue
        handed_on = sum(prompts[name].max_tokens for name, placeholder in STAGE_OUTPUT_PLACEHOLDER.items()
                        if placeholder in stage.placeholders and name in prompts)
        template = stage.messages(question=question, warning=warning_block(warning))[1].content
        budgets.append(PromptBudget(window, counter.count(stage.system_prompt),
                                    counter.count(template) + section_headings, history_tokens, handed_on,
                                    stage.max_tokens, stage.name))
    if not budgets:
        raise BudgetError("no prompt stage carries {context}")
    return _check(max(budgets, key=lambda b: b.fixed))


def extractive_budget(window: int, counter: TokenCounter, question: str, warning: str = "") -> PromptBudget:
    scaffold = "\n".join([warning_block(warning), f"Evidence brief for: {question}",
                          *TIER_HEADINGS.values(), "From the knowledge base:", *EVIDENCE_HEADINGS.values()])
    return _check(PromptBudget(window, 0, counter.count(scaffold), 0, 0, 0, "extractive brief"))
