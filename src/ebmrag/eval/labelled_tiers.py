"""Tier classifier against labelled texts from outside the project: JSONL files, tiers from the text alone.

Three line shapes are read, one object a line:
- ours: `{"id", "text", "lang", "tier": "T1".."T4" | null, "kind"?, "group"?}`;
- the external corpora (../shared/data/text_corpora): the tier in `label` (null: the source gives none), the
  kind in `label_detail.subtype`;
- ADE-Corpus-V2 (../shared/data/ade_corpus): `"kind": "adr"` with `"tier": "T1"`, `"kind": "no_adr"` without a
  tier, and the report's `pmid`.

An item without a tier is still classified and counted under its kind and language (which tier does the
classifier give it?) but stays out of agreement, precision and recall. Precision of a tier is reported only
where the labelled items hold that tier and another: on a file whose labelled items are all T1 it would be
100 % by construction, and its T2 precision 0 % for want of T2 labels. For ADE-like files (kinds `adr` and
`no_adr`) the honest precision is the balanced one, r / (r + f): ADR recall r against the T1 rate f on as
many sentences without a drug reaction.

Halves (eval.halves) keep a report together: `group` when the line has one, else `"ade:" + pmid`, else the
document part of the id (`group_key`), as the corpora's own split does.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.eval.halves import group_key
from ebmrag.eval.tier_agreement import (
    MEASURED_SOURCES,
    TextOnlyReport,
    check_half,
    classify_texts,
    in_half,
    text_only_markdown,
)
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.protocols import Progress, no_progress
from ebmrag.records.fragment import Tier

NO_KIND = "(none)"
NO_LANG = "und"
ADR, NO_ADR = "adr", "no_adr"


@dataclass(frozen=True)
class LabelledItem:
    id: str
    text: str
    lang: str
    kind: str
    gold: Tier | None  # None: the source gives no tier
    group: str  # the half key


@dataclass(frozen=True)
class LabelledFile:
    path: Path
    items: tuple[LabelledItem, ...]
    empty: int  # lines with an empty text, skipped


def _string(raw: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"'{key}' must be a string, got {value!r}" if key in raw else f"missing '{key}'")
    return str(value)


def _gold(raw: Mapping[str, Any]) -> Tier | None:
    key = "tier" if "tier" in raw else "label"
    value = raw.get(key)
    if value is None:
        return None
    if value not in {t.value for t in Tier}:
        raise ValueError(f"'{key}' must be T1, T2, T3, T4 or null, got {value!r}")
    return Tier(value)


def _kind(raw: Mapping[str, Any]) -> str:
    if "kind" in raw:
        return _string(raw, "kind")
    detail = raw.get("label_detail")
    subtype = detail.get("subtype") if isinstance(detail, dict) else None
    return str(subtype) if isinstance(subtype, str) and subtype else NO_KIND


def parse_item(raw: Any) -> LabelledItem | None:
    """One line's object as an item, or None when its text is empty; ValueError names what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    item_id, text = _string(raw, "id"), raw.get("text")
    if not isinstance(text, str):
        raise ValueError(f"'text' must be a string, got {text!r}" if "text" in raw else "missing 'text'")
    if not text.strip():
        return None
    if "group" in raw:
        group = _string(raw, "group")
    elif "pmid" in raw:
        group = "ade:" + _string(raw, "pmid")
    else:
        group = group_key(item_id)
    return LabelledItem(item_id, text, _string(raw, "lang", NO_LANG), _kind(raw), _gold(raw), group)


def read_labelled(path: Path) -> LabelledFile:
    """Every item of one JSONL file; a malformed line fails with the file and line number."""
    items: list[LabelledItem] = []
    empty = 0
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise RecordError(str(path), "is not UTF-8 text") from None
    except OSError as exc:
        raise RecordError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = parse_item(json.loads(line))
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}:{number}", f"not valid JSON ({exc.msg}, column {exc.colno})") from None
        except ValueError as exc:
            raise RecordError(f"{path}:{number}", str(exc)) from None
        if item is None:
            empty += 1
        else:
            items.append(item)
    return LabelledFile(Path(path), tuple(items), empty)


