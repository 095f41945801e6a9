"""Authored training examples for the critical-fact recogniser (issue 45): the kinds the licensed corpora barely hold.

    python bench/recogniser_authored.py --out build/recogniser_data/authored.jsonl [--per-kind 600 --seed 7]

Why: the corpora of bench/recogniser_data.py hold no Chinese ADR stories (用药第3天出现皮疹), almost no critical result
as a ward writes it ("K 6.8 HH", "血钾6.8mmol/L 危急值"), few pathology stages or margins, and genetic results only for
the genes drug labels name. Here sentences are composed, never copied: a small grammar of how clinicians write
(bench/recogniser_authored.toml) filled from the project's maintained vocabularies: drug tables, lexicon and Chinese
names (rules/drugs), reaction terms and serious reactions (rules/evidence/reactions.txt, adr.toml), every HGNC symbol
and CPIC's gene-drug pairs (rules/genes), analytes with their written forms, units and critical limits. Variants
follow their nomenclatures: HGVS c. and p., exon events, star-allele diplotypes, rsIDs, HLA alleles, copy number,
fusions. Each kind has as many negatives as positives, of the same vocabulary: orders, plans, pending tests,
guidelines, denials, tolerated drugs, hypothetical reactions, indications, treatment responses, normal or merely
abnormal results, thresholds ("call if K > 6.0"). A de-labelled allergy is no allergy; a relative's allergy, tumour
or variant, without a result of the patient's own, is no fact of this patient (kinds []).

Labels are exact by construction. Each slot a vocabulary fills is marked as its span type (`SPAN_OF`) wherever it is
written, negatives too (as BC5CDR marks a disease that is no adverse reaction); a result word the template writes
itself ("Send EGFR mutation testing") is not. A critical value lies beyond a limit of critical_values.toml after the
rounding a report shows; a normal one inside the grammar's [reference] interval. Kept out of every measure: the file
is only ever added to training (bench/train_recogniser.py --extra), never to dev, check or an evaluation, and its
lines say so (`"source": "authored"`, `"label_quality": "authored"`). Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ebmrag.evidence.result_tables import DEFAULT_ANALYTES_PATH, Analyte, read_result_tables, unit_key
from ebmrag.rules import FOLDER
from ebmrag.vocab.drugs import CLASSES_PATH, RENAL_PATH
from ebmrag.vocab.drugs import vocabulary as drug_vocabulary
from ebmrag.vocab.gene_vocabulary import vocabulary as gene_vocabulary
from ebmrag.vocab.lexicon import terms, zh_drug_names

GRAMMAR = Path(__file__).with_name("recogniser_authored.toml")
KINDS = ("allergy", "adr", "pathology", "genetic", "critical_result")
SPAN_TYPES = ("DRUG", "REACTION", "GENE", "VARIANT", "ANALYTE", "VALUE")
LANGS = ("en", "zh")
SOURCE, LICENCE = "authored", "project's own text (authored)"
SPAN_OF = {slot: kind for kind, slots in (
    ("DRUG", "drug drugclass pdrug"), ("REACTION", "reaction serious"), ("GENE", "gene pgene rgene hla"),
    ("VARIANT", "cdna protein exon rword cnv fusion zyg class star rsid allele pheno"), ("ANALYTE", "analyte"),
    ("VALUE", "value limit")) for slot in slots.split()}
CAPITALISED = frozenset({"drug", "drugclass", "pdrug", "reaction", "serious", "condition", "organ", "histology",
                         "zyg", "relative", "analyte"})  # at a sentence's start, when written in lower case
AA = dict(zip("Ala Arg Asn Asp Cys Gln Glu Gly His Ile Leu Lys Met Phe Pro Ser Thr Trp Tyr Val".split(),
              "ARNDCQEGHILKMFPSTWYV", strict=True))  # amino acids, three letters -> one
_SLOT = re.compile(r"\{(\w+)\}")
_SYMBOL = re.compile(r"[A-Z][A-Z0-9]{2,7}")  # a plain HGNC symbol (no orf, no hyphen, no lower case)
_WORD_ENDS = "of|on|in|to|at|with|for|and|or|the"
_NOT_A_FORM = re.compile(rf"^({_WORD_ENDS}|increased?|decreased?) | ({_WORD_ENDS})$")  # "activation of", "increase in"


@dataclass(frozen=True)
class Vocabulary:
    """The project's vocabularies, as this generator draws from them; by language where they differ."""

    drugs: Mapping[str, tuple[str, ...]]
    classes: Mapping[str, tuple[str, ...]]
    reactions: Mapping[str, tuple[str, ...]]
    serious: Mapping[str, tuple[str, ...]]
    genes: tuple[str, ...]
    pairs: Mapping[str, tuple[str, ...]]  # CPIC gene -> its drugs, every level
    analytes: tuple[Analyte, ...]  # those with a critical limit
    forms: Mapping[tuple[str, str], tuple[str, ...]]  # (analyte, "en" | "zh" | "abbr") -> written names


