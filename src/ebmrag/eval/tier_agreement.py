"""Tier classifier vs. the typed fields of AgentClinic OSCE cases.

The field a fragment came from gives a label that does not depend on our rules: patient-actor fields
are T4 (history, complaints), physical-examination fields T3, test results T2, and test results that
are biopsy / pathology / cytology / genetic T1. Two numbers are reported: with the section visible
(how records with typed sections are classified) and with the section hidden (text cues alone, which
is what free text and MedQA vignettes get).

The text-only measure can be restricted to one fixed half of the cases (eval.halves: a rule is tuned on
'tune' and reported once on 'check'); labelled JSONL files from outside are scored in eval.labelled_tiers.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ebmrag.errors import RecordError
from ebmrag.eval.cases import cmb_case, field_label
from ebmrag.eval.halves import HALVES, half_of
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.protocols import Progress, no_progress
from ebmrag.records.fragment import Tier
from ebmrag.records.loaders import load_records


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


# --------------------------------------------------------------------------- text only, every labelled source
_NEJM_ITEM = re.compile(r"(?:^|(?<=[.\s]))([A-Z][A-Za-z0-9 ,/&()'-]{2,60}):\s")
_NEJM_HEADINGS = ((Tier.T1, re.compile(r"biops|patholog|histolog|cytolog|stain|immunohisto|genetic|sequenc|karyotyp"
                                       r"|molecular|smear|aspirat|culture", re.I)),
                  (Tier.T2, re.compile(r"laborator|\blab|blood|serum|urin|level|count|imaging|\bct\b|tomograph|mri"
                                       r"|magnetic|radiograph|x-ray|ultraso|echocardiog|electrocardiog|\becg|endoscop"
                                       r"|laryngoscop|bronchoscop|angiogra|\bscan|fluid|test", re.I)),
                  (Tier.T3, re.compile(r"physical exam|examination|vital|blood pressure|pulse|temperature", re.I)))


def _nejm_units(raw: dict[str, Any]) -> Iterator[tuple[Tier, str]]:
    """NEJM cases: the patient-actor brief is T4; findings are labelled by the heading they sit under."""
    if str(raw.get("patient_info", "")).strip():
        yield Tier.T4, str(raw["patient_info"])
    text = str(raw.get("physical_exams", ""))
    marks = list(_NEJM_ITEM.finditer(text))
    for mark, following in zip(marks, [*marks[1:], None], strict=False):
        body = text[mark.end(): following.start() if following else len(text)].strip(" -")
        tier = next((t for t, pattern in _NEJM_HEADINGS if pattern.search(mark.group(1))), None)
        if tier is not None and body:
            yield tier, f"{mark.group(1)}: {body}"


class CaseText(NamedTuple):
    """One labelled text and the case it belongs to (the case decides its tune/check half)."""

    case: str
    tier: Tier
    text: str


def labelled_case_texts(data_dir: Path) -> dict[str, list[CaseText]]:
    """(case key, gold tier, text) per source, found by pattern anywhere under `data_dir`: AgentClinic MedQA
    fields, NEJM case headings, CMB-Clin sections. Sections are returned only as labels, never shown to a
    classifier. The case key is the record's patient id (file stem and line; CMB-Clin: its case id), so a
    half split by it never separates the texts of one case."""
    root = Path(data_dir)
    found: dict[str, list[CaseText]] = {}
    for path in sorted(root.rglob("agentclinic_medqa*.jsonl")):
        for record in load_records(path):
            found.setdefault("agentclinic-medqa", []).extend(
                CaseText(record.patient_id, gold, f.text)
                for f in record.fragments if (gold := field_label(f.section or "")) is not None)
    for path in sorted(root.rglob("agentclinic_nejm*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                found.setdefault("agentclinic-nejm", []).extend(
                    CaseText(f"{path.stem}-{number}", tier, text) for tier, text in _nejm_units(json.loads(line)))
    for path in sorted(root.rglob("cmb_clin*.json")):
        for raw in json.loads(path.read_text(encoding="utf-8")):
            case = cmb_case(raw)
            if case:
                texts = {f.id: f.text for f in case.record.fragments}
                found.setdefault("cmb-clin", []).extend(
                    CaseText(case.case_id, tier, texts[fid]) for fid, tier in case.gold_tiers.items())
    if not found:
        raise RecordError(str(data_dir), "no agentclinic_medqa*.jsonl, agentclinic_nejm*.jsonl or cmb_clin*.json found")
    return found


def labelled_texts(data_dir: Path) -> dict[str, list[tuple[Tier, str]]]:
    """`labelled_case_texts` without the case keys: (gold tier, text) per source (bench/train_tier_model.py)."""
    return {source: [(item.tier, item.text) for item in items]
            for source, items in labelled_case_texts(data_dir).items()}


MEASURED_SOURCES = ("agentclinic-medqa", "cmb-clin")


TEXT_ONLY_COMMAND = "ebmrag eval tiers --text-only --data-dir ../shared/data --out docs/results/tiers_text_only.md"
HALF_CHOICES = ("all", *HALVES)
BATCH = 512  # texts per classify_many call: the model embeds what no rule speaks for in one batch


def check_half(half: str) -> str:
    if half not in HALF_CHOICES:
        raise ValueError(f"half must be one of {', '.join(HALF_CHOICES)}, got {half!r}")
    return half


def in_half(key: str, half: str) -> bool:
    """Whether the item grouped under `key` belongs to `half` ('all' keeps everything)."""
    return half == "all" or half_of(key) == half


def classify_texts(classifier: TierClassifier, texts: Sequence[str], stage: str = "tiering",
                   progress: Progress = no_progress, batch: int = BATCH) -> list[Tier]:
    """The tier of each text from the text alone (no section), `batch` texts per `classify_many` call."""
    tiers: list[Tier] = []
    progress(stage, 0, len(texts))
    for start in range(0, len(texts), batch):
        tiers += [d.tier for d in classifier.classify_many([(t, None) for t in texts[start:start + batch]])]
        progress(stage, len(tiers), len(texts))
    return tiers


@dataclass(frozen=True)
class TextOnlyReport:
    confusion: dict[str, Counter[tuple[Tier, Tier]]]  # per source
    half: str = "all"

    def combined(self, sources: tuple[str, ...] | None = None) -> Counter[tuple[Tier, Tier]]:
        """The confusion counts of the named sources (all of them without names), added up."""
        total: Counter[tuple[Tier, Tier]] = Counter()
        for name, confusion in self.confusion.items():
            if sources is None or name in sources:
                total.update(confusion)
        return total

    @staticmethod
    def per_tier(confusion: Counter[tuple[Tier, Tier]]) -> dict[str, dict[str, float]]:
        out = {}
        for tier in Tier:
            predicted = sum(n for (_, got), n in confusion.items() if got is tier)
            actual = sum(n for (gold, _), n in confusion.items() if gold is tier)
            hit = confusion[(tier, tier)]
            out[tier.value] = {"precision": round(hit / predicted, 4) if predicted else 0.0,
                               "recall": round(hit / actual, 4) if actual else 0.0, "support": actual}
        return out

    def to_json(self, sources: tuple[str, ...] | None = None) -> dict[str, Any]:
        chosen = self.combined(sources)
        total = sum(chosen.values())
        return {"half": self.half, "fragments": total,
                "agreement": round(Agreement.rate(chosen) / 100, 4) if total else 0.0,
                "per_tier": self.per_tier(chosen),
                "sources": {name: {"fragments": sum(c.values()), "agreement": round(Agreement.rate(c) / 100, 4)}
                            for name, c in self.confusion.items()}}


def measure_text_only(data_dir: Path, classifier: TierClassifier | None = None, half: str = "all",
                      progress: Progress = no_progress) -> TextOnlyReport:
    """Tier from the text alone of every labelled text of the cases in `half` (tune, check or all)."""
    half = check_half(half)
    classifier = classifier or TierClassifier()
    confusion: dict[str, Counter[tuple[Tier, Tier]]] = {}
    for source, items in labelled_case_texts(data_dir).items():
        kept = [item for item in items if in_half(item.case, half)]
        tiers = classify_texts(classifier, [item.text for item in kept], source, progress)
        confusion[source] = Counter((item.tier, got) for item, got in zip(kept, tiers, strict=True))
    return TextOnlyReport(confusion, half)


def text_only_markdown(report: TextOnlyReport, command: str = TEXT_ONLY_COMMAND) -> str:
    """The measure pools AgentClinic MedQA and CMB-Clin (labels from typed fields and sections); NEJM, whose
    labels come from the headings of free text, is reported apart."""
    data = report.to_json(MEASURED_SOURCES)
    lines = [f"# Tier classifier from text alone (sections hidden), half: {report.half}", "",
             f"Command: `{command}`",
             "", f"AgentClinic MedQA + CMB-Clin: {data['fragments']} labelled fragments; agreement "
             f"**{100 * data['agreement']:.1f} %**.", "",
             "| source | fragments | agreement |", "|---|---|---|",
             *(f"| {name} | {s['fragments']} | {100 * s['agreement']:.1f} % |" for name, s in data["sources"].items()),
             "", "| tier (AgentClinic MedQA + CMB-Clin) | precision | recall | support |", "|---|---|---|---|",
             *(f"| {t} | {100 * v['precision']:.1f} % | {100 * v['recall']:.1f} % | {v['support']} |"
               for t, v in data["per_tier"].items()), "",
             "## Confusion, AgentClinic MedQA + CMB-Clin (rows: label, columns: classifier)", "",
             *_confusion_table(report.combined(MEASURED_SOURCES))]
    return "\n".join(lines) + "\n"
