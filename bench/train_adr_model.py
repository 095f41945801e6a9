"""Train the ADR model (src/ebmrag/evidence/models/adr_model.npz): the second reader of evidence/adr.py.

Run: python bench/train_adr_model.py --data-root ../shared/data [--report-check]

The grammar of evidence/adr.py links a drug to a reaction when the clause says how ("-induced", "after",
"caused"); the model reads the clauses it could not link, with every drug written `drugx` and every
reaction `reactx`, and learns the other ways a case report or a chart writes the link. Training text, all
from the TUNE half of each corpus (eval.halves) and all under a stated open licence (issue 45): BioCreative V
CDR (public domain; sentences of human studies with a gold chemical-induced-disease pair, or with both a
chemical and a disease but no such pair), PsyTAR (CC BY 4.0; patient reviews: ADR or withdrawal, or neither) and
the sentences of sectioned notes that name a drug (MTSamples CC0, MTS-Dialog and ACI-Bench CC BY 4.0; see
chart_items). ADE-Corpus-V2 states no licence: nothing shipped is trained or tuned on it, it is only measured.
The threshold is chosen on 5-fold out-of-fold predictions for those training items: the lowest one whose
precision against an equal number of negatives stays at or above --min-precision. --report-check scores
ADE-Corpus-V2's tune and check halves once, at the end (the grammar and the model together, as evidence/adr.py
reads).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ebmrag.eval.halves import group_key, half_of
from ebmrag.evidence.adr import MODEL_PATH, adr_mentions, drug_spans, scan
from ebmrag.models.ngram_classifier import NgramFeatures, fit_ngram_classifier

log = logging.getLogger("train_adr_model")


def _jsonl(path: Path) -> Iterator[dict[str, object]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def ade_items(root: Path, half: str) -> list[tuple[str, bool]]:
    path = root / "ade_corpus" / "ade_corpus_v2_shared.jsonl"
    return [(str(r["text"]), r["kind"] == "adr") for r in _jsonl(path) if half_of(f"ade:{r['pmid']}") == half]


def other_items(root: Path) -> list[tuple[str, bool]]:
    """BC5CDR human-study sentences and PsyTAR reviews of the tune half, as (text, is_adr)."""
    items: list[tuple[str, bool]] = []
    for r in _jsonl(root / "text_corpora" / "bc5cdr_cid_sentences_shared.jsonl"):
        detail = r.get("label_detail") or {}
        assert isinstance(detail, dict)
        if half_of(group_key(str(r["id"]))) != "tune" or detail.get("doc_mentions_animals"):
            continue
        if r.get("label") == "T1" or detail.get("subtype") == "no_cid_pair":
            items.append((str(r["text"]), r.get("label") == "T1"))
    for r in _jsonl(root / "text_corpora" / "psytar_sentences_shared.jsonl"):
        if half_of(group_key(str(r["id"]))) == "tune":
            items.append((str(r["text"]), r.get("label") == "T1"))
    return items + chart_items(root)


def chart_items(root: Path) -> list[tuple[str, bool]]:
    """How charts write drugs: the sentences of sectioned notes (MTSamples, MTS-Dialog, ACI-Bench; tune half)
    that name a drug. An allergy-section sentence is a reaction; a sentence of any other section is taken as
    none (a medication list, an indication, a plan), which teaches the model 'asthma for which he uses
    salbutamol' is no reaction. A few reaction stories told in the history are mislabelled by this; they are few."""
    items: list[tuple[str, bool]] = []
    for name in ("mtsamples_sections_shared.jsonl", "mts_dialog_sections_shared.jsonl", "aci_bench_notes_shared.jsonl"):
        for r in _jsonl(root / "text_corpora" / name):
            detail = r.get("label_detail") or {}
            assert isinstance(detail, dict)
            text = str(r["text"])
            if half_of(group_key(str(r["id"]))) != "tune" or not drug_spans(text.lower()):
                continue
            items.append((text, detail.get("subtype") == "allergy"))
    return items


