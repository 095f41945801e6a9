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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.tiers import normalize_section
from ebmrag.records.fragment import PatientRecord
from ebmrag.rules import bundled, read_user_file, rule_file

QUESTION_NEED = "question_need"  # TierDecision.always of a fragment the question cannot be answered without

QUESTION_RULES = "evidence/questions.toml"  # the bundled question types, in the rules folder


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
    """Types a question by the first rule whose pattern it matches; `rules_path`: a user's rule file in place of the
    bundled one (rules/evidence/questions.toml); `table`: the rule file read already (the rule book's builder)."""

    def __init__(self, rules_path: str | Path | None = None, *, table: Mapping[str, Any] | None = None) -> None:
        path: Path | str = Path(rules_path) if rules_path else QUESTION_RULES
        self.rules_path = str(rules_path) if rules_path else None
        if table is not None:
            data = table
        elif rules_path:
            data = read_user_file(Path(rules_path), "question rules")[0]
        else:
            data = bundled().read(QUESTION_RULES)
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

    def to_dict(self) -> dict[str, Any]:
        """None: the bundled rules."""
        return {"question_rules": self.rules_path}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuestionClassifier:
        path = data.get("question_rules")
        return cls(path) if path else default_question_classifier()


@rule_file(QUESTION_RULES)
def default_question_classifier(table: Mapping[str, Any]) -> QuestionClassifier:
    """The bundled question types, built once by the rule book (checked with every rule file at start-up)."""
    return QuestionClassifier(table=table)


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

