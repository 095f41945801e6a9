"""Train the bundled n-gram tier model (src/ebmrag/evidence/models/tier_ngram.npz), the fallback where no tier rule
speaks.

Run: python bench/train_tier_model.py --data-root ../shared/data   (or `make tier-model`)

Training text: the external corpora in <data-root>/text_corpora (SOURCE.md there) and the typed fields of
AgentClinic MedQA and CMB-Clin, TUNE half only (`ebmrag.eval.halves`; the case sets split by case), with their
silver or gold labels mapped to tiers, plus the sentences below, written for ebmrag. The check halves, NEJM and
ADE-Corpus are never read for training or tuning. C, the CJK n-gram order and the T1 threshold are chosen by
3-fold cross-validation over the external corpora's tune half (folds by document).

The report (markdown on stdout) applies a model only where the rules are silent, exactly as
`TierClassifier.classify_many` does, on the CHECK half of each corpus and of AgentClinic MedQA + CMB-Clin (text
only), for rules alone and rules + the n-gram model (and, with --embedding-model, a model over sentence vectors).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
import timeit
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ebmrag.eval.halves import half_of
from ebmrag.eval.tier_agreement import MEASURED_SOURCES, labelled_case_texts
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, MODEL_T1_MIN, TierClassifier
from ebmrag.models.ngram_classifier import NgramFeatures, fit_ngram_classifier
from ebmrag.records.fragment import Tier, TierDecision
from ebmrag.vocab.lexicon import drug_mentions
from report import machine  # bench/ is on sys.path when a script here runs

NGRAM_MODEL = BUNDLED_TIER_MODEL.with_name("tier_ngram.npz")
COMMAND = "python bench/train_tier_model.py --data-root ../shared/data"
TIERS = [t.value for t in Tier]

WRITTEN_T1 = [
    "Sections from the resected colon show moderately differentiated adenocarcinoma invading the muscularis propria.",
    "Core samples of the breast lesion: invasive ductal carcinoma, grade 2, estrogen receptor positive.",
    "The lymph node aspirate contained sheets of atypical lymphoid cells.",
    "Marrow trephine: hypercellular with 40 % blasts.",
    "Skin punch specimen: interface dermatitis with necrotic keratinocytes.",
    "Renal specimen shows crescents in most glomeruli on light microscopy.",
    "Liver tissue: bridging fibrosis with interface hepatitis.",
    "Thyroid nodule aspirate, Bethesda category VI, papillary carcinoma.",
    "Gastric mucosa with signet ring cells infiltrating the lamina propria.",
    "Cervical cytology: high-grade squamous intraepithelial lesion.",
    "Whole-exome sequencing found a pathogenic variant in the MYH7 gene.",
    "Karyotype 47,XXY.",
    "A heterozygous factor V Leiden variant was detected.",
    "He developed hives and swelling of the lips twenty minutes after an amoxicillin dose.",
    "Her throat felt tight and her skin broke out in welts after the cefuroxime infusion.",
    "Anaphylactic shock after intravenous contrast in 2019, treated with epinephrine.",
    "Stevens-Johnson syndrome after starting carbamazepine two years ago.",
    "Allergic to sulfonamides: widespread blistering rash.",
    "患者输注头孢曲松后出现全身皮疹和喉头水肿。",
    "病理示中分化腺癌，侵及浆膜层。",
    "穿刺细胞学检查见大量异型细胞。",
    "基因检测发现BRCA1致病突变。",
    "免疫组化：CD20阳性，Ki-67约80%。",
    "Frozen section confirmed clear margins around the melanoma.",
    # added with the n-gram model: more specimen language, drug reactions told as stories, Chinese pathology
    "Microscopic description: nests of atypical squamous cells with keratin pearls.",
    "The excised nevus shows a compound melanocytic lesion with severe atypia.",
    "Endometrial curettings: complex atypical hyperplasia.",
    "Prostate needle cores: Gleason score 4 + 3 = 7 in 3 of 12 cores.",
    "Flow cytometry of the peripheral blood shows a monoclonal B-cell population.",
    "Molecular testing: EGFR exon 19 deletion detected; ALK rearrangement not detected.",
    "Chromosomal microarray shows a 22q11.2 deletion.",
    "She developed angioedema of the tongue on lisinopril, which was stopped.",
    "A diffuse maculopapular rash appeared a week after allopurinol was started.",
    "After the first dose of vancomycin he became flushed and itchy over the face and neck.",
    "Her INR rose to 9 after fluconazole was added to warfarin, with gum bleeding.",
    "术后病理：（左乳）浸润性导管癌，II级，脉管内见癌栓。",
    "胃镜活检病理提示低级别上皮内瘤变。",
    "骨髓细胞学检查：原始细胞占35%。",
    "服用卡马西平后出现全身大疱性皮疹，诊断为重症多形红斑。",
    "患者注射青霉素后出现胸闷、血压下降，考虑过敏性休克。",
]
WRITTEN_T2 = [
    "Hemoglobin 9.8 g/dL, white cell count 14,200 with 85 % neutrophils.",
    "Serum sodium 128 mmol/L and potassium 5.9 mmol/L.",
    "Chest radiograph shows a right lower lobe consolidation.",
    "CT of the abdomen demonstrated a 4 cm mass in the head of the pancreas.",
    "MRI of the brain: multiple periventricular white matter lesions.",
    "The electrocardiogram showed ST elevation in leads II, III and aVF.",
    "Urinalysis positive for nitrites and leukocyte esterase.",
    "Spirometry: FEV1/FVC ratio 0.62 after bronchodilator.",
    "血常规：白细胞12.5×10^9/L，中性粒细胞85%。",
    "腹部超声提示胆囊结石。",
    "心电图示窦性心动过速。",
    "肝功能：ALT 156 U/L，AST 98 U/L。",
]
WRITTEN_T3 = [
    "On examination she is pale and tachycardic with dry mucous membranes.",
    "Abdomen soft, tender in the right lower quadrant with guarding.",
    "Lungs: crackles at both bases, no wheeze.",
    "Heart: regular rate and rhythm, grade 2/6 systolic murmur at the apex.",
    "Temperature 38.9 °C, pulse 112, blood pressure 92/58 mmHg.",
    "Neurologic exam: power 4/5 in the left arm, sensation intact.",
    "查体：神志清，双肺呼吸音粗，未闻及干湿啰音。",
    "腹软，右下腹压痛阳性，无反跳痛。",
    "体温38.5℃，脉搏110次/分，血压90/60mmHg。",
]
WRITTEN_T4 = [
    "She says the pain started three days ago and gets worse after meals.",
    "He has smoked a pack a day for thirty years and drinks on weekends.",
    "Her mother had breast cancer at 45.",
    "He reports feeling tired and short of breath when climbing stairs.",
    "The patient was seen in clinic for follow-up of her diabetes.",
    "She lives alone and works as a teacher.",
    "患者3天前无明显诱因出现发热，伴咳嗽、咳痰。",
    "既往有高血压病史10年，规律服药。",
    "自述近一月体重下降约5公斤。",
]
WRITTEN = {"T1": WRITTEN_T1, "T2": WRITTEN_T2, "T3": WRITTEN_T3, "T4": WRITTEN_T4}


# --------------------------------------------------------------------------- the external corpora
@dataclass(frozen=True)
class Corpus:
    """One file of <data-root>/text_corpora: its items with a tier are training (tune half) and check examples.
    A null label is never taken as a negative (SOURCE.md): items without a tier are not read at all."""

    name: str
    file: str
    weight: float = 1.0
    keep: Callable[[dict[str, Any]], bool] = lambda item: True
    cap: int | None = None  # most training items per tier from this corpus (default: --cap)


def _affirmed_allergy(item: dict[str, Any]) -> bool:
    """Allergy-section lines that deny an allergy ('NKDA', 'None.') sit under a T1 header but are not T1."""
    return not item.get("allergy_negation_guess")


def _reaction_to_a_named_drug(item: dict[str, Any]) -> bool:
    """An adverse-reaction positive is T1 from its text only when the text names a drug (vocab/lexicon.py):
    'Had a headache too.' or a bare symptom list is a patient report. Such items are dropped, not made negatives."""
    return item["label"] != "T1" or bool(drug_mentions(item["text"]))


CORPORA = (
    Corpus("mtsamples", "mtsamples_sections_shared.jsonl", keep=_affirmed_allergy),  # section priors
    Corpus("mts-dialog", "mts_dialog_sections_shared.jsonl", keep=_affirmed_allergy),
    Corpus("aci-bench", "aci_bench_notes_shared.jsonl", keep=_affirmed_allergy),
    Corpus("chip-ctc", "zh_chip_ctc_criteria_shared.jsonl"),  # gold criterion categories, all four tiers
    Corpus("cehrner", "zh_cehrner_sentences_shared.jsonl"),  # T2 only: its nulls include pathology
    Corpus("cmedqaner", "zh_cmedqaner_shared.jsonl"),  # T4 only: patient questions (genre prior)
    Corpus("psytar", "psytar_sentences_shared.jsonl", keep=_reaction_to_a_named_drug),  # T1 (ADR, WD) + T4, reviews
    # BC5CDR (abstracts) and TAC 2017 (drug labels) are not read: their T1 is "a reaction is mentioned", and with
    # them the model called most sentences of a case report T1 (46 % of ADE-Corpus's no-reaction sentences).
    # Reactions are the ADR recogniser's (evidence/adr.py; its model reads BC5CDR).
)


@dataclass(frozen=True)
class Item:
    source: str
    group: str  # the document the item comes from: it decides the half and the fold
    text: str
    tier: str
    weight: float = 1.0


def _group(item_id: str) -> str:
    return ":".join(item_id.split(":")[:3])  # ebmrag.eval.halves.group_key, as SOURCE.md splits the corpora


def read_corpus(root: Path, corpus: Corpus, half: str) -> list[Item]:
    """The items of one half that carry a tier and pass the corpus's filter."""
    out = []
    with (root / corpus.file).open(encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            group = _group(raw["id"])
            if raw.get("label") in TIERS and half_of(group) == half and corpus.keep(raw):
                out.append(Item(corpus.name, group, raw["text"], raw["label"], corpus.weight))
    return out


def training_items(corpora: dict[str, list[Item]], cap: int, seed: int) -> list[Item]:
    """Tune-half items, at most `cap` (or the corpus's own cap) per (corpus, tier), plus the written sentences."""
    rng = random.Random(seed)
    caps = {c.name: c.cap or cap for c in CORPORA}
    chosen: list[Item] = []
    for name, items in corpora.items():
        for tier in TIERS:
            pool = [i for i in items if i.tier == tier]
            chosen += rng.sample(pool, caps[name]) if len(pool) > caps[name] else pool
    for tier, texts in WRITTEN.items():
        chosen += [Item("written", f"written:{tier}:{n}", text, tier, 2.0) for n, text in enumerate(texts)]
    return chosen


# --------------------------------------------------------------------------- rules first, a model where they are silent
class TierModel(Protocol):
    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]: ...