@lru_cache(maxsize=1)
def grammar() -> dict[str, Any]:
    return tomllib.loads(GRAMMAR.read_text(encoding="utf-8"))


def _toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _drugs(pairs: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, tuple[str, ...]]]:
    """English: the INNs of the class and renal tables and of CPIC's pairs, and the tables' brands; Chinese: the
    harvested names less the fragments the grammar lists, the named ingredients, the CPIC drugs' Chinese names.
    Classes: each class's first word ("penicillin", "NSAID"), the Chinese classes with 类."""
    tables, chinese = drug_vocabulary(), terms().chinese
    noise = re.compile("|".join(grammar()["drugs"]["zh_not_names"]))
    inns = {m for c in tables.classes.values() for m in c.members} | {m for _, _, ms in tables.renal for m in ms}
    inns |= {d for drugs in pairs.values() for d in drugs}
    brands = sorted(b.capitalize() for path in (CLASSES_PATH, RENAL_PATH) for b in _toml(path)["brands"])
    zh = {n for n in zh_drug_names() if not noise.search(n)} | {n for n, m in chinese.items() if m.kind == "ingredient"}
    words = [re.sub(r"(?<=[a-z]{4})s$", "", c["words"][0]) for c in _toml(CLASSES_PATH)["class"] if c["words"]]
    return {"drugs": {"en": tuple(sorted(d for d in inns if len(d.split()) <= 3 and "," not in d)) + tuple(brands),
                      "zh": tuple(sorted(zh | set(grammar()["pharmacogenomics"]["zh_names"].values())))},
            "classes": {"en": tuple(w.replace("nsaid", "NSAID").replace("ace ", "ACE ") for w in words),
                        "zh": tuple(f"{n}类" for n, m in chinese.items() if m.kind == "class")}}


def _reactions() -> dict[str, dict[str, tuple[str, ...]]]:
    """English: reactions.txt's terms that name a reaction on their own (a disorder's ending or a reaction word of
    adr.toml, or a serious reaction; no dangling preposition, no bare adjective). Chinese: adr.toml's reaction words
    less those the grammar says name none. `serious`: those adr.toml calls serious."""
    rules = _toml(FOLDER / "evidence/adr.toml")["reactions"]
    lines = (FOLDER / "evidence/reactions.txt").read_text(encoding="utf-8").splitlines()
    endings, words = tuple(rules["suffixes"]), frozenset(rules["en_words"]) - {"disease", "disorder", "disorders"}
    serious = [re.compile(p, re.IGNORECASE) for p in rules["serious_en"]]
    en = [t for t in (line.strip() for line in lines if not line.startswith("#")) if t and len(t.split()) <= 3
          and not _NOT_A_FORM.search(t) and not t.endswith(("ic", "ive", "ous", "al", "dress"))
          and (t in words or t.split()[-1] in words or (t.endswith(endings) and len(t.split()[-1]) >= 7)
               or any(p.search(t) for p in serious))]
    en = [" ".join(w.upper() if len(w) <= 3 and not set(w) & set("aeiouy") else w for w in t.split()) for t in en]
    skip = set(grammar()["drugs"]["zh_not_reactions"])
    zh = [re.sub("[a-z]+", lambda m: m.group().upper(), w) for w in rules["serious_zh"] if w not in skip]
    return {"reactions": {"en": tuple(en), "zh": tuple(sorted(set(rules["other_zh"] + zh) - skip))},
            "serious": {"en": tuple(t for t in en if any(p.search(t) for p in serious)), "zh": tuple(zh)}}


