"""Fact states on the shared case sets and notes (issue 46): how many critical fragments get a one-line fact, how
long the line is, and that no entity of the finding is lost on the way.

    python bench/fact_states.py --data-root ../shared/data [--half tune|check] [--show 20] [--out docs/benchmarks.md]

Sets: the packing case sets (MedQA vignettes from MIRAGE, AgentClinic OSCE cases, CMB-Clin; eval.cases loads and
splits them as the packing suite does) and the sectioned notes of ../shared/data/text_corpora (MTSamples, MTS-Dialog,
ACI-Bench, each sentence with its section heading; cEHRNER Chinese sentences, without one). Every fragment is tiered
by the default classifier as the composition root builds it for the packer (the bundled rules, the configured
tier model, the critical-fact recogniser; bench/tiers.py `default_classifier`, without its disk store).
Critical: must-keep, critical, level 1 (`always`) or T1. Per set: the critical fragments, the share with a fact
state (evidence.facts.read_fact), the median tokens of the fact line and of the fragment's full text (the project's
token counter, [models] tokenizer), the entities of the finding whose text is not in its line (must be 0), and the
mean time of `read_fact` per critical fragment (a first reading, unless the same text came before: it is memoised).
`--half` keeps one fixed hash half (eval.halves: a case id, a note's document id).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from ebmrag.config import load_settings
from ebmrag.eval.cases import DATASETS, load_cases
from ebmrag.eval.halves import HALVES, group_key, half_of
from ebmrag.eval.packing_report import dataset_dir
from ebmrag.evidence.facts import Fact, read_fact
from ebmrag.models.tokens import make_token_counter
from ebmrag.records.fragment import Tier, TierDecision
from report import emit, machine  # bench/ is on sys.path when a script here runs
from tiers import default_classifier

NOTES = {"mtsamples": "mtsamples_sections_shared.jsonl", "mts-dialog": "mts_dialog_sections_shared.jsonl",
         "aci-bench": "aci_bench_notes_shared.jsonl", "cehrner (zh)": "zh_cehrner_sentences_shared.jsonl"}
COMMAND = "python bench/fact_states.py --data-root ../shared/data"
Item = tuple[str, str | None]  # text, section


@dataclass
class SetRow:
    """One set's measures; `examples` keeps (rule, text, line) for --show."""

    name: str
    fragments: int = 0
    critical: int = 0
    facts: int = 0
    line_tokens: list[int] = field(default_factory=list)
    text_tokens: list[int] = field(default_factory=list)
    dropped: int = 0
    read_seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[str, str, str]] = field(default_factory=list)
    without: list[tuple[str, str]] = field(default_factory=list)


def critical(decision: TierDecision) -> bool:
    return decision.must_keep or decision.critical or bool(decision.always) or decision.tier is Tier.T1


def dropped(fact: Fact) -> int:
    """Entities of the finding whose text the line does not hold."""
    line = fact.line()
    return sum(said not in line for _, said in fact.entities)


def case_items(root: Path, dataset: str, half: str) -> list[Item]:
    folder = dataset_dir(root, dataset)
    if folder is None:
        raise SystemExit(f"no {dataset} files under {root}")
    return [(f.text, f.section) for case in load_cases(dataset, folder)
            if half == "all" or half_of(case.case_id) == half for f in case.record.fragments]


def note_items(root: Path, name: str, half: str) -> list[Item]:
    items = []
    for line in (root / "text_corpora" / name).read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        if row and (half == "all" or half_of(group_key(str(row["id"]))) == half):
            section = (row.get("label_detail") or {}).get("section")
            items.append((str(row["text"]), str(section) if section else None))
    return items


