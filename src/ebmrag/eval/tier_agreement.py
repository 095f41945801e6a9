"""Tier classifier vs. the typed fields of AgentClinic OSCE cases.

The field a fragment came from gives a label that does not depend on our rules: patient-actor fields
are T4 (history, complaints), physical-examination fields T3, test results T2, and test results that
are biopsy / pathology / cytology / genetic T1. Two numbers are reported: with the section visible
(how records with typed sections are classified) and with the section hidden (text cues alone, which
is what free text and MedQA vignettes get).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ebmrag.errors import RecordError
from ebmrag.eval.cases import field_label
from ebmrag.evidence.fragment import Tier
from ebmrag.evidence.loaders import load_records
from ebmrag.evidence.tiers import TierClassifier


@dataclass(frozen=True)
class Agreement:
    cases: int
    fragments: int
    with_section: Counter[tuple[Tier, Tier]]
    text_only: Counter[tuple[Tier, Tier]]
    misses: tuple[tuple[str, Tier, Tier, str], ...]

    @staticmethod
    def rate(confusion: Counter[tuple[Tier, Tier]]) -> float:
        total = sum(confusion.values())
        return 100.0 * sum(n for (gold, got), n in confusion.items() if gold is got) / total if total else 0.0


def measure_agreement(data_dir: Path, classifier: TierClassifier | None = None) -> Agreement:
    files = sorted(Path(data_dir).glob("agentclinic_medqa*.jsonl"))
    if not files:
        raise RecordError(str(data_dir), "no agentclinic_medqa*.jsonl file found")
    classifier = classifier or TierClassifier()
    with_section: Counter[tuple[Tier, Tier]] = Counter()
    text_only: Counter[tuple[Tier, Tier]] = Counter()
    misses: list[tuple[str, Tier, Tier, str]] = []
    cases = 0
    for path in files:
        for record in load_records(path):
            cases += 1
            for fragment in record.fragments:
                gold = field_label(fragment.section or "")
                if gold is None:
                    continue
                got = classifier.classify(fragment.text, fragment.section).tier
                with_section[(gold, got)] += 1
                text_only[(gold, classifier.classify(fragment.text, None).tier)] += 1
                if got is not gold:
                    misses.append((fragment.section or "", gold, got, fragment.text[:120]))
    fragments = sum(with_section.values())
    return Agreement(cases, fragments, with_section, text_only, tuple(misses))


def _confusion_table(confusion: Counter[tuple[Tier, Tier]]) -> list[str]:
    lines = ["| field label \\ classifier | T1 | T2 | T3 | T4 |", "|---|---|---|---|---|"]
    for gold in Tier:
        row = [str(confusion[(gold, got)]) for got in Tier]
        lines.append(f"| {gold.value} | {' | '.join(row)} |")
    return lines


def agreement_report(agreement: Agreement) -> str:
    lines = [
        "# Tier classifier agreement with AgentClinic typed fields",
        "",
        "Command: `ebmrag eval tiers --data-dir ../shared/data/agentclinic --out docs/tier_agreement.md`",
        "",
        f"{agreement.cases} cases, {agreement.fragments} fragments (one per second-level OSCE field).",
        "",
        f"- Agreement with the section visible: **{Agreement.rate(agreement.with_section):.1f} %**",
        f"- Agreement from text cues alone (section hidden): **{Agreement.rate(agreement.text_only):.1f} %**",
        "",
        "## With section",
        "",
        *_confusion_table(agreement.with_section),
        "",
        "## Text only",
        "",
        *_confusion_table(agreement.text_only),
        "",
        "## Disagreements with the section visible (first 15)",
        "",
        "| section | field label | classifier | text |",
        "|---|---|---|---|",
    ]
    for section, gold, got, text in agreement.misses[:15]:
        lines.append(f"| {section} | {gold.value} | {got.value} | {text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
