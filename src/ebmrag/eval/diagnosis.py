"""Set-level diagnosis precision / recall / F1 after ICD-10 normalization.

Each diagnosis name (gold or predicted, English or Chinese) is mapped to the ICD-10 category (3
characters) whose name matches it best, when that fuzzy match scores at least 0.5 (rapidfuzz
token-sort ratio for English, whose token-set ratio scores any name containing the query's words at
100; weighted ratio for Chinese, so a long name can match its core category); a name with no such match stays its own
normalized text. Two diagnoses agree when their keys are equal. Names come from the ICD tables in a
folder (`icd10_who_*.tsv`, `icd10cm_*.tsv`: code, type, description; `icd10_cn_*disease*.tsv`: code,
Chinese name), the layout of `../shared/data/icd10`.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebmrag.errors import EbmragError

_CJK = re.compile(r"[\u4e00-\u9fff]")
_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.)、]|[（(]\d+[）)])\s*")


@dataclass(frozen=True)
class ScoredSet:
    precision: float
    recall: float
    f1: float


class IcdIndex:
    """ICD-10 category names, English and Chinese, for fuzzy normalization."""

    def __init__(self, names: Sequence[tuple[str, str]], min_score: float = 0.5) -> None:
        if not names:
            raise EbmragError("the ICD-10 name list is empty")
        if not 0 < min_score <= 1:
            raise ValueError(f"min_score must be in (0, 1], got {min_score}")
        self.min_score = min_score
        self._english = [(code, name) for code, name in names if not _CJK.search(name)]
        self._chinese = [(code, name) for code, name in names if _CJK.search(name)]

    @classmethod
    def from_dir(cls, folder: Path, min_score: float = 0.5) -> IcdIndex:
        names: list[tuple[str, str]] = []
        for path in sorted(folder.glob("icd10*.tsv")):
            with path.open(encoding="utf-8") as handle:
                rows = list(csv.DictReader(handle, delimiter="\t"))
            for row in rows:
                code, name = row.get("code", ""), row.get("description") or row.get("disease") or ""
                if re.fullmatch(r"[A-Z]\d{2}(?:\.\w+)?", code) and name:
                    names.append((code[:3], name))
        if not names:
            raise EbmragError(f"no ICD-10 names (icd10*.tsv with code and description/disease) in {folder}")
        return cls(names, min_score)

    def key(self, diagnosis: str) -> str:
        """'ICD:K40' for a confident match, else 'TEXT:<lower-cased name>'."""
        try:
            from rapidfuzz import fuzz, process, utils
        except ImportError as exc:
            raise EbmragError("diagnosis matching needs rapidfuzz: pip install 'ebmrag[eval]'") from exc
        text = _LIST_MARK.sub("", diagnosis).strip().strip("。.;；")
        if not text:
            return ""
        chinese = bool(_CJK.search(text))
        pool = self._chinese if chinese else self._english
        scorer = fuzz.WRatio if chinese else fuzz.token_sort_ratio
        match = process.extractOne(text, [name for _, name in pool], scorer=scorer, processor=utils.default_process,
                                   score_cutoff=self.min_score * 100)
        if match is None:
            return "TEXT:" + text.lower()
        return "ICD:" + pool[match[2]][0]


def diagnosis_lines(reply: str, limit: int = 5) -> list[str]:
    """The model's diagnoses: one per line, list marks removed, explanations after a colon or dash dropped."""
    names = []
    for line in reply.splitlines():
        name = _LIST_MARK.sub("", line).strip()
        name = re.split(r"\s[-–—]\s|:\s|：", name, maxsplit=1)[0].strip().strip("*").strip()
        if name and len(name) < 120:
            names.append(name)
    return names[:limit]


def set_scores(predicted: Iterable[str], gold: Iterable[str], index: IcdIndex) -> ScoredSet:
    predicted_keys = {k for k in (index.key(p) for p in predicted) if k}
    gold_keys = {k for k in (index.key(g) for g in gold) if k}
    hits = len(predicted_keys & gold_keys)
    precision = hits / len(predicted_keys) if predicted_keys else 0.0
    recall = hits / len(gold_keys) if gold_keys else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return ScoredSet(precision, recall, f1)
