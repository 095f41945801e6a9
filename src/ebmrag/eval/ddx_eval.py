"""`ebmrag ddx eval`: the differential-diagnosis engine on a DDXPlus patients file.

Columns used (the shared layout): AGE, SEX, PATHOLOGY (gold, French or English), EVIDENCES (structured codes),
DIFFERENTIAL_DIAGNOSIS (the generator's differential, [[name, probability], ...]). Structured evidence is a
closed world (DDXPlus asked every question the condition could raise; what is not listed was denied). The
free-text path renders each patient's evidence as first-person sentences (`eval.ddx_render`, which the
mapper never sees) and maps them back with `ddx.findings.FindingMapper`.

Reported: top-1/3/5 (gold pathology among the first k) and `ddx_f1`, the mean F1 between the engine's
listed differential and the file's differential as sets of conditions.
"""

from __future__ import annotations

import ast
import csv
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebmrag.ddx.engine import DifferentialDiagnoser, complete_findings
from ebmrag.ddx.knowledge import ConditionKB, patient_evidence
from ebmrag.errors import EbmragError
from ebmrag.protocols import Progress, no_progress

REQUIRED = ("AGE", "SEX", "PATHOLOGY", "EVIDENCES", "DIFFERENTIAL_DIAGNOSIS")


@dataclass(frozen=True)
class DdxPatient:
    key: str
    age: int
    sex: str
    gold: str
    evidence: dict[str, str]  # code -> value ("" for binary)
    differential: tuple[str, ...]


@dataclass(frozen=True)
class DdxScores:
    patients: int
    top1: float
    top3: float
    top5: float
    ddx_f1: float

    def to_json(self) -> dict[str, float | int]:
        return {"patients": self.patients, "top1": round(self.top1, 4), "top3": round(self.top3, 4),
                "top5": round(self.top5, 4), "ddx_f1": round(self.ddx_f1, 4)}


def read_patients(path: Path, kb: ConditionKB) -> list[DdxPatient]:
    """Rows of a DDXPlus patients CSV with names resolved to the knowledge base's conditions."""
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise EbmragError(f"{path}: not a DDXPlus patients file (missing columns {', '.join(missing)})")
        return [_patient(row, kb, f"{path}:{n + 2}") for n, row in enumerate(reader)]


def _patient(row: dict[str, str], kb: ConditionKB, where: str) -> DdxPatient:
    gold = kb.condition_named(row["PATHOLOGY"]) or kb.condition_named(row.get("English Pathology", ""))
    if gold is None:
        raise EbmragError(f"{where}: pathology {row['PATHOLOGY']!r} is not in the knowledge base")
    try:
        evidence = patient_evidence(row["EVIDENCES"])
        pairs = ast.literal_eval(row["DIFFERENTIAL_DIAGNOSIS"])
        age = int(row["AGE"])
    except (ValueError, SyntaxError) as exc:
        raise EbmragError(f"{where}: unreadable cell ({exc})") from None
    named = (kb.condition_named(str(p[0])) for p in pairs)
    return DdxPatient(row.get("OriginalRowKey") or row.get("") or where, age, row["SEX"], gold.name, evidence,
                      tuple(c.name for c in named if c is not None))


def structured_findings(kb: ConditionKB, patient: DdxPatient) -> dict[str, bool]:
    return complete_findings(kb, dict.fromkeys(patient.evidence, True), closed_world=True, infer_follow_ups=False)


FindingSource = Callable[[DdxPatient], dict[str, bool]]


def evaluate(engine: DifferentialDiagnoser, patients: Sequence[DdxPatient], findings: FindingSource,
             progress: Progress = no_progress) -> DdxScores:
    hits = {1: 0, 3: 0, 5: 0}
    f1_total = 0.0
    for done, (patient, names, listed) in enumerate(_predictions(engine, patients, findings), 1):
        for k in hits:
            hits[k] += patient.gold in names[:k]
        f1_total += set_f1(listed, patient.differential)
        progress("ddx", done, len(patients))
    n = max(len(patients), 1)
    return DdxScores(len(patients), hits[1] / n, hits[3] / n, hits[5] / n, f1_total / n)


def _predictions(engine: DifferentialDiagnoser, patients: Sequence[DdxPatient],
                 findings: FindingSource) -> Iterator[tuple[DdxPatient, list[str], list[str]]]:
    for patient in patients:
        result = engine.run(findings(patient), patient.age, patient.sex)
        yield patient, [d.name for d in result.ranked], [d.name for d in result.listed]


def set_f1(predicted: Sequence[str], gold: Sequence[str]) -> float:
    p, g = set(predicted), set(gold)
    if not p and not g:
        return 1.0
    overlap = len(p & g)
    return 2 * overlap / (len(p) + len(g)) if overlap else 0.0