def labelled_paths(paths: Iterable[Path]) -> list[Path]:
    """The files named, a folder standing for its *.jsonl files (sorted)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files = sorted(path.glob("*.jsonl"))
            if not files:
                raise RecordError(str(path), "no *.jsonl file in this folder")
            found += files
        elif path.is_file():
            found.append(path)
        else:
            raise RecordError(str(path), "no such file or folder")
    return list(dict.fromkeys(found))


# --------------------------------------------------------------------------- counting
@dataclass(frozen=True)
class TierCounts:
    """The classifier's tier for every item of a set, and (gold, classifier) for those with a gold tier."""

    predicted: Counter[Tier]
    confusion: Counter[tuple[Tier, Tier]]

    @classmethod
    def of(cls, pairs: Iterable[tuple[Tier | None, Tier]]) -> TierCounts:
        predicted: Counter[Tier] = Counter()
        confusion: Counter[tuple[Tier, Tier]] = Counter()
        for gold, got in pairs:
            predicted[got] += 1
            if gold is not None:
                confusion[(gold, got)] += 1
        return cls(predicted, confusion)

    def __add__(self, other: TierCounts) -> TierCounts:
        return TierCounts(self.predicted + other.predicted, self.confusion + other.confusion)

    @property
    def items(self) -> int:
        return sum(self.predicted.values())

    @property
    def labelled(self) -> int:
        return sum(self.confusion.values())

    def share(self, tier: Tier) -> float:
        return self.predicted[tier] / self.items if self.items else 0.0

    @property
    def agreement(self) -> float | None:
        hits = sum(n for (gold, got), n in self.confusion.items() if gold is got)
        return hits / self.labelled if self.labelled else None

    def precision(self, tier: Tier) -> float | None:
        """None where it means nothing: the labelled items lack this tier or every other one (a corpus that
        labels only T1 says nothing of T2), or none was given this tier."""
        predicted = sum(n for (_, got), n in self.confusion.items() if got is tier)
        others = sum(n for (gold, _), n in self.confusion.items() if gold is not tier)
        return self.confusion[(tier, tier)] / predicted if predicted and others and self.support(tier) else None

    def recall(self, tier: Tier) -> float | None:
        support = self.support(tier)
        return self.confusion[(tier, tier)] / support if support else None

    def support(self, tier: Tier) -> int:
        return sum(n for (gold, _), n in self.confusion.items() if gold is tier)

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "tiers": {t.value: self.predicted[t] for t in Tier},
                "shares": {t.value: _round(self.share(t)) for t in Tier}, "labelled": self.labelled,
                "agreement": _round(self.agreement), "t1_precision": _round(self.precision(Tier.T1)),
                "t1_recall": _round(self.recall(Tier.T1)),
                "per_tier": {t.value: {"precision": _round(self.precision(t)), "recall": _round(self.recall(t)),
                                       "support": self.support(t),
                                       "predicted": sum(n for (_, got), n in self.confusion.items() if got is t)}
                             for t in Tier} if self.labelled else {}}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(frozen=True)
class AdrMeasure:
    """ADR sentences tiered T1 (recall r) against sentences without a drug reaction tiered T1 (rate f)."""

    adr: int
    adr_t1: int
    no_adr: int
    no_adr_t1: int

    @property
    def recall(self) -> float:
        return self.adr_t1 / self.adr if self.adr else 0.0

    @property
    def no_adr_t1_rate(self) -> float:
        return self.no_adr_t1 / self.no_adr if self.no_adr else 0.0

    @property
    def balanced_precision(self) -> float:
        """Precision against an equal number of no_adr sentences: r / (r + f)."""
        r, f = self.recall, self.no_adr_t1_rate
        return r / (r + f) if r + f else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"adr": self.adr, "adr_t1": self.adr_t1, "no_adr": self.no_adr, "no_adr_t1": self.no_adr_t1,
                "adr_recall": round(self.recall, 4), "no_adr_t1_rate": round(self.no_adr_t1_rate, 4),
                "balanced_precision": round(self.balanced_precision, 4)}