def decide(rules: Sequence[TierDecision | None], texts: Sequence[str], model: TierModel | None,
           t1_min: float = MODEL_T1_MIN, default: Tier = Tier.T4) -> list[str]:
    """TierClassifier.classify_many's merge, given the rule decisions: the model only where no rule speaks, and
    its T1 only at probability >= t1_min (else the default tier stands)."""
    tiers = [d.tier.value if d is not None else default.value for d in rules]
    silent = [i for i, d in enumerate(rules) if d is None]
    if model is not None and silent:
        for i, (label, p) in zip(silent, model.predict([texts[i] for i in silent]), strict=True):
            if label != Tier.T1.value or p >= t1_min:
                tiers[i] = label
    return tiers


def per_tier(gold: Sequence[str], got: Sequence[str], weights: Sequence[float] | None = None) -> dict[str, Any]:
    w = weights or [1.0] * len(gold)
    out: dict[str, Any] = {"agreement": sum(x for g, p, x in zip(gold, got, w, strict=True) if g == p) / sum(w)}
    for tier in TIERS:
        hit = sum(x for g, p, x in zip(gold, got, w, strict=True) if g == p == tier)
        predicted = sum(x for p, x in zip(got, w, strict=True) if p == tier)
        actual = sum(x for g, x in zip(gold, w, strict=True) if g == tier)
        precision, recall = hit / predicted if predicted else 0.0, hit / actual if actual else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[tier] = {"precision": precision, "recall": recall, "f1": f1, "support": sum(1 for g in gold if g == tier)}
    out["macro_f1"] = sum(out[t]["f1"] for t in TIERS if out[t]["support"]) / max(
        1, sum(1 for t in TIERS if out[t]["support"]))
    return out


