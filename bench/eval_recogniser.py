"""Measure the shipped recogniser (its ONNX graph, as the package runs it) once on the check half and on
ADE-Corpus-V2.

    python bench/eval_recogniser.py [--model src/ebmrag/evidence/models/recogniser] [--data build/recogniser_data]
        [--half check|tune]

Per kind: precision and recall at the card's thresholds (chosen on dev by bench/export_recogniser.py) on
`check.jsonl`, the check half of the licensed corpora, never trained or tuned on. ADE-Corpus-V2 (`ade_eval.jsonl`,
no licence: evaluation only) gives the adverse-reaction recall, precision and balanced precision (the precision
were positives and negatives equal in number, so corpora of different mixes compare) of its tune or check half.
Authored examples are never read here: they only ever train.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebmrag.evidence.recogniser import BUNDLED_RECOGNISER, CriticalRecogniser

log = logging.getLogger("eval_recogniser")


def read(path: Path, half: str | None = None) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        items = [json.loads(line) for line in handle if line.strip()]
    return [item for item in items if half is None or item.get("half") == half]


def measure(items: Sequence[dict[str, Any]], model: CriticalRecogniser, kinds: Sequence[str]) -> dict[str, Any]:
    """Per kind: recall, precision and balanced precision of the model's kinds against the items' labels."""
    read_ = model.run([item["text"] for item in items])
    report = {}
    for kind in kinds:
        hits = [(kind in r.kinds, kind in item.get("kinds", [])) for item, r in zip(items, read_, strict=True)]
        tp, fp = sum(a and b for a, b in hits), sum(a and not b for a, b in hits)
        positives, negatives = sum(b for _, b in hits), sum(not b for _, b in hits)
        if not positives:
            continue
        recall, false_rate = tp / positives, fp / max(negatives, 1)
        report[kind] = {"recall": round(recall, 3), "precision": round(tp / max(tp + fp, 1), 3),
                        "balanced_precision": round(recall / max(recall + false_rate, 1e-9), 3),
                        "positives": positives, "negatives": negatives, "threshold": model.thresholds[kind]}
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=BUNDLED_RECOGNISER)
    parser.add_argument("--data", type=Path, default=Path("build/recogniser_data"))
    parser.add_argument("--half", default="check", choices=("tune", "check"), help="ADE-Corpus-V2's half")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model = CriticalRecogniser(args.model, threads=args.threads)
    report = {"check": measure(read(args.data / "check.jsonl"), model, model.kinds),
              f"ade_{args.half}": measure(read(args.data / "ade_eval.jsonl", args.half), model, ("adr",))}
    log.info("%s", json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
