"""Measure a trained recogniser (bench/train_recogniser.py) once on the check half and on ADE-Corpus-V2.

    python bench/eval_recogniser.py --model build/recogniser --data build/recogniser_data [--half check|tune]

Per kind: precision and recall at the thresholds chosen on dev (card.json), on `check.jsonl` (the check half of the
licensed corpora, never trained or tuned on). ADE-Corpus-V2 (`ade_eval.jsonl`, no licence: evaluation only) gives
the adverse-reaction recall, precision and balanced precision (the precision were positives and negatives equal in
number, so corpora of different mixes compare) of the tune or the check half of its PubMed ids.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from train_recogniser import KINDS, Example, Recogniser, encode, measures, predict

log = logging.getLogger("eval_recogniser")


def load_trained(folder: Path) -> Recogniser:
    """The saved encoder and heads (their keys prefixed `encoder.`, `kinds.`, `spans.`)."""
    model = Recogniser(folder, weights=False)
    weights = load_file(str(folder / "model.safetensors"))
    model.load_state_dict(weights, strict=False)
    return model


def read(path: Path, tokenizer: Tokenizer, max_tokens: int, half: str | None = None) -> list[Example]:
    with path.open(encoding="utf-8") as handle:
        items = [json.loads(line) for line in handle if line.strip()]
    return [encode(tokenizer, item, max_tokens) for item in items if half is None or item.get("half") == half]


def adr_measure(examples: Sequence[Example], probabilities: Sequence[Sequence[float]],
                threshold: float) -> dict[str, Any]:
    column = KINDS.index("adr")
    hits = [(p[column] >= threshold, e.kinds[column] == 1.0) for e, p in zip(examples, probabilities, strict=True)]
    tp, fp = sum(a and b for a, b in hits), sum(a and not b for a, b in hits)
    positives, negatives = sum(b for _, b in hits), sum(not b for _, b in hits)
    recall, false_rate = tp / max(positives, 1), fp / max(negatives, 1)
    return {"recall": round(recall, 3), "precision": round(tp / max(tp + fp, 1), 3),
            "balanced_precision": round(recall / max(recall + false_rate, 1e-9), 3),
            "positives": positives, "negatives": negatives, "threshold": threshold}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("build/recogniser"))
    parser.add_argument("--data", type=Path, default=Path("build/recogniser_data"))
    parser.add_argument("--half", default="check", choices=("tune", "check"), help="ADE-Corpus-V2's half")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    card = json.loads((args.model / "card.json").read_text(encoding="utf-8"))
    thresholds = [float(card["thresholds"][k]) for k in KINDS]
    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    pad_id = int(json.loads((args.model / "config.json").read_text()).get("pad_token_id", 0))
    model = load_trained(args.model)
    check = read(args.data / "check.jsonl", tokenizer, card["max_tokens"])
    ade = read(args.data / "ade_eval.jsonl", tokenizer, card["max_tokens"], args.half)
    report = {"check": measures(check, predict(model, check, pad_id), thresholds),
              f"ade_{args.half}": adr_measure(ade, predict(model, ade, pad_id), thresholds[KINDS.index("adr")])}
    log.info("%s", json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
