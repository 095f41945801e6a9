"""What a clinical question asks for: its type, whether it needs outside knowledge, and which record
sections it cannot be answered without (`rules/questions.toml`).

"Which antibiotic is safe for him?" needs the allergy status, the kidney results and the patient's age
whatever their similarity to the question's words, and needs a guideline even when the record is
complete. The packer turns the needed sections into must-keep fragments for this question; the gate
retrieves for the types marked `retrieve`. The first matching type wins, so the file lists the most
specific types first.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.tiers import normalize_section
from ebmrag.records.fragment import PatientRecord

QUESTION_NEED = "question_need"  # TierDecision.always of a fragment the question cannot be answered without

DEFAULT_QUESTION_RULES = Path(__file__).parent / "rules" / "questions.toml"


@dataclass(frozen=True)
class QuestionType:
    id: str
    retrieve: bool = False
    needs: tuple[re.Pattern[str], ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()

    def needed(self, section: str | None) -> bool:
        normalized = normalize_section(section)
        return any(p.search(normalized) for p in self.needs)


GENERAL = QuestionType("general")


def _compile(type_id: str, key: str, raw: Any) -> tuple[re.Pattern[str], ...]:
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise ConfigError(f"question type {type_id!r}: {key} must be a list of strings")
    try:
        return tuple(re.compile(p, re.IGNORECASE) for p in raw)
    except re.error as exc:
        raise ConfigError(f"question type {type_id!r}: a {key} pattern is not a valid regex: {exc}") from exc


class QuestionClassifier:
    def __init__(self, rules_path: str | Path | None = None) -> None:
        path = Path(rules_path) if rules_path else DEFAULT_QUESTION_RULES
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"question rules {path} could not be read: {exc}") from exc
        types = []
        for raw in data.get("types") or []:
            type_id = raw.get("id")
            if not isinstance(type_id, str) or not type_id:
                raise ConfigError(f"question rules {path}: a type without an id")
            unknown = set(raw) - {"id", "retrieve", "needs", "patterns"}
            if unknown:
                raise ConfigError(f"question type {type_id!r}: unknown keys {sorted(unknown)}")
            types.append(QuestionType(type_id, bool(raw.get("retrieve", False)),
                                      _compile(type_id, "needs", raw.get("needs", [])),
                                      _compile(type_id, "patterns", raw.get("patterns", []))))
        if not types:
            raise ConfigError(f"question rules {path}: no [[types]]")
        self.types: tuple[QuestionType, ...] = tuple(types)

    def classify(self, question: str) -> QuestionType:
        return next((t for t in self.types if any(p.search(question) for p in t.patterns)), GENERAL)


@cache
def default_question_classifier() -> QuestionClassifier:
    return QuestionClassifier()


def mark_needed(record: PatientRecord, question_type: QuestionType) -> PatientRecord:
    """Fragments in a section the question needs become level 1 (always kept) for this packing; their rule id
    says which question type.
    The record must be classified (every fragment has a decision)."""
    if not question_type.needs:
        return record
    marked = []
    for fragment in record.fragments:
        decision = fragment.decision
        if decision is not None and not decision.must_keep and question_type.needed(fragment.section):
            fragment = fragment.with_decision(replace(decision, must_keep=True, always=QUESTION_NEED,
                                                      rule_id=f"{decision.rule_id}+question:{question_type.id}"))
        marked.append(fragment)
    return record.replace_fragments(marked)