def load_vocabulary() -> Vocabulary:
    genes = gene_vocabulary()
    pairs = {g: tuple(sorted({d for ds in levels.values() for d in ds})) for g, levels in sorted(genes.pairs.items())}
    analytes = tuple(a for a in read_result_tables().analytes.values() if _limits(a))
    raw = _toml(DEFAULT_ANALYTES_PATH)["analyte"]
    forms = {(e["name"], lang): tuple(w for key in keys for w in e.get(key, [])) for e in raw
             for lang, keys in (("en", ("names", "abbreviations")), ("zh", ("chinese",)), ("abbr", ("abbreviations",)))}
    return Vocabulary(**_drugs(pairs), **_reactions(), pairs=pairs, analytes=analytes, forms=forms,
                      genes=tuple(sorted(s for s in set(genes.written.values()) if _SYMBOL.fullmatch(s))))


class Scene:
    """One example's slots, each drawn once (a slot written twice says the same thing); `state` is the result's:
    "critical", "mild" (abnormal within the critical limits) or "normal"."""

    def __init__(self, rng: random.Random, lang: str, vocab: Vocabulary, state: str) -> None:
        self.rng, self.lang, self.vocab, self.state = rng, lang, vocab, state
        self.values: dict[str, str] = {}
        self.held: dict[str, Any] = {}

    def __getitem__(self, slot: str) -> str:
        if slot not in self.values:
            base = slot.rstrip("0123456789")
            value = DRAW.get(base, _word)(self, slot)
            while base != slot and value == self.values.get(base):  # {drug2}: another drug than {drug}
                value = DRAW.get(base, _word)(self, slot)
            self.values[slot] = value
        return self.values[slot]

    def pick(self, options: Any) -> Any:
        return self.rng.choice(list(options))


def _word(scene: Scene, slot: str) -> str:
    return str(scene.pick(grammar()["words"][scene.lang][slot.rstrip("0123456789")]))


def _tumour(scene: Scene, slot: str) -> str:
    organ, histology = scene.held.setdefault("tumour", scene.pick(grammar()["tumours"][scene.lang]))
    return str(organ if slot == "organ" else histology)


def _pgx_gene(scene: Scene, hla: bool, star: bool = True) -> str:
    """A CPIC gene of the wanted notation; in Chinese one with a drug the grammar has a Chinese name for."""
    if "pgx" not in scene.held:
        prefixes = tuple(grammar()["pharmacogenomics"]["star_prefixes"])
        names = grammar()["pharmacogenomics"]["zh_names"]
        genes = [g for g, drugs in scene.vocab.pairs.items() if g.startswith("HLA-") == hla
                 and (hla or g.startswith(prefixes) == star) and (scene.lang == "en" or any(d in names for d in drugs))]
        scene.held["pgx"] = scene.pick(genes)
    return str(scene.held["pgx"])


def _pdrug(scene: Scene, _slot: str) -> str:
    drugs = scene.vocab.pairs[scene.held.get("pgx") or _pgx_gene(scene, hla=False)]
    names = grammar()["pharmacogenomics"]["zh_names"]
    return str(scene.pick(drugs if scene.lang == "en" else [names[d] for d in drugs if d in names]))


