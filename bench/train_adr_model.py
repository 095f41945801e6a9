"""Train the ADR model (src/ebmrag/evidence/models/adr_model.npz): the second reader of evidence/adr.py.

Run: python bench/train_adr_model.py --data-root ../shared/data [--report-check]

The grammar of evidence/adr.py links a drug to a reaction when the clause says how ("-induced", "after",
"caused"); the model reads the clauses it could not link, with every drug written `drugx` and every
reaction `reactx`, and learns the other ways a case report or a chart writes the link. Training text, all
from the TUNE half of each corpus (eval.halves): ADE-Corpus-V2 (case-report sentences, adr / no_adr),
BioCreative V CDR (sentences of human studies with a gold chemical-induced-disease pair, or with both a
chemical and a disease but no such pair), PsyTAR (patient reviews: ADR or withdrawal, or neither) and the
sentences of sectioned notes that name a drug (MTSamples, MTS-Dialog, ACI-Bench; see chart_items).
The threshold is chosen on out-of-fold predictions for the ADE tune half: the lowest one whose precision
against an equal number of no_adr sentences stays at or above --min-precision. --report-check scores the
check half once, at the end.
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
    parser.add_argument("--min-precision", type=float, default=0.85)
    parser.add_argument("--c", type=float, default=4.0)
    parser.add_argument("--report-check", action="store_true")
    args = parser.parse_args()
    features = NgramFeatures(buckets=2**15, word_ngrams=3, char_ngrams=3)
    ade = ade_items(args.data_root, "tune")
    ade_texts, ade_labels, ade_owner = model_rows(ade)
    other_texts, other_labels, _ = model_rows(other_items(args.data_root))
    grammar = {i for i, (t, _) in enumerate(ade) if scan(t)[0]}
    log.info("ADE tune: %d sentences, grammar alone: recall %.3f, T1 on no_adr %.3f, precision %.3f", len(ade),
             *rates(ade, grammar))
    log.info("model rows: %d ADE, %d other", len(ade_texts), len(other_texts))
    folds = np.arange(len(ade_texts)) % 5
    oof = np.zeros(len(ade_texts))
    scratch = args.out.with_suffix(".fold.npz")
    for k in range(5):
        train = [i for i in range(len(ade_texts)) if folds[i] != k]
        model = fit_ngram_classifier([ade_texts[i] for i in train] + other_texts,
                                     [ade_labels[i] for i in train] + other_labels, scratch, c=args.c,
                                     features=features)
        test = [i for i in range(len(ade_texts)) if folds[i] == k]
        oof[test] = model.probabilities([ade_texts[i] for i in test])[:, model.labels.index("adr")]
    scratch.unlink(missing_ok=True)
    passing = []
    for threshold in np.arange(0.05, 0.96, 0.05):
        flagged = grammar | {ade_owner[i] for i in range(len(ade_texts)) if oof[i] >= threshold}
        recall, false, precision = rates(ade, flagged)
        log.info("threshold %.2f: recall %.3f, T1 on no_adr %.3f, precision %.3f", threshold, recall, false, precision)
        if precision >= args.min_precision:
            passing.append(float(threshold))
    chosen = min(passing, default=0.95)
    log.info("chosen threshold %.2f", chosen)
    fit_ngram_classifier(ade_texts + other_texts, ade_labels + other_labels, args.out, c=args.c, features=features,
                         extra_meta={"threshold": chosen, "sources": ["ADE-Corpus-V2 tune half", "BC5CDR tune half",
                                                                      "PsyTAR tune half"],
                                     "input": "clauses the grammar could not link, drugs and reactions masked"})
    adr_model_cache_clear()
    if args.report_check:
        check = ade_items(args.data_root, "check")
        flagged = {i for i, (t, _) in enumerate(check) if adr_mentions(t)}
        log.info("ADE CHECK half: %d sentences, recall %.3f, T1 on no_adr %.3f, precision %.3f", len(check),
                 *rates(check, flagged))


def adr_model_cache_clear() -> None:
    from ebmrag.evidence.adr import adr_model
    adr_model.cache_clear()


if __name__ == "__main__":
    main()
