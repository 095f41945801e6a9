from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.errors import ConfigError
from ebmrag.generate.budget import BudgetError, extractive_budget, staged_budget
from ebmrag.generate.staged import AnswerText, EvidenceEvaluation, Review, cited_numbers, parse_reply
from ebmrag.llm.prompts import STAGE_ORDER, PromptStage, load_prompts
from ebmrag.models.tokens import make_token_counter


@pytest.mark.parametrize("language", ["en", "zh"])
def test_bundled_prompts_have_the_four_stages_with_their_settings(language: str) -> None:
    prompts = load_prompts(language)
    assert list(prompts) == list(STAGE_ORDER)
    assert [(p.temperature, p.max_tokens) for p in prompts.values()] == [(0.1, 600), (0.3, 1024), (0.0, 600),
                                                                        (0.2, 1200)]
    user = prompts["answer_generator"].messages(question="Q?", context="[1|T1] x", evaluation="E", warning="")[1]
    assert "Q?" in user.content and "[1|T1] x" in user.content and '{"answer"' in user.content


def test_a_bad_prompt_file_fails_at_load_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"uses \['draft'\], but this stage only receives"):
        PromptStage("evidence_evaluator", "sys", "{question} {draft}", 0.1, 600)
    with pytest.raises(ValueError, match="unknown prompt stage"):
        PromptStage("summariser", "sys", "{question}", 0.1, 600)
    with pytest.raises(ValueError, match="no prompts for language 'fr'"):
        load_prompts("fr")
    partial = tmp_path / "p.toml"
    partial.write_text('[evidence_evaluator]\nsystem_prompt = "s"\nuser_prompt_template = "{question}"\n'
                       "temperature = 0.1\nmax_tokens = 600\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="lacks stages"):
        load_prompts(path=partial)


def test_replies_are_validated_and_citations_checked() -> None:
    evaluation = parse_reply('Sure:\n```json\n{"findings": [{"statement": "s", "citations": [2], '
                             '"strength": "high"}]}\n```', EvidenceEvaluation, {1, 2})
    assert isinstance(evaluation, EvidenceEvaluation) and evaluation.findings[0].citations == [2]
    with pytest.raises(ValueError, match=r"cites \[7\]"):
        parse_reply('{"findings": [{"statement": "s", "citations": [7], "strength": "low"}]}', EvidenceEvaluation,
                    {1, 2})
    with pytest.raises(ValueError, match=r"cites \[3\]"):
        parse_reply('{"answer": "Stop it [1, 3]."}', AnswerText, {1, 2})
    with pytest.raises(ValueError, match="answer is empty"):
        parse_reply('{"answer": "  "}', AnswerText, {1})
    with pytest.raises(ValueError, match="verdict"):
        parse_reply('{"verdict": "maybe"}', Review, {1})
    with pytest.raises(ValueError, match="no JSON object"):
        parse_reply("I cannot answer that.", AnswerText, {1})
    assert cited_numbers("a [1] b [2, 4] c [3；5]") == [1, 2, 4]


def test_the_budget_reserves_every_fixed_part() -> None:
    counter = make_token_counter("bundled")
    prompts = load_prompts("en")
    budget = staged_budget(8000, counter, prompts, "Which antibiotic?", history="Earlier: asked about pain.")
    assert budget.output_reserve + budget.handed_on == 1024 + 600 and budget.history > 0
    assert budget.context == 8000 - budget.system - budget.prompt - budget.history - 1624
    with_warning = staged_budget(8000, counter, prompts, "Which antibiotic?", "Critical information is sparse.")
    assert with_warning.prompt > staged_budget(8000, counter, prompts, "Which antibiotic?").prompt
    with pytest.raises(BudgetError, match="window 1000 is too small"):
        staged_budget(1000, counter, prompts, "Which antibiotic?")
    assert extractive_budget(256, counter, "Which antibiotic?").output_reserve == 0