def _cdna(scene: Scene, _slot: str) -> str:
    r, at = scene.rng, scene.rng.randint(20, 6000)
    a, b = r.sample("ACGT", 2)
    return str(r.choice([f"c.{at}{a}>{b}", f"c.{at}del{a}", f"c.{at}_{at + r.randint(1, 9)}del", f"c.{at}dup{a}",
                         f"c.{at}+{r.randint(1, 5)}{a}>{b}", f"c.{at}-{r.randint(1, 3)}{a}>{b}"]))


def _protein(scene: Scene, _slot: str) -> str:
    r, at = scene.rng, scene.rng.randint(2, 1500)
    a, b = r.sample(sorted(AA), 2)
    return str(r.choice([f"p.{a}{at}{b}", f"p.{AA[a]}{at}{AA[b]}", f"{AA[a]}{at}{AA[b]}", f"p.{a}{at}Ter",
                         f"p.{a}{at}{b}fsTer{r.randint(2, 40)}", f"p.({a}{at}{b})"]))


def _pharmacogenetic(scene: Scene, slot: str) -> str:
    """A star-allele diplotype (PharmVar), an rsID with its genotype (dbSNP), or an HLA allele's fields (WHO)."""
    r, (x, y) = scene.rng, (scene.rng.choice("ACGT") for _ in range(2))
    if slot == "star":
        return "*{}/*{}".format(*sorted(r.choice((1, 1, 1, 2, 2, 3, 4, 5, 6, 9, 10, 17, 28, 41)) for _ in range(2)))
    if slot == "rsid":
        return f"rs{r.randint(10**5, 10**9)}" + r.choice([f" ({x};{y})", f" {x}{y}", f" {x}/{y}"])
    return f"*{r.randint(1, 80):02d}:{r.randint(1, 12):02d}"


def _tnm(scene: Scene, _slot: str) -> str:
    r, gap = scene.rng, scene.rng.choice(["", " "])
    parts = [
        f"{r.choice(['p', 'p', 'yp', 'c', ''])}T{r.randint(1, 4)}{r.choice(['', 'a', 'b'])}", f"N{r.randint(0, 3)}"]
    return gap.join(parts + ([r.choice(["M0", "M0", "M1", "Mx"])] if r.random() < 0.7 else []))


def _analyte(scene: Scene, slot: str) -> str:
    """An analyte with a critical limit ({analyte2}: another one, always normal), written as a name or abbreviation
    (in Chinese mostly by its Chinese name, sometimes by the abbreviation wards use there too)."""
    others = [a for a in scene.vocab.analytes if all(a is not scene.held.get(s) for s in ("analyte", "analyte2"))]
    analyte = scene.held[slot] = scene.pick(others)
    form = scene.lang if scene.lang == "en" or scene.rng.random() < 0.7 else "abbr"
    return str(scene.pick(scene.vocab.forms[(analyte.name, form)] or scene.vocab.forms[(analyte.name, scene.lang)]))


def _limits(analyte: Analyte) -> list[tuple[str, float]]:
    return [(side, limit) for side, limit in (("low", analyte.critical_low), ("high", analyte.critical_high))
            if limit is not None]


def _canonical(scene: Scene, analyte: Analyte, state: str, side: str) -> float:
    low, high = (float(x) for x in grammar()["reference"][analyte.name])
    u = scene.rng.uniform(0.15, 0.85)
    if state == "normal":
        return scene.rng.uniform(low, high)
    if state == "mild":
        top, bottom = analyte.critical_high or high * 1.3, analyte.critical_low or low * 0.7
        return high + u * (top - high) if side == "high" else low - u * (low - bottom)
    if side == "high":
        return float(analyte.critical_high or 0) + u * (analyte.high - float(analyte.critical_high or 0)) * 0.25
    return float(analyte.critical_low or 0) - u * (float(analyte.critical_low or 0) - analyte.low) * 0.5


