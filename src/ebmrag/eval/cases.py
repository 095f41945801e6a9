"""Evaluation cases for packing: real vignettes and records split into signal fragments with gold tiers.

Three sources, each found in a data folder by file pattern so the same code runs on held-out copies:
- MedQA-USMLE vignettes from MIRAGE (`benchmark*.json`, key "medqa"): sentences are tiered by the
  classifier and consecutive sentences of one tier form a modality fragment (the paper's split); the
  question sentence is the query. Gold tiers here share the classifier's rules, so this set checks
  the packer, not the classifier.
- AgentClinic OSCE cases (`agentclinic_medqa*.jsonl`): one fragment per typed field; gold tiers come
  from the field (`field_label`), independent of the classifier: the honest check.
- CMB-Clin Chinese cases (`cmb_clin*.json`): fragments from the 现病史 / 体格检查 / 辅助检查 parts and
  their numbered items; gold tiers from the part. The `title` names the diagnosis: it becomes the
  gold answer and never enters a fragment.

Every signal fragment is stamped at the encounter time so noise (eval.noise) can be spread around it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Fragment, PatientRecord, Tier
from ebmrag.records.loaders import record_from_agentclinic
from ebmrag.text.sentences import split_sentences

DATASETS = ("medqa", "agentclinic", "cmb")
ENCOUNTER = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DIAGNOSIS_QUESTION = "What is the most likely diagnosis for this patient?"
_T1_FIELD = re.compile(r"biops|patholog|histolog|cytolog|genetic|karyotyp|molecular|bone.marrow|sequenc", re.I)
_T1_FIELD_ZH = re.compile(r"病理|活检|穿刺|细胞学|基因|染色体|骨髓|免疫组化")


@dataclass(frozen=True)
class EvalCase:
    """One patient's signal: fragments (no tiers yet), the question, and the tiers RRCE counts against."""

    case_id: str
    dataset: str
    record: PatientRecord
    question: str
    gold_tiers: Mapping[str, Tier]
    label_source: str  # "field" (independent of the classifier) or "classifier"
    language: str = "en"
    answer: str = ""
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def critical_ids(self) -> list[str]:
        return [fid for fid, tier in self.gold_tiers.items() if tier in (Tier.T1, Tier.T2)]


def field_label(section: str) -> Tier | None:
    """AgentClinic field -> tier: actor fields T4, examination T3, tests T2, tissue/genetic tests T1."""
    group, _, name = section.partition(" > ")
    if group == "Patient_Actor":
        return Tier.T4
    if group == "Physical_Examination_Findings":
        return Tier.T3
    if group == "Test_Results":
        return Tier.T1 if _T1_FIELD.search(name) else Tier.T2
    return None


def _stamped(fragments: list[Fragment]) -> tuple[Fragment, ...]:
    """The encounter's fragments a minute apart, in their order, so their recency is equal in practice."""
    return tuple(Fragment(f.id, f.patient_id, f.text, f.section, ENCOUNTER + timedelta(minutes=i), f.source)
                 for i, f in enumerate(fragments))


def _find(data_dir: Path, pattern: str) -> list[Path]:
    files = sorted(Path(data_dir).glob(pattern))
    if not files:
        raise RecordError(str(data_dir), f"no file matching {pattern!r}")
    return files


# --------------------------------------------------------------------------- MedQA (MIRAGE)
def medqa_case(item_id: str, item: Mapping[str, Any], classifier: TierClassifier) -> EvalCase | None:
    """A vignette split into modality fragments, or None when it has < 2 modalities or no T1/T2 fragment."""
    sentences = [s.text for s in split_sentences(str(item.get("question", "")))]
    if len(sentences) < 2 or "?" not in sentences[-1]:
        return None
    question, body = sentences[-1], sentences[:-1]
    tiers = [classifier.classify(text).tier for text in body]
    groups: list[tuple[Tier, list[str]]] = []
    for text, tier in zip(body, tiers, strict=True):
        if groups and groups[-1][0] is tier:
            groups[-1][1].append(text)
        else:
            groups.append((tier, [text]))
    if len({tier for tier, _ in groups}) < 2 or not any(t in (Tier.T1, Tier.T2) for t, _ in groups):
        return None
    patient = f"medqa-{item_id}"
    fragments = [Fragment(f"{patient}-m{i}", patient, " ".join(texts), source="vignette")
                 for i, (_, texts) in enumerate(groups)]
    gold = {f.id: tier for f, (tier, _) in zip(fragments, groups, strict=True)}
    options = {str(k): str(v) for k, v in dict(item.get("options") or {}).items()}
    return EvalCase(patient, "medqa", PatientRecord(patient, _stamped(fragments), "mirage/medqa"), question, gold,
                    "classifier", "en", str(item.get("answer", "")), options)