def measure(name: str, items: Sequence[Item], decisions: Sequence[TierDecision], count: Callable[[str], int]) -> SetRow:
    row = SetRow(name, fragments=len(items))
    for (text, _), decision in zip(items, decisions, strict=True):
        if not critical(decision):
            continue
        row.critical += 1
        started = time.perf_counter()
        fact = read_fact(text, decision)
        row.read_seconds += time.perf_counter() - started
        if fact is None:
            row.without.append((decision.rule_id, text))
            continue
        row.facts += 1
        row.kinds[fact.kind] += 1
        row.line_tokens.append(count(fact.line()))
        row.text_tokens.append(count(text))
        row.dropped += dropped(fact)
        row.examples.append((decision.rule_id, text, fact.line()))
    return row


def table(rows: Sequence[SetRow], half: str) -> list[str]:
    lines = [f"{machine()}. Date: {date.today().isoformat()}. Command: `{COMMAND}"
             + (f" --half {half}`" if half != "all" else "`") + ".", "",
             "| set | fragments | critical | with a fact state | share | median tokens, line | median tokens, "
             "full text | lines ≤ 25 tokens | lines shorter than the text | entities dropped | ms per read | kinds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = f"{100 * r.facts / r.critical:.1f} %" if r.critical else "–"
        line_median = f"{statistics.median(r.line_tokens):g}" if r.line_tokens else "–"
        text_median = f"{statistics.median(r.text_tokens):g}" if r.text_tokens else "–"
        short = f"{100 * sum(t <= 25 for t in r.line_tokens) / len(r.line_tokens):.0f} %" if r.line_tokens else "–"
        pairs = list(zip(r.line_tokens, r.text_tokens, strict=True))
        shorter = f"{100 * sum(a < b for a, b in pairs) / len(pairs):.0f} %" if pairs else "–"
        kinds = ", ".join(f"{k} {n}" for k, n in r.kinds.most_common())
        per_read = f"{1000 * r.read_seconds / r.critical:.2f}" if r.critical else "–"
        lines.append(f"| {r.name} | {r.fragments:,} | {r.critical:,} | {r.facts:,} | {share} | {line_median} | "
                     f"{text_median} | {short} | {shorter} | {r.dropped} | {per_read} | {kinds} |")
    return lines


def show(rows: Sequence[SetRow], count: int) -> None:
    """A sample of lines and of critical fragments without one, on stderr, for reading by eye."""
    for r in rows:
        print(f"\n## {r.name}", file=sys.stderr)
        for rule, text, line in r.examples[:count]:
            print(f"  [{rule}] {text[:160]!r}\n    -> {line}", file=sys.stderr)
        for rule, text in r.without[:count]:
            print(f"  [{rule}] {text[:160]!r}\n    -> (no fact state)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--half", default="all", choices=("all", *HALVES))
    parser.add_argument("--show", type=int, default=0, help="print this many lines and misses per set (stderr)")
    parser.add_argument("--config", type=Path, help="TOML settings; default: the built-in defaults")
    parser.add_argument("--out", type=Path, help="also write the table into this document's fact_states section")
    args = parser.parse_args()
    settings = load_settings(args.config)
    classifier = default_classifier(settings)
    counter = make_token_counter(settings.models.tokenizer)
    sets = [(name, case_items(args.data_root, name, args.half)) for name in DATASETS]
    sets += [(name, note_items(args.data_root, file, args.half)) for name, file in NOTES.items()]
    rows = []
    for name, items in sets:
        print(f"{name}: tiering {len(items):,} fragments", file=sys.stderr)
        rows.append(measure(name, items, classifier.classify_many(items), counter.count))
    total = SetRow("all", sum(r.fragments for r in rows), sum(r.critical for r in rows), sum(r.facts for r in rows),
                   [t for r in rows for t in r.line_tokens], [t for r in rows for t in r.text_tokens],
                   sum(r.dropped for r in rows), sum(r.read_seconds for r in rows),
                   sum((r.kinds for r in rows), Counter()))
    if args.show:
        show(rows, args.show)
    emit(args.out, "fact_states", table([*rows, total], args.half))


if __name__ == "__main__":
    main()