@dataclass(frozen=True)
class FileScore:
    name: str
    path: str
    lines: int  # items with a text in the whole file, both halves
    empty: int
    overall: TierCounts  # the items of the half
    languages: dict[str, TierCounts]
    kinds: dict[str, TierCounts]

    @classmethod
    def of(cls, name: str, source: LabelledFile, items: Sequence[LabelledItem], tiers: Sequence[Tier]) -> FileScore:
        languages: dict[str, list[tuple[Tier | None, Tier]]] = {}
        kinds: dict[str, list[tuple[Tier | None, Tier]]] = {}
        for item, got in zip(items, tiers, strict=True):
            languages.setdefault(item.lang, []).append((item.gold, got))
            kinds.setdefault(item.kind, []).append((item.gold, got))
        return cls(name, str(source.path), len(source.items), source.empty,
                   TierCounts.of((item.gold, got) for item, got in zip(items, tiers, strict=True)),
                   {lang: TierCounts.of(pairs) for lang, pairs in sorted(languages.items())},
                   {kind: TierCounts.of(pairs) for kind, pairs in sorted(kinds.items())})

    @property
    def adr(self) -> AdrMeasure | None:
        """The ADR measures when the file has both kinds."""
        adr, none = self.kinds.get(ADR), self.kinds.get(NO_ADR)
        if adr is None or none is None:
            return None
        return AdrMeasure(adr.items, adr.predicted[Tier.T1], none.items, none.predicted[Tier.T1])

    def to_json(self) -> dict[str, Any]:
        data = {"path": self.path, "lines": self.lines, "empty_skipped": self.empty,
                "other_half": self.lines - self.overall.items, **self.overall.to_json(),
                "languages": {k: v.to_json() for k, v in self.languages.items()},
                "kinds": {k: v.to_json() for k, v in self.kinds.items()}}
        if self.adr is not None:
            data["adr"] = self.adr.to_json()
        return data


@dataclass(frozen=True)
class LabelledReport:
    half: str
    files: tuple[FileScore, ...]

    @property
    def languages(self) -> dict[str, TierCounts]:
        """Per language, every file added up."""
        total: dict[str, TierCounts] = {}
        for score in self.files:
            for lang, counts in score.languages.items():
                total[lang] = total[lang] + counts if lang in total else counts
        return dict(sorted(total.items()))

    def to_json(self) -> dict[str, Any]:
        return {"half": self.half, "files": {f.name: f.to_json() for f in self.files},
                "languages": {k: v.to_json() for k, v in self.languages.items()}}


def _names(paths: Sequence[Path]) -> list[str]:
    """File names, or full paths where two files share a name."""
    counts = Counter(p.name for p in paths)
    return [p.name if counts[p.name] == 1 else str(p) for p in paths]


def measure_labelled(paths: Iterable[Path], classifier: TierClassifier, half: str = "all",
                     progress: Progress = no_progress) -> LabelledReport:
    """Every file read (and checked) first, then the items of `half` tiered from their text alone."""
    half = check_half(half)
    files = labelled_paths(paths)
    sources = [read_labelled(path) for path in files]
    scores = []
    for name, source in zip(_names(files), sources, strict=True):
        kept = [item for item in source.items if in_half(item.group, half)]
        tiers = classify_texts(classifier, [item.text for item in kept], name, progress)
        scores.append(FileScore.of(name, source, kept, tiers))
    return LabelledReport(half, tuple(scores))


# --------------------------------------------------------------------------- markdown
def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


_HEADER = ("items | T1 | T2 | T3 | T4 | with a tier | agreement | T1 precision | T1 recall |",
           "---|---|---|---|---|---|---|---|---|")


def _row(name: str, counts: TierCounts) -> str:
    shares = " | ".join(_pct(counts.share(t)) for t in Tier)
    return (f"| {name} | {counts.items:,} | {shares} | {counts.labelled:,} | {_pct(counts.agreement)} | "
            f"{_pct(counts.precision(Tier.T1))} | {_pct(counts.recall(Tier.T1))} |")