def medqa_cases(data_dir: Path, classifier: TierClassifier | None = None) -> list[EvalCase]:
    classifier = classifier or TierClassifier()
    cases = []
    for path in _find(data_dir, "benchmark*.json"):
        items = json.loads(path.read_text(encoding="utf-8")).get("medqa", {})
        for item_id, item in items.items():
            case = medqa_case(str(item_id), item, classifier)
            if case:
                cases.append(case)
    return cases


# --------------------------------------------------------------------------- AgentClinic
def agentclinic_cases(data_dir: Path) -> list[EvalCase]:
    cases = []
    for path in _find(data_dir, "agentclinic_medqa*.jsonl"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            raw = json.loads(line)
            patient = f"agentclinic-{path.stem}-{number}"
            record = record_from_agentclinic(raw, f"{path.name}:{number}", patient)
            fragments = [Fragment(f"{patient}-{f.id}", patient, f.text, f.section, source=f.source)
                         for f in record.fragments]
            gold = {f.id: tier for f in fragments if (tier := field_label(f.section or "")) is not None}
            if not any(t in (Tier.T1, Tier.T2) for t in gold.values()):
                continue
            answer = str(raw.get("OSCE_Examination", {}).get("Correct_Diagnosis", ""))
            cases.append(EvalCase(patient, "agentclinic", PatientRecord(patient, _stamped(fragments), record.origin),
                                  DIAGNOSIS_QUESTION, gold, "field", "en", answer))
    return cases


# --------------------------------------------------------------------------- CMB-Clin
_CMB_PARTS = {"现病史": Tier.T4, "主诉": Tier.T4, "既往史": Tier.T4, "个人史": Tier.T4, "家族史": Tier.T4,
              "体格检查": Tier.T3, "专科检查": Tier.T3, "辅助检查": Tier.T2}
_CMB_ITEM = re.compile(r"^[（(]\s*\d+\s*[）)]\s*(.+)$")


def _cmb_units(description: str) -> Iterator[tuple[str, str, str]]:
    """(part, item title, text) for every numbered item, or for a part's own text when it has none."""
    part, item, lines = "现病史", "", list[str]()
    for raw in description.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line in _CMB_PARTS:
            yield part, item, " ".join(lines)
            part, item, lines = line, "", []
        elif match := _CMB_ITEM.match(line):
            yield part, item, " ".join(lines)
            item, lines = match.group(1).strip(), []
        else:
            lines.append(line)
    yield part, item, " ".join(lines)


def _cmb_tier(part: str, item: str, text: str) -> Tier:
    if part == "辅助检查" and (_T1_FIELD_ZH.search(item) or _T1_FIELD_ZH.search(text[:12])):
        return Tier.T1
    if item in ("生命体征", "体格检查", "专科情况", "腹部查体"):
        return Tier.T3
    return _CMB_PARTS.get(part, Tier.T4)


def cmb_case(raw: Mapping[str, Any]) -> EvalCase | None:
    patient = f"cmb-{raw.get('id')}"
    fragments: list[Fragment] = []
    gold: dict[str, Tier] = {}
    for part, item, text in _cmb_units(str(raw.get("description", ""))):
        if not text.strip():
            continue
        fragment = Fragment(f"{patient}-u{len(fragments)}", patient, text, " > ".join(p for p in (part, item) if p),
                            source="cmb-clin")
        fragments.append(fragment)
        gold[fragment.id] = _cmb_tier(part, item, text)
    pairs = raw.get("QA_pairs") or []
    if not fragments or not pairs or not any(t in (Tier.T1, Tier.T2) for t in gold.values()):
        return None
    diagnosis = re.split(r"案例分析\s*[-－—]\s*", str(raw.get("title", "")))[-1].strip()
    return EvalCase(patient, "cmb", PatientRecord(patient, _stamped(fragments), "cmb-clin"), str(pairs[0]["question"]),
                    gold, "field", "zh", diagnosis)


def cmb_cases(data_dir: Path) -> list[EvalCase]:
    cases = []
    for path in _find(data_dir, "cmb_clin*.json"):
        for raw in json.loads(path.read_text(encoding="utf-8")):
            case = cmb_case(raw)
            if case:
                cases.append(case)
    return cases


def load_cases(dataset: str, data_dir: Path, limit: int = 0) -> list[EvalCase]:
    """The dataset's cases in file order; `limit` keeps the first n (tests use small slices)."""
    if dataset == "medqa":
        cases = medqa_cases(data_dir)
    elif dataset == "agentclinic":
        cases = agentclinic_cases(data_dir)
    elif dataset == "cmb":
        cases = cmb_cases(data_dir)
    else:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    if not cases:
        raise RecordError(str(data_dir), f"no usable {dataset} case (each needs >= 2 modalities and a T1/T2 fragment)")
    return cases[:limit] if limit else cases