def model_rows(items: list[tuple[str, bool]]) -> tuple[list[str], list[str], list[int]]:
    """The masked clauses the model would read, their labels, and the item each came from."""
    texts, labels, owners = [], [], []
    for index, (text, is_adr) in enumerate(items):
        found, unlinked = scan(text)
        if found:
            continue
        for masked_clause, *_ in unlinked:
            texts.append(masked_clause)
            labels.append("adr" if is_adr else "none")
            owners.append(index)
    return texts, labels, owners


def rates(items: list[tuple[str, bool]], flagged: set[int]) -> tuple[float, float, float]:
    positives = [i for i, (_, y) in enumerate(items) if y]
    negatives = [i for i, (_, y) in enumerate(items) if not y]
    recall = sum(i in flagged for i in positives) / len(positives)
    false = sum(i in flagged for i in negatives) / len(negatives)
    return recall, false, recall / (recall + false) if recall + false else 0.0


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=MODEL_PATH)
    parser.add_argument("--min-precision", type=float, default=0.80)
    parser.add_argument("--c", type=float, default=4.0)
    parser.add_argument("--report-check", action="store_true")
    args = parser.parse_args()
    features = NgramFeatures(buckets=2**15, word_ngrams=3, char_ngrams=3)
    items = other_items(args.data_root)
    texts, labels, owner = model_rows(items)
    grammar = {i for i, (t, _) in enumerate(items) if scan(t)[0]}
    log.info("training items: %d (grammar alone: recall %.3f, flagged negatives %.3f, balanced precision %.3f); "
             "%d model rows", len(items), *rates(items, grammar), len(texts))
    chosen = choose_threshold(texts, labels, owner, items, grammar, args, features)
    fit_ngram_classifier(texts, labels, args.out, c=args.c, features=features,
                         extra_meta={"threshold": chosen, "sources": ["BC5CDR tune half (public domain)",
                                                                      "PsyTAR tune half (CC BY 4.0)",
                                                                      "MTSamples, MTS-Dialog, ACI-Bench tune halves"],
                                     "input": "clauses the grammar could not link, drugs and reactions masked"})
    adr_model_cache_clear()
    if args.report_check:
        for half in ("tune", "check"):
            ade = ade_items(args.data_root, half)
            flagged = {i for i, (t, _) in enumerate(ade) if adr_mentions(t)}
            log.info("ADE-Corpus-V2 %s half (measured only): %d sentences, recall %.3f, T1 on no_adr %.3f, "
                     "balanced precision %.3f", half, len(ade), *rates(ade, flagged))


def choose_threshold(texts: list[str], labels: list[str], owner: list[int], items: list[tuple[str, bool]],
                     grammar: set[int], args: argparse.Namespace, features: NgramFeatures) -> float:
    """The lowest threshold whose out-of-fold balanced precision on the training items reaches --min-precision
    (folds by item, so an item's clauses are never split)."""
    folds = np.asarray(owner) % 5
    oof = np.zeros(len(texts))
    scratch = args.out.with_suffix(".fold.npz")
    for k in range(5):
        train = [i for i in range(len(texts)) if folds[i] != k]
        model = fit_ngram_classifier([texts[i] for i in train], [labels[i] for i in train], scratch, c=args.c,
                                     features=features)
        test = [i for i in range(len(texts)) if folds[i] == k]
        oof[test] = model.probabilities([texts[i] for i in test])[:, model.labels.index("adr")]
    scratch.unlink(missing_ok=True)
    passing = []
    for threshold in np.arange(0.05, 0.96, 0.05):
        flagged = grammar | {owner[i] for i in range(len(texts)) if oof[i] >= threshold}
        recall, false, precision = rates(items, flagged)
        log.info("threshold %.2f: recall %.3f, flagged negatives %.3f, balanced precision %.3f", threshold, recall,
                 false, precision)
        if precision >= args.min_precision:
            passing.append(float(threshold))
    chosen = min(passing, default=0.95)
    log.info("chosen threshold %.2f", chosen)
    return chosen


def adr_model_cache_clear() -> None:
    from ebmrag.evidence.adr import adr_model
    adr_model.cache_clear()


if __name__ == "__main__":
    main()