def _table(first: str, rows: Iterable[tuple[str, TierCounts]]) -> list[str]:
    return [f"| {first} | {_HEADER[0]}", f"|---|{_HEADER[1]}", *(_row(name, counts) for name, counts in rows)]


def _per_tier(counts: TierCounts) -> list[str]:
    lines = ["| tier (items with a tier) | precision | recall | support | tiered so |", "|---|---|---|---|---|"]
    for tier in Tier:
        predicted = sum(n for (_, got), n in counts.confusion.items() if got is tier)
        lines.append(f"| {tier.value} | {_pct(counts.precision(tier))} | {_pct(counts.recall(tier))} | "
                     f"{counts.support(tier):,} | {predicted:,} |")
    return lines


def _adr_lines(adr: AdrMeasure) -> list[str]:
    return [f"- ADR recall (adr sentences tiered T1): **{_pct(adr.recall)}** ({adr.adr_t1:,} of {adr.adr:,})",
            f"- T1 rate on no_adr: **{_pct(adr.no_adr_t1_rate)}** ({adr.no_adr_t1:,} of {adr.no_adr:,})",
            f"- Precision against an equal number of no_adr sentences, r / (r + f): "
            f"**{_pct(adr.balanced_precision)}**"]


def labelled_markdown(report: LabelledReport) -> list[str]:
    """The labelled files' section: a table of files, one of languages, then per file its kinds."""
    lines = [f"## Labelled files, half: {report.half}", "",
             "Tier from the text alone. T1..T4: share of the items the classifier puts in each tier (all items, "
             "with or without a tier of their own). Agreement, precision and recall count only the items whose "
             "source gives a tier; '–': not defined (precision of a tier needs labelled items of that tier and of "
             "another, and some item given it).", "",
             *_table("file", ((f.name, f.overall) for f in report.files)), "",
             "### Per language, all files", "",
             "Pooled over files: a file that labels one tier only (ADR corpora: T1) adds hits without negatives, "
             "so read precision per file.", "", *_table("language", report.languages.items())]
    for score in report.files:
        lines += ["", f"### {score.name}", "",
                  f"`{score.path}`: {score.overall.items:,} items (half: {report.half}) of {score.lines:,}; "
                  f"{score.empty:,} empty texts skipped.", "",
                  *_table("kind", score.kinds.items())]
        if len(score.languages) > 1:
            lines += ["", *_table("language", score.languages.items())]
        if score.adr is not None:
            lines += ["", *_adr_lines(score.adr)]
        if score.overall.labelled:
            lines += ["", *_per_tier(score.overall)]
    return lines


def tiers_command(data_dir: Path | None, labelled: Sequence[Path], half: str, out: Path | None) -> str:
    """The `ebmrag eval tiers --text-only` command line that produces a report, for its first lines."""
    args = ["ebmrag", "eval", "tiers", "--text-only"]
    args += ["--data-dir", str(data_dir)] if data_dir is not None else []
    for path in labelled:
        args += ["--labelled", str(path)]
    args += ["--half", half] if half != "all" else []
    args += ["--out", str(out)] if out is not None else []
    return shlex.join(args)


def tiers_markdown(command: str, half: str, text_only: TextOnlyReport | None,
                   labelled: LabelledReport | None) -> str:
    """The AgentClinic / CMB-Clin measure (when run) and the labelled files (when given), in one document."""
    if text_only is not None:
        head = text_only_markdown(text_only, command)
    else:
        head = f"# Tier classifier on labelled text (sections hidden), half: {half}\n\nCommand: `{command}`\n"
    if labelled is None:
        return head
    return head + "\n" + "\n".join(labelled_markdown(labelled)) + "\n"


def tiers_json(command: str, half: str, text_only: TextOnlyReport | None,
               labelled: LabelledReport | None) -> dict[str, Any]:
    """The AgentClinic / CMB-Clin keys as before (when run), with the half, the command and `labelled`."""
    data = text_only.to_json(MEASURED_SOURCES) if text_only is not None else {}
    data.update(half=half, command=command)
    if labelled is not None:
        data["labelled"] = labelled.to_json()
    return data
