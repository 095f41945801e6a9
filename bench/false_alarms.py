"""False alarms of the critical levels: the share of routine sentences of the shared sectioned notes that tiering
makes critical (issue 45's measure), with the recogniser and without it, in one run.

    python bench/false_alarms.py --data-root ../shared/data [--half check]

Routine: the sentences of MTSamples, MTS-Dialog and ACI-Bench whose section heading labels them T3 or T4 (history,
plans, examination, nursing-style narrative: `label_source` silver:section_header) and whose section is not an
allergy, pathology or results section. The default classifier (bundled rules, n-gram tier model, recogniser) and
the same without the recogniser. Sections are hidden from the classifier (text alone), as for the held-out
tier measures. Critical: a T1 decision, a critical result, or a standing possible critical fact (all of which rank
above the utility pool at any age); the possible critical facts are also counted apart. Silver labels are not all
right: a reaction told in a history section is a true critical fact counted here as a false alarm, so the shares
are an upper bound.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from ebmrag.compose.resources import load_recogniser
from ebmrag.eval.halves import group_key, half_of
from ebmrag.evidence.second_reading import POSSIBLE_CRITICAL
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.models.text_classifier import load_text_classifier
from ebmrag.records.fragment import Tier, TierDecision

NOTES = ("mtsamples_sections_shared.jsonl", "mts_dialog_sections_shared.jsonl", "aci_bench_notes_shared.jsonl")
NOT_ROUTINE = re.compile(r"allerg|patholog|result|lab|diagnos|impression|assessment", re.IGNORECASE)


def routine(root: Path, half: str) -> list[str]:
    texts = []
    for name in NOTES:
        for line in (root / "text_corpora" / name).read_text(encoding="utf-8").splitlines():
            item = json.loads(line) if line.strip() else {}
            detail = item.get("label_detail") or {}
            if item.get("label") in ("T3", "T4") and half_of(group_key(str(item["id"]))) == half \
                    and not NOT_ROUTINE.search(str(detail.get("section", ""))):
                texts.append(str(item["text"]))
    return texts


def critical(decision: TierDecision) -> bool:
    return decision.tier is Tier.T1 or decision.critical or (
        decision.rule_id.startswith(POSSIBLE_CRITICAL) and decision.standing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--half", default="check", choices=("tune", "check"))
    args = parser.parse_args()
    texts = routine(args.data_root, args.half)
    report = {"half": args.half, "routine_sentences": len(texts)}
    ngram = load_text_classifier(BUNDLED_TIER_MODEL, None)  # type: ignore[arg-type]  # n-grams need no embedder
    for name, classifier in (("without the recogniser", TierClassifier(model=ngram)),
                             ("default", TierClassifier(model=ngram, recogniser=load_recogniser("bundled")))):
        decisions = classifier.classify_many([(t, None) for t in texts])
        by = Counter(d.rule_id.split(" ")[0].split(".")[0] for d in decisions if critical(d))
        report[name] = {"critical_share": round(sum(critical(d) for d in decisions) / len(texts), 4),
                        "possible_share": round(sum(d.rule_id.startswith(POSSIBLE_CRITICAL)
                                                    for d in decisions) / len(texts), 4),
                        "by_reader": dict(by.most_common())}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
