"""Build the reaction vocabulary of the ADR recogniser (src/ebmrag/rules/evidence/reactions.txt).

Run: python bench/build_reaction_lexicon.py --corpora ../shared/data/text_corpora [--min-count 2]

Terms are the gold adverse-reaction mentions of TAC 2017 ADR (FDA drug labels; CC0 1.0) and the disease
mentions of BioCreative V CDR that take part in a gold chemical-induced-disease pair (PubMed abstracts;
public domain, NLM). Only the TUNE half of each corpus is read (eval.halves), so the check half and the
held-back halves stay unseen. A term is kept when it occurs at least `--min-count` times, has one to four
words and is not a bare number or a word that names no disorder (see STOP below).
"""

from __future__ import annotations

import argparse
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from ebmrag.eval.halves import group_key, half_of

OUT = Path(__file__).resolve().parents[1] / "src" / "ebmrag" / "rules" / "evidence" / "reactions.txt"
STOP = frozenset({
    "death", "deaths", "disease", "diseases", "disorder", "disorders", "syndrome", "effect", "effects", "event",
    "events", "adverse", "reaction", "reactions", "toxicity", "toxic", "injury", "abnormal", "abnormalities",
    "increase", "increased", "decrease", "decreased", "changes", "change", "pain", "infection", "infections",
    "cancer", "tumor", "tumors", "tumour", "malignancy", "malignancies", "lesions", "lesion", "symptoms", "symptom",
    "side effects", "adverse reactions", "adverse events", "adverse reaction", "adverse event",
    # severity, course and direction words annotated inside a reaction span; alone they name no reaction
    "fatal", "acute", "chronic", "severe", "serious", "mild", "moderate", "high", "low", "elevated", "elevation",
    "elevations", "decreases", "increases", "reduced", "reduction", "transient", "persistent", "recurrent",
    "life-threatening", "significant", "marked", "worsening", "abnormality", "dysfunction", "impairment", "risk",
    "skin", "blood", "heart", "liver", "kidney", "lung", "heart rate", "blood pressure", "weight", "body weight",
    "diagnosis", "deterioration", "progression", "relapse", "recurrence", "resistance", "sensitivity", "levels",
    "concentration", "concentrations", "count", "counts", "platelet count", "total bilirubin", "injection site",
    "hospitalization", "discontinuation", "dose", "overdosage", "treatment", "therapy", "use", "exposure", "pregnancy",
})
_WORD = re.compile(r"[a-z][a-z0-9'-]*")


def normal(term: str) -> str:
    text = unicodedata.normalize("NFKC", term).lower()
    return " ".join(_WORD.findall(text))


def harvest(corpora: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name, keep in (("tac2017_adr_label_sentences_shared.jsonl", lambda s, _: s.get("type") == "AdverseReaction"),
                       ("bc5cdr_cid_sentences_shared.jsonl", _cid_disease)):
        for line in (corpora / name).read_text(encoding="utf-8").splitlines():
            item = json.loads(line)
            if half_of(group_key(item["id"])) != "tune":
                continue
            for span in item.get("spans") or []:
                if keep(span, item):
                    counts[normal(span.get("text", ""))] += 1
    return counts


def _cid_disease(span: dict[str, Any], item: dict[str, Any]) -> bool:
    pairs = (item.get("label_detail") or {}).get("cid_pairs") or []
    return span.get("type") == "Disease" and any(span.get("mesh") == pair[1] for pair in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpora", type=Path, default=Path("../shared/data/text_corpora"))
    parser.add_argument("--min-count", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    counts = harvest(args.corpora)
    terms = sorted(t for t, n in counts.items()
                   if n >= args.min_count and t and t not in STOP and 1 <= len(t.split()) <= 4 and len(t) >= 4)
    header = ("# Adverse-reaction terms (one lower-case term a line) for evidence/adr.py, built by\n"
              "# bench/build_reaction_lexicon.py from the tune halves of TAC 2017 ADR (AdverseReaction mentions in\n"
              "# FDA labels; CC0 1.0) and BioCreative V CDR (diseases of gold chemical-induced-disease pairs; public\n"
              f"# domain, NLM). {len(terms)} terms seen at least {args.min_count} times. See rules/LICENSES.md.\n")
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(header + "\n".join(terms) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"{len(terms)} terms -> {args.out}")


if __name__ == "__main__":
    main()