def _written(scene: Scene, analyte: Analyte, canonical: float) -> tuple[str, bool]:
    """The value as a report or a note writes it (a unit of the analyte's, or none where the canonical unit may go
    bare), and whether it is critical read back as results.py reads it (3 significant digits after a conversion)."""
    key = unit_key(analyte.unit)
    unit = analyte.units[key] if scene.rng.random() < 0.6 else scene.pick(analyte.units.values())
    number = (canonical - unit.offset) / unit.factor
    digits = 2 if analyte.name == "pH" or number < 1 else 0 if number >= 100 or (
        number >= 10 and scene.rng.random() < 0.7) else 1
    shown = f"{round(number, -2):.0f}" if number >= 1000 else f"{number:.{digits}f}"
    back = unit.canonical(float(shown))
    compared = back if unit.identity else float(f"{back:.3g}")
    critical = any(compared >= limit if side == "high" else compared <= limit for side, limit in _limits(analyte))
    bare = unit is analyte.units[key] and key in analyte.bare and scene.rng.random() < 0.45 and not any(
        analyte.low <= analyte.units[k].canonical(float(shown)) <= analyte.high for k in analyte.bare if k != key)
    written = "" if bare else unit.written  # bare only where no other unit could be meant (results.py's rule)
    if "10^" in written:
        written = scene.pick(["×", ""]) + written
    gap = scene.pick([" ", ""]) if scene.lang == "zh" and not written[:1].isdigit() else " "
    return shown + (gap if written else "") + written, critical


def _value(scene: Scene, slot: str) -> str:
    analyte: Analyte = scene.held.get(slot.replace("value", "analyte")) or scene.held.setdefault(
        "analyte", scene.pick(scene.vocab.analytes))
    state = scene.state if slot == "value" else "normal"
    for _ in range(50):
        side = scene.pick([s for s, _ in _limits(analyte)] if state == "critical" else ["low", "high"])
        text, critical = _written(scene, analyte, _canonical(scene, analyte, state, side))
        if critical == (state == "critical"):
            scene.held[f"side{slot[5:]}"] = side
            return text
    raise RuntimeError(f"no {state} value of {analyte.name} found")


def _threshold(scene: Scene, slot: str) -> str:
    """A critical limit as a threshold writes it: {cmp} its side, {limit} its value (the two agree)."""
    analyte = scene.held.get("analyte") or scene.held.setdefault("analyte", scene.pick(scene.vocab.analytes))
    side, limit = scene.held.get("threshold") or scene.held.setdefault("threshold", scene.pick(_limits(analyte)))
    if slot == "cmp":
        return str(scene.pick(grammar()["flags"][scene.lang][f"cmp_{side}"]))
    return f"{limit:g}" + (f" {'×' if '10^' in analyte.unit else ''}{analyte.unit}" if analyte.unit else "")


def _flag(scene: Scene, slot: str) -> str:
    state = scene.state if slot == "flag" else "normal"
    name = "normal" if state == "normal" else f"{state}_{scene.held[f'side{slot[4:]}']}"
    return str(scene.pick(grammar()["flags"][scene.lang][name]))


DRAW: dict[str, Callable[[Scene, str], str]] = {
    "drug": lambda s, _: str(s.pick(s.vocab.drugs[s.lang])),
    "drugclass": lambda s, _: str(s.pick(s.vocab.classes[s.lang] if s.rng.random() < 0.6 else s.vocab.drugs[s.lang])),
    "reaction": lambda s, _: str(s.pick(s.vocab.reactions[s.lang])),
    "serious": lambda s, _: str(s.pick(s.vocab.serious[s.lang])),
    "gene": lambda s, _: str(s.pick(s.vocab.genes)),
    "pgene": lambda s, _: _pgx_gene(s, hla=False), "rgene": lambda s, _: _pgx_gene(s, hla=False, star=False),
    "hla": lambda s, _: _pgx_gene(s, hla=True), "pdrug": _pdrug, "star": _pharmacogenetic,
    "rsid": _pharmacogenetic, "allele": _pharmacogenetic,
    "cdna": _cdna, "protein": _protein, "tnm": _tnm, "organ": _tumour, "histology": _tumour,
    "exon": lambda s, slot: _word(s, slot).replace("{e}", str(s.rng.randint(2, 21))),
    "analyte": _analyte, "value": _value, "limit": _threshold, "cmp": _threshold, "flag": _flag,
    "n": lambda s, _: str(s.rng.randint(2, 14)), "year": lambda s, _: str(s.rng.randint(2001, 2023)),
    "vaf": lambda s, _: str(s.rng.randint(3, 62)), "k": lambda s, _: str(s.rng.randint(1, 6)),
    "m": lambda s, _: str(s.rng.randint(8, 24)),
}


