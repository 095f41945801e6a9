"""Query-side retrieval levers on LiveQA-Med, each against the plain hybrid of the same knowledge base (issue 19).

    python bench/retrieval_levers.py --data-root ../shared/data --kb /tmp/kb-liveqa [--config F] [--split tune] \\
        [--second-kb KB2 --second-config F2] [--json]

Every variant re-ranks with an exact dense scan (V @ q), so the variants differ only in the lever:
- `pieces`: the question's sentences (3+ words) embedded one by one, their best cosine mixed into the full text's;
- `centroid`: the mean of those sentence vectors mixed with the full text's cosine;
- `prf`: Rocchio pseudo-relevance feedback on the dense route (query + beta * mean of the top-k chunk vectors);
- `subject`: the consumer's subject line embedded alone and mixed in;
- `page`: a section's score blended with its page's best section (gamma), MedQuAD pages read from the section id
  (`..._SecN`), optionally with the best 3 pages' other sections added;
- `ensemble`: the mean of the two knowledge bases' cosines (`--second-kb`, the same corpus with another model);
- `abbreviations`: the offline expansion of issue 17: "Long Name (ABBR)" pairs read from the knowledge base's own
  titles and text (initials must spell the abbreviation), and each abbreviation in the question (2+ letters, not a
  common word) followed by its long form.
LiveQA questions are only scored, never used to fit anything; choose on `--split tune`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ebmrag.compose import Resources
from ebmrag.config import load_settings
from ebmrag.eval.retrieval import Query, liveqa_queries, score_ranking, select_split
from ebmrag.index.kb import KnowledgeBase
from ebmrag.retrieve.fusion import Ranked, fuse, top
from ebmrag.text.sentences import split_sentences

Scores = npt.NDArray[np.float32]
_DEFINED = re.compile(r"\b((?:[A-Za-z][\w'-]*[ ,]+){0,7}?[A-Za-z][\w'-]*)\s+\(([A-Z][A-Za-z0-9-]{1,9})\)")
_SMALL = {"of", "and", "the", "with", "in", "to", "for", "on", "a"}
_COMMON = {"is", "it", "as", "am", "us", "or", "an", "at", "be", "by", "do", "go", "he", "if", "in", "me", "my",
           "no", "of", "on", "so", "to", "up", "we", "all", "and", "are", "can", "for", "had", "has", "her", "him",
           "his", "how", "its", "not", "now", "our", "out", "she", "the", "was", "who", "why", "you", "any", "may",
           "one", "two", "use", "get", "per", "day", "old", "new", "car"}


def abbreviation_table(texts: list[str]) -> dict[str, str]:
    """abbreviation -> its most frequent long form, from "Long Name (ABBR)" where the initials spell ABBR."""
    seen: dict[str, Counter[str]] = {}
    for text in texts:
        for match in _DEFINED.finditer(text):
            words = match.group(1).replace(",", " ").split()
            letters = [c.lower() for c in match.group(2) if c.isalpha()]
            for start in range(len(words) - 1, -1, -1):
                if [w[0].lower() for w in words[start:] if w.lower() not in _SMALL] == letters:
                    seen.setdefault("".join(letters), Counter())[" ".join(words[start:]).lower()] += 1
                    break
    return {abbr: forms.most_common(1)[0][0] for abbr, forms in seen.items() if len(abbr) >= 2}


def expand_abbreviations(text: str, table: dict[str, str]) -> str:
    found = [table[t.lower()] for t in re.findall(r"[A-Za-z][A-Za-z0-9]{1,9}", text)
             if t.lower() in table and t.lower() not in _COMMON]
    return f"{text} ({'; '.join(dict.fromkeys(found))})" if found else text


class Levers:
    def __init__(self, kb: KnowledgeBase, second: KnowledgeBase | None) -> None:
        self.kb, self.second = kb, second
        rows = list(kb.reader().iter_chunks())
        self.unit = [c.section_id or c.doc_id for c in rows]
        self.page = {u: re.sub(r"_Sec\d+$", "", u) for u in self.unit}
        self.sections_of: dict[str, list[str]] = {}
        for u in dict.fromkeys(self.unit):
            self.sections_of.setdefault(self.page[u], []).append(u)
        self.vectors = np.asarray(kb.reader().dense.vectors, dtype=np.float32)
        titles = [d.title for d in kb.reader().documents().values()]
        self.abbreviations = abbreviation_table(titles + [c.text for c in rows])
        if second is not None:
            if [c.chunk_id for c in second.reader().iter_chunks()] != [c.chunk_id for c in rows]:
                raise SystemExit("--second-kb must hold the same chunks in the same order")
            self.second_vectors = np.asarray(second.reader().dense.vectors, dtype=np.float32)

    def cosines(self, texts: list[str], kb: KnowledgeBase | None = None) -> Scores:
        kb = kb or self.kb
        vectors = self.vectors if kb is self.kb else self.second_vectors
        return vectors @ kb.embedder.embed(texts).T

    def hybrid(self, text: str, dense: Scores) -> Ranked:
        bm25 = Ranked(*self.kb.reader().lexical.search(self.kb.analyzer.terms(text), 50))
        order = np.argpartition(-dense, 50)[:50]
        order = order[np.argsort(-dense[order], kind="stable")]
        return top(fuse([bm25, Ranked(order.astype(np.int64), dense[order])], [0.3, 0.7], "score"), 100)

    def units(self, ranked: Ranked) -> list[str]:
        return list(dict.fromkeys(self.unit[r] for r in ranked.rows.tolist()))

    def by_page(self, ranked: Ranked, gamma: float, expand: int = 0) -> list[str]:
        score: dict[str, float] = {}
        for row, value in zip(ranked.rows.tolist(), ranked.scores.tolist(), strict=True):
            score[self.unit[row]] = max(score.get(self.unit[row], -1e9), value)
        page_best: dict[str, float] = {}
        for u, value in score.items():
            page_best[self.page[u]] = max(page_best.get(self.page[u], -1e9), value)
        floor = min(score.values())
        for page in sorted(page_best, key=lambda p: -page_best[p])[:expand]:
            for u in self.sections_of[page]:
                score.setdefault(u, floor)
        final = {u: (1 - gamma) * v + gamma * page_best[self.page[u]] for u, v in score.items()}
        return sorted(final, key=lambda u: -final[u])

    def variants(self, text: str) -> dict[str, list[str]]:
        full = self.cosines([text])[:, 0]
        plain = self.hybrid(text, full)
        out = {"hybrid": self.units(plain)}
        pieces = [s.text for s in split_sentences(text) if len(s.text.split()) >= 3]
        piece_max, centroid = full, full
        if len(pieces) > 1:
            piece_max = self.cosines(pieces).max(axis=1)
            mean = self.kb.embedder.embed(pieces).mean(axis=0)
            centroid = self.vectors @ (mean / np.linalg.norm(mean)).astype(np.float32)
        for lam in (0.3, 0.5):
            out[f"pieces {lam}"] = self.units(self.hybrid(text, (1 - lam) * full + lam * piece_max))
        out["centroid 0.5"] = self.units(self.hybrid(text, 0.5 * full + 0.5 * centroid))
        query = self.kb.embedder.embed([text])[0]
        for k, beta in ((3, 0.5), (5, 0.5), (5, 1.0), (10, 0.5)):
            first = np.argpartition(-full, k)[:k]
            moved = query + beta * self.vectors[first].mean(axis=0)
            moved_cosines = self.vectors @ (moved / np.linalg.norm(moved)).astype(np.float32)
            out[f"prf k={k} beta={beta}"] = self.units(self.hybrid(text, moved_cosines))
        subject = self.cosines([text.split(". ", 1)[0]])[:, 0]
        for lam in (0.2, 0.35):
            out[f"subject {lam}"] = self.units(self.hybrid(text, (1 - lam) * full + lam * subject))
        for gamma in (0.2, 0.4, 0.6):
            out[f"page {gamma}"] = self.by_page(plain, gamma)
            out[f"page {gamma} +3 pages"] = self.by_page(plain, gamma, 3)
        expanded = expand_abbreviations(text, self.abbreviations)
        out["abbreviations"] = self.units(self.hybrid(expanded, self.cosines([expanded])[:, 0]))
        if self.second is not None:
            ensemble = ((full + self.cosines([text], self.second)[:, 0]) / 2).astype(np.float32)
            out["ensemble"] = self.units(self.hybrid(text, ensemble))
        return out


def evaluate(levers: Levers, queries: list[Query]) -> dict[str, list[float]]:
    scores: dict[str, list[float]] = {}
    for query in queries:
        for name, units in levers.variants(query.text).items():
            scores.setdefault(name, []).append(score_ranking(units, query.gains).ndcg_at_10)
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--kb", type=Path, required=True)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--second-kb", type=Path)
    parser.add_argument("--second-config", type=Path)
    parser.add_argument("--split", default="tune")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    def opener(config: Path | None, kb: Path) -> KnowledgeBase:
        store = Resources.open(load_settings(config), kb).knowledge_base
        if not isinstance(store, KnowledgeBase):
            raise SystemExit(f"{kb}: the levers read embedded index files; set [kb] backend = \"embedded\"")
        return store

    second = opener(args.second_config, args.second_kb) if args.second_kb else None
    levers = Levers(opener(args.config, args.kb), second)
    queries = select_split(liveqa_queries(args.data_root / "liveqa_med_2017"), args.split)
    means = {name: round(float(np.mean(v)), 4) for name, v in evaluate(levers, queries).items()}
    if args.json:
        print(json.dumps({"split": args.split, "queries": len(queries), "ndcg@10": means}, indent=2))
        return
    print(f"| lever ({args.split}, {len(queries)} questions) | nDCG@10 | vs hybrid |\n|---|---|---|")
    for name, value in means.items():
        print(f"| {name} | {value:.4f} | {value - means['hybrid']:+.4f} |")


if __name__ == "__main__":
    main()
