"""LLM-driven evaluation: MIRAGE multiple-choice accuracy (with / without retrieval), accuracy and APR of
packed contexts on MedQA, and set-level diagnosis F1 on AgentClinic and CMB-Clin.

Nothing here runs in CI (no model on this machine); the logic is tested against a fake
OpenAI-compatible server. Every reply is cached by the client, so rerunning a finished evaluation
costs no tokens; `usage` in the output says what was spent.
APR (the EBM-Pack paper's): accuracy with the packed window / accuracy on the clean full vignette.
The prompts are the `multiple_choice` and `diagnosis_list` steps of llm/prompts/steps/{en,zh}.toml, in a case's
language; MIRAGE is English.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ebmrag.errors import LLMError, RecordError
from ebmrag.eval.diagnosis import IcdIndex, diagnosis_lines, set_scores
from ebmrag.eval.packing_eval import PreparedCase
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.llm.prompts import LANGUAGES, step_prompt
from ebmrag.packing.packer import Packer
from ebmrag.packing.utility import UtilityParams
from ebmrag.protocols import ChatMessage
from ebmrag.retrieve.search import HybridRetriever

log = logging.getLogger(__name__)
_LETTER = re.compile(r"\b([A-J])\b")


@dataclass(frozen=True)
class AccuracyRow:
    dataset: str
    setting: str
    window: int | None
    questions: int
    accuracy: float
    unparsed: int
    apr: float | None = None


@dataclass(frozen=True)
class DiagnosisRow:
    dataset: str
    strategy: str
    window: int
    cases: int
    precision: float
    recall: float
    f1: float
    failed: int


def choice_messages(question: str, options: Mapping[str, str], context: str = "",
                    language: str = "en") -> list[ChatMessage]:
    prompt = step_prompt("multiple_choice", language)
    block = prompt.render("context", context=context) if context else ""
    listed = "\n".join(f"{letter}. {text}" for letter, text in sorted(options.items()))
    return prompt.messages(context_block=block, question=question, options=listed)


def parse_choice(reply: str, letters: Sequence[str]) -> str | None:
    """The first standalone option letter in the reply ("B", "Answer: B", "(B) ..."), else None."""
    for match in _LETTER.finditer(reply.upper()):
        if match.group(1) in letters:
            return match.group(1)
    return None


def _ask_choice(client: OpenAIChatClient, question: str, options: Mapping[str, str], context: str,
                language: str = "en") -> str | None:
    try:
        reply = client.complete(choice_messages(question, options, context, language), temperature=0.0,
                                max_tokens=8)
    except LLMError as exc:  # counted as unparsed in the row; the reason goes to the log
        log.warning("no answer to %r: %s", question[:60], exc)
        return None
    return parse_choice(reply.text, list(options))


def mirage_accuracy(client: OpenAIChatClient, benchmark: Path, subsets: Sequence[str], limit: int = 0,
                    retriever: HybridRetriever | None = None, k: int = 5) -> list[AccuracyRow]:
    """MIRAGE multiple choice, per subset: without retrieval, and with the top-k chunks when a retriever is given."""
    data = json.loads(benchmark.read_text(encoding="utf-8"))
    rows = []
    for subset in subsets:
        if subset not in data:
            raise RecordError(str(benchmark), f"no subset {subset!r}; has {sorted(data)}")
        items = list(data[subset].values())[: limit or None]
        settings = [("no retrieval", False)] + ([("retrieval", True)] if retriever else [])
        for label, use_kb in settings:
            correct = unparsed = 0
            for item in items:
                context = ""
                if use_kb and retriever is not None:
                    context = "\n".join(f"[{i}] {h.text}" for i, h in enumerate(retriever.run(item["question"], k), 1))
                choice = _ask_choice(client, item["question"], item["options"], context)
                unparsed += choice is None
                correct += choice == item["answer"]
            rows.append(AccuracyRow(subset, label, None, len(items), 100.0 * correct / max(len(items), 1), unparsed))
    return rows


def packing_accuracy(client: OpenAIChatClient, prepared: Sequence[PreparedCase], packers: Sequence[Packer],
                     windows: Sequence[int], params: UtilityParams) -> list[AccuracyRow]:
    """MedQA: accuracy of each packed window and its APR against the clean full vignette."""
    cases = [p for p in prepared if p.case.options]
    clean_correct = clean_unparsed = 0
    for item in cases:
        vignette = " ".join(f.text for f in item.case.record.fragments if f.source != "noise")
        choice = _ask_choice(client, f"{vignette} {item.case.question}", item.case.options, "", _language(item))
        clean_unparsed += choice is None
        clean_correct += choice == item.case.answer
    oracle = 100.0 * clean_correct / max(len(cases), 1)
    dataset = cases[0].case.dataset if cases else ""
    rows = [AccuracyRow(dataset, "clean vignette", None, len(cases), oracle, clean_unparsed, 1.0)]
    for packer in packers:
        for window in windows:
            correct = unparsed = 0
            for item in cases:
                context = packer.pack(item.candidates(params), window).context
                choice = _ask_choice(client, item.case.question, item.case.options, context, _language(item))
                unparsed += choice is None
                correct += choice == item.case.answer
            accuracy = 100.0 * correct / max(len(cases), 1)
            rows.append(AccuracyRow(dataset, packer.name, window, len(cases), accuracy, unparsed,
                                    accuracy / oracle if oracle else None))
    return rows


def diagnosis_f1(client: OpenAIChatClient, prepared: Sequence[PreparedCase], packers: Sequence[Packer],
                 windows: Sequence[int], params: UtilityParams, index: IcdIndex) -> list[DiagnosisRow]:
    rows = []
    for packer in packers:
        for window in windows:
            scores, failed = [], 0
            for item in prepared:
                system = step_prompt("diagnosis_list", _language(item)).render("system")
                context = packer.pack(item.candidates(params), window).context
                messages = [ChatMessage("system", system), ChatMessage("user", context)]
                try:
                    reply = client.complete(messages, temperature=0.0, max_tokens=80).text
                except LLMError as exc:  # counted in the row's `failed`; the reason goes to the log
                    log.warning("no diagnosis for %s: %s", item.case.case_id, exc)
                    failed += 1
                    reply = ""
                scores.append(set_scores(diagnosis_lines(reply, 3), [item.case.answer], index))
            mean = {name: statistics.fmean(getattr(s, name) for s in scores) * 100 if scores else 0.0
                    for name in ("precision", "recall", "f1")}
            rows.append(DiagnosisRow(prepared[0].case.dataset if prepared else "", packer.name, window, len(prepared),
                                     mean["precision"], mean["recall"], mean["f1"], failed))
    return rows


def _language(item: PreparedCase) -> str:
    """The case's language when there are prompts in it, else English."""
    return item.case.language if item.case.language in LANGUAGES else "en"


def rows_json(rows: Sequence[AccuracyRow | DiagnosisRow]) -> list[dict[str, Any]]:
    return [{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(row).items()} for row in rows]