def balanced_score(items: Sequence[Item], got: Sequence[str]) -> dict[str, Any]:
    """Scores with every corpus weighing its weight in total, whatever its size (no single corpus decides)."""
    sizes = Counter(i.source for i in items)
    return per_tier([i.tier for i in items], got, [i.weight / sizes[i.source] for i in items])


# --------------------------------------------------------------------------- tuning on the tune half
def fold_of(group: str, folds: int) -> int:
    return int(hashlib.sha256(f"ebmrag-tier-fold:{group}".encode()).hexdigest(), 16) % folds


def tune(train: list[Item], held: list[Item], rules: dict[str, TierDecision | None], grid_c: Sequence[float],
         grid_char: Sequence[int], thresholds: Sequence[float], scratch: Path, folds: int = 3,
         ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Out-of-fold rules + model on the labelled tune-half items, for each (C, char n-gram order, T1 threshold).
    `held` are all tune-half items (not only those sampled for training), each scored by the fit without its fold."""
    rows = []
    for char in grid_char:
        spec = NgramFeatures(char_ngrams=char)
        for c in grid_c:
            probs: dict[int, tuple[str, float]] = {}
            for fold in range(folds):
                fit = [i for i in train if fold_of(i.group, folds) != fold]
                model = fit_ngram_classifier([i.text for i in fit], [i.tier for i in fit], scratch, c, spec,
                                             [i.weight for i in fit])
                target = [n for n, i in enumerate(held) if fold_of(i.group, folds) == fold]
                silent = [n for n in target if rules[held[n].text] is None]
                probs.update(zip(silent, model.predict([held[n].text for n in silent]), strict=True))
            for t1_min in thresholds:
                got = []
                for n, item in enumerate(held):
                    decision = rules[item.text]
                    label, p = probs.get(n, ("T4", 1.0))
                    got.append(decision.tier.value if decision else label if label != "T1" or p >= t1_min else "T4")
                score = balanced_score(held, got)
                rows.append({"c": c, "char_ngrams": char, "t1_min": t1_min, "macro_f1": score["macro_f1"],
                             "agreement": score["agreement"], "t1_precision": score["T1"]["precision"],
                             "t1_recall": score["T1"]["recall"]})
    scratch.unlink(missing_ok=True)
    return rows, max(rows, key=lambda r: (r["macro_f1"], r["agreement"]))


# --------------------------------------------------------------------------- report
@dataclass(frozen=True)
class Config:
    name: str
    model: TierModel | None
    t1_min: float = MODEL_T1_MIN


def run(config: Config, classifier: TierClassifier, texts: Sequence[str]) -> tuple[list[str], float]:
    """Tiers and seconds per text for rules + model, rules recomputed (no store), in batches of 512."""
    tiers: list[str] = []
    start = time.perf_counter()
    for at in range(0, len(texts), 512):
        batch = texts[at:at + 512]
        tiers += decide(classifier.rule_decisions([(t, None) for t in batch]), batch, config.model, config.t1_min)
    return tiers, (time.perf_counter() - start) / max(1, len(texts))


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def tier_table(title: str, gold: Sequence[str], results: dict[str, list[str]]) -> list[str]:
    names = list(results)
    lines = [f"| {title} | support | " + " | ".join(f"{n} P / R" for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    scores = {n: per_tier(gold, got) for n, got in results.items()}
    for tier in TIERS:
        cells = [f"{pct(s[tier]['precision'])} / {pct(s[tier]['recall'])}" for s in scores.values()]
        lines.append(f"| {tier} | {next(iter(scores.values()))[tier]['support']} | " + " | ".join(cells) + " |")
    lines.append("| agreement | | " + " | ".join(f"**{pct(s['agreement'])} %**" for s in scores.values()) + " |")
    return lines


def report(args: argparse.Namespace) -> list[str]:
    root = args.data_root / "text_corpora"
    classifier = TierClassifier()
    tune_half = {c.name: read_corpus(root, c, "tune") for c in CORPORA}
    check_half = {c.name: read_corpus(root, c, "check") for c in CORPORA}
    cases = labelled_case_texts(args.data_root)
    train = training_items(tune_half, args.cap, args.seed) + [
        Item(f"{source} (tune half)", c.case, c.text, c.tier.value) for source in MEASURED_SOURCES
        for c in cases.get(source, []) if half_of(c.case) == "tune"]
    held = [i for items in tune_half.values() for i in items]
    lines = ["# Tier model: hashed n-grams where no rule speaks", "", f"Command: `{COMMAND}` (`make tier-model`)", "",
             "Training text: the TUNE half of each corpus in `text_corpora/` (SOURCE.md), labels as given there "
             f"(silver section priors or gold annotations mapped to tiers), at most {args.cap} items per corpus and "
             "tier, the typed fields of the TUNE half of AgentClinic MedQA and CMB-Clin (by case), "
             "plus sentences written for ebmrag. Their check halves, NEJM and ADE-Corpus are not read for training or "
             "tuning. Filters (training and check alike): allergy-section lines that deny an "
             "allergy are dropped; adverse-reaction positives (PsyTAR) only where the text names a drug; BC5CDR and "
             "TAC 2017 are not read (see CORPORA). Balanced classes; weight 2 for the written sentences.", "",
             "| corpus | T1 | T2 | T3 | T4 | all |", "|---|---|---|---|---|---|"]
    counts = Counter((i.source, i.tier) for i in train)
    sources = [*tune_half, *(f"{m} (tune half)" for m in MEASURED_SOURCES), "written"]
    for source in sources:
        row = [counts[(source, t)] for t in TIERS]
        lines.append(f"| {source} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    lines.append("| **all** | " + " | ".join(str(sum(counts[(s, t)] for s in sources)) for t in TIERS)
                 + f" | {len(train)} |")

    texts = sorted({i.text for i in held})
    rules = dict(zip(texts, classifier.rule_decisions([(t, None) for t in texts]), strict=True))
    spec_defaults = NgramFeatures()
    if args.no_tune:
        best: dict[str, Any] = {"c": args.c, "char_ngrams": spec_defaults.char_ngrams, "t1_min": MODEL_T1_MIN}
        rows: list[dict[str, Any]] = []
    else:
        rows, best = tune(train, held, rules, args.grid_c, args.grid_char, args.grid_t1,
                          args.out.with_suffix(".cv.npz"))
    spec = NgramFeatures(char_ngrams=int(best["char_ngrams"]))
    model = fit_ngram_classifier(
        [i.text for i in train], [i.tier for i in train], args.out, float(best["c"]), spec, [i.weight for i in train],
        {"trained_on": {s: sum(counts[(s, t)] for t in TIERS) for s in sources},
         "half": "tune", "t1_min_tuned": best["t1_min"], "command": COMMAND})
    size = args.out.stat().st_size
    lines += ["", f"Model: `{args.out.name}`, {size / 1024:.0f} KiB, {spec.buckets} buckets "
              f"({len(model.labels)} labels, {model.meta['kept_buckets']} buckets with a weight), "
              f"C = {best['c']}, CJK character n-grams 1..{spec.char_ngrams}, word n-grams 1..{spec.word_ngrams}."]
    if rows:
        lines += ["", "## Tuning (3-fold by document over the tune half; each corpus weighs 1)", "",
                  "| C | CJK n | T1 min | macro F1 | agreement | T1 P | T1 R |", "|---|---|---|---|---|---|---|"]
        shown = sorted(rows, key=lambda r: -r["macro_f1"])[:8]
        shown += [r for r in rows if r["t1_min"] == MODEL_T1_MIN and r["c"] == best["c"]
                  and r["char_ngrams"] == best["char_ngrams"] and r not in shown]
        lines += [f"| {r['c']} | {r['char_ngrams']} | {r['t1_min']} | {pct(r['macro_f1'])} | {pct(r['agreement'])} | "
                  f"{pct(r['t1_precision'])} | {pct(r['t1_recall'])} |" for r in shown]
        lines.append(f"\nChosen: C = {best['c']}, CJK n = {best['char_ngrams']}, T1 threshold {best['t1_min']} "
                     f"(TierClassifier uses MODEL_T1_MIN = {MODEL_T1_MIN}; the meta keeps `t1_min_tuned`).")

    configs = [Config("rules", None)]
    if args.embedding_model:
        from ebmrag.models.embeddings import SentenceEmbedder
        from ebmrag.models.text_classifier import LinearTextClassifier

        configs.append(Config("rules+embedding", LinearTextClassifier(args.embedding_model, SentenceEmbedder())))
    configs.append(Config("rules+ngram", model))
    if best["t1_min"] != MODEL_T1_MIN:
        configs.append(Config(f"rules+ngram T1≥{best['t1_min']}", model, float(best["t1_min"])))

    lines += ["", "## Check half of the external corpora (labels as given; silver priors are not truth)", "",
              "| corpus | items | silent | " + " | ".join(c.name for c in configs) + " |",
              "|---|---|---|" + "---|" * len(configs)]
    pooled_gold: list[str] = []
    pooled: dict[str, list[str]] = {c.name: [] for c in configs}
    for name, items in check_half.items():
        gold = [i.tier for i in items]
        silent = sum(d is None for d in classifier.rule_decisions([(i.text, None) for i in items]))
        cells = []
        for config in configs:
            got, _ = run(config, classifier, [i.text for i in items])
            pooled[config.name] += got
            cells.append(pct(per_tier(gold, got)["agreement"]))
        pooled_gold += gold
        lines.append(f"| {name} | {len(items)} | {silent} | " + " | ".join(cells) + " |")
    lines += ["", *tier_table("check half, pooled", pooled_gold, pooled)]

    evaluation = {source: [(c.tier, c.text) for c in items if source not in MEASURED_SOURCES
                           or half_of(c.case) == "check"] for source, items in cases.items()}
    lines += ["", "## AgentClinic MedQA + CMB-Clin CHECK half (and all of NEJM), text only, never trained on", "",
              "| source | fragments | silent | " + " | ".join(c.name for c in configs) + " |",
              "|---|---|---|" + "---|" * len(configs)]
    measured_gold: list[str] = []
    measured_texts: list[str] = []
    measured: dict[str, list[str]] = {c.name: [] for c in configs}
    seconds: dict[str, float] = {}
    for source in [*MEASURED_SOURCES, "agentclinic-nejm"]:
        entries = evaluation.get(source, [])
        gold, texts_ = [str(e[0].value) for e in entries], [str(e[1]) for e in entries]
        silent = sum(d is None for d in classifier.rule_decisions([(t, None) for t in texts_]))
        cells = []
        for config in configs:
            got, _ = run(config, classifier, texts_)
            cells.append(pct(per_tier(gold, got)["agreement"]) if gold else "-")
            if source in MEASURED_SOURCES:
                measured[config.name] += got
        if source in MEASURED_SOURCES:
            measured_gold += gold
            measured_texts += texts_
        label = source if source in MEASURED_SOURCES else f"{source} (not pooled)"
        lines.append(f"| {label} | {len(entries)} | {silent} | " + " | ".join(cells) + " |")
    lines += ["", *tier_table("MedQA + CMB-Clin, pooled", measured_gold, measured)]

    for config in configs:  # timed after a first pass (all warm), best of 3 (the embedder: 1, its memory cleared)
        embedder = getattr(config.model, "embedder", None)
        if embedder is not None and hasattr(embedder, "_memory"):
            embedder._memory.clear()
        seconds[config.name] = min(run(config, classifier, measured_texts)[1] for _ in range(1 if embedder else 3))
    sentence = ("The patient reports that the pain began three days ago in the lower back and has been getting "
                "worse since then despite rest and ibuprofen taken twice a day.")
    per_call = min(timeit.repeat(lambda: model.predict([sentence]), number=2000, repeat=5)) / 2000
    silent_texts = [t for t, d in zip(measured_texts, classifier.rule_decisions([(t, None) for t in measured_texts]),
                                      strict=True) if d is None]
    batch_time = min(timeit.repeat(lambda: model.predict(silent_texts), number=3, repeat=3)) / 3
    chars = sum(map(len, measured_texts)) / max(1, len(measured_texts))
    lines += ["", "## Time per fragment (MedQA + CMB-Clin texts, rules recomputed, CPU)", "",
              f"{machine()}; load average {os.getloadavg()[0]:.1f} at the end. {len(measured_texts)} fragments "
              f"of {chars:.0f} characters on average.", "",
              "| configuration | µs per fragment |", "|---|---|",
              *(f"| {name} | {1e6 * s:.0f} |" for name, s in seconds.items()), "",
              f"n-gram model alone: {1e6 * per_call:.1f} µs for one {len(sentence.split())}-word sentence "
              f"(`predict([text])`), {1e6 * batch_time / max(1, len(silent_texts)):.1f} µs per text in one batch of "
              f"the {len(silent_texts)} rule-silent fragments."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=NGRAM_MODEL)
    parser.add_argument("--cap", type=int, default=1000, help="most training items per corpus and tier")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--c", type=float, default=1.0, help="C when --no-tune")
    parser.add_argument("--grid-c", type=float, nargs="+", default=[4.0, 8.0, 16.0, 32.0, 64.0])
    parser.add_argument("--grid-char", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--grid-t1", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95])
    parser.add_argument("--no-tune", action="store_true", help="fit once with --c and the default features")
    parser.add_argument("--embedding-model", type=Path, default=None,
                        help="also score a linear model over sentence embeddings (an .npz of models.text_classifier)")
    args = parser.parse_args()
    print("\n".join(report(args)))


if __name__ == "__main__":
    main()