def fill(template: str, scene: Scene) -> tuple[str, list[dict[str, Any]]]:
    """The template with its slots filled, and a span over each slot a vocabulary filled. An empty slot (a result
    written without a flag) takes the space before it along."""
    text, at, spans = "", 0, list[dict[str, Any]]()
    for match in _SLOT.finditer(template):
        text += template[at:match.start()]
        slot, at = match.group(1), match.end()
        value, base = scene[slot], slot.rstrip("0123456789")
        if not value:
            text = text[:-1] if text.endswith(" ") else text
            continue
        if not text and scene.lang == "en" and base in CAPITALISED and value.islower():
            value = value[0].upper() + value[1:]
        if text and text[-1].isascii() and text[-1].isalnum() and value[0].isascii() and value[0].isalnum():
            text += " "  # "PaCO2 97", "mmHg L": two words the template wrote together stay two words
        kind = SPAN_OF.get(base) or ("REACTION" if base == "condition" and value in scene.vocab.reactions[
            scene.lang] else None)
        text += value
        if kind:
            spans.append({"start": len(text) - len(value), "end": len(text), "type": kind})
            assert text[spans[-1]["start"]:spans[-1]["end"]] == value, (template, value)
    text += template[at:]
    assert text == text.strip() and "  " not in text, text
    return text, spans


def generate(per_kind: int, seed: int, weight: float = 0.5) -> list[dict[str, Any]]:
    """`per_kind` positives and as many negatives of each kind, half in English and half in Chinese; a text is
    written once. Fewer than asked only where the grammar cannot make that many distinct texts."""
    rng, vocab, seen, records = random.Random(seed), load_vocabulary(), set(), []
    for kind in KINDS:
        for polarity in ("positive", "negative"):
            for lang in LANGS:
                table = [(c, t) for c, ts in sorted(grammar()[kind][lang][polarity].items()) for t in ts]
                want, made, tries = (per_kind + (lang == "en")) // 2, 0, 0
                while made < want and tries < want * 50:
                    tries += 1
                    category, template = rng.choice(table)
                    state = "critical" if polarity == "positive" else rng.choice(["normal", "normal", "mild"])
                    text, spans = fill(template, Scene(rng, lang, vocab, state))
                    if text in seen:
                        continue
                    seen.add(text)
                    made += 1
                    records.append({"id": f"authored:{kind}:{lang}:{polarity[:3]}:{made:05d}", "text": text,
                                    "lang": lang, "kinds": [kind] if polarity == "positive" else [], "spans": spans,
                                    "source": SOURCE, "licence": LICENCE, "label_quality": "authored",
                                    "weight": weight, "span_types": list(SPAN_TYPES),
                                    "note": f"{polarity}: {category}", "train_allowed": True})
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/recogniser_data/authored.jsonl"))
    parser.add_argument("--per-kind", type=int, default=600, help="positives per kind (and as many negatives)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--weight", type=float, default=0.5, help="each example's loss weight (the corpora's silver)")
    args = parser.parse_args(argv)
    records = generate(args.per_kind, args.seed, args.weight)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    counts = Counter(r["id"].rsplit(":", 1)[0] for r in records)
    print(f"{len(records)} examples -> {args.out}\n" + "\n".join(f"  {k} {n}" for k, n in counts.items()))


if __name__ == "__main__":
    main()
