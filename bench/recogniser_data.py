"""Build the training and evaluation examples of the critical-fact recogniser (issue 45) from the licensed corpora.

    python bench/recogniser_data.py [--data-root ../shared/data] [--out build/recogniser_data] \\
        [--card docs/recogniser_data.md]

Writes `train.jsonl`, `dev.jsonl` (10 % of the tune half's groups, by hash) and `check.jsonl` (the check half, to be
reported once) from ../shared/data/text_corpora, and `ade_eval.jsonl` from ADE-Corpus-V2, which states no licence:
its lines carry `"train_allowed": false` and never enter train or dev. One example a line:

    {"id", "text", "lang", "kinds": [allergy | adr | pathology | genetic | critical_result],
     "spans": [{"start", "end", "type": DRUG | REACTION | GENE | VARIANT | ANALYTE | VALUE}],
     "source", "licence", "label_quality": gold | silver | weak, "weight",
     "span_types": the types this example's source marks wherever they occur (a type not listed is unknown here,
                   not absent), "note", "train_allowed"}

Why a builder of its own: no corpus annotates "a critical fact of this patient". Each says something narrower (a
reaction mention in a drug label, a document-level chemical-induced disease, a note section), so each is mapped by a
rule that says what its annotation means (docs/recogniser_data.md justifies each). An item whose label the rules
cannot trust is left out as unknown, with its reason counted, rather than made a negative: a section prior is not a
per-sentence truth, and a missed allergy taught as "nothing here" is the one error tiering must never learn.

Two weak layers run on every kept example: the result recogniser (evidence.results) adds ANALYTE and VALUE spans and,
beyond a critical limit, the kind critical_result; the genetic detector (vocab.genes, when present) adds GENE and
VARIANT spans and the kind genetic. Deterministic (input order, hashes, no randomness) and streaming, one document at
a time; the summary is printed and, given --card, written into the card between its markers.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from rich.progress import Progress

from ebmrag.eval.halves import half_of
from ebmrag.eval.labelled_tiers import parse_item
from ebmrag.evidence.adr import reaction_spans
from ebmrag.evidence.result_tables import DEFAULT_ANALYTES_PATH, DEFAULT_CRITICAL_PATH, read_result_tables
from ebmrag.evidence.results import ResultMention, result_mentions
from ebmrag.vocab.lexicon import drug_mentions
from report import emit

log = logging.getLogger("recogniser_data")

KINDS = ("allergy", "adr", "pathology", "genetic", "critical_result")
SPAN_TYPES = ("DRUG", "REACTION", "GENE", "VARIANT", "ANALYTE", "VALUE")
QUALITIES = ("gold", "silver", "weak")
SPLITS = ("train", "dev", "check")
DEV_SHARE = 10  # percent of the tune half's groups held out as dev

# Weights: how far an example's label is from "a critical fact of this patient, as a chart writes it". Gold
# patient-level sentences count fully; a domain the chart never speaks (drug labels, trial criteria) or a label
# inferred from a document or a section counts less; a label from our own rules least.
GOLD_PATIENT = 1.0  # PsyTAR: first-person, sentence-level gold
DRUG_LABEL = 0.5  # TAC 2017: gold mentions, population-level prose
DRUG_LABEL_NEGATED = 0.3  # TAC 2017: a reaction the sentence negates or puts in animals
CID_HUMAN = 0.7  # BC5CDR: a CID pair in a sentence of an abstract about people
CID_ANIMAL_DOC = 0.35  # BC5CDR: the same in an abstract that also reports animal or in-vitro work
CID_NONE = 0.5  # BC5CDR: one of chemical or disease alone
CID_OTHER_PAIR = 0.3  # BC5CDR: chemical and disease together but not a CID pair (CID marks the specific term only)
SECTION = 0.6  # note sections: the allergy section
SECTION_OTHER = 0.5  # note sections: pathology, and the T2-T4 negatives
CRITERIA = 0.5  # CHIP-CTC: gold categories of trial criteria, not statements about a patient
WEAK = 0.3  # labels from our own rules (a weak layer, a concept rule, a null item taken as a negative)


@dataclass(frozen=True)
class Corpus:
    file: str  # in text_corpora/
    name: str  # the example's "source" (the corpus's own, which train_recogniser.py keys on)
    licence: str  # SPDX identifier where there is one
    repo: str
    commit: str  # of the upstream snapshot, as SOURCE.md states it
    spans: tuple[str, ...] = ()  # span types the corpus marks wherever they occur


CHINESE_BLUE = ("alibaba-research/ChineseBLUE", "52eefc9d5cb1839348546c8a473c633d4d9d60a8")
CORPORA = (
    Corpus("tac2017_adr_label_sentences_shared.jsonl", "tac2017-spl-adr", "CC0-1.0", "tatonetti-lab/onsides-task1",
           "0de03581ef9e31d2978a22236af2545b10fff4c8", ("REACTION",)),
    Corpus("bc5cdr_cid_sentences_shared.jsonl", "bc5cdr", "public-domain (NLM, US Government work)",
           "cryptoradon/biomedRelExt", "3f113ff1aefd03b7ecf053a6bc33cc6a75532f20", ("DRUG", "REACTION")),
    Corpus("psytar_sentences_shared.jsonl", "psytar", "CC-BY-4.0", "basaldella/psytarpreprocessor",
           "dce7fd9fc91930dd9de0f4793529d5695a10e681"),
    Corpus("mtsamples_sections_shared.jsonl", "mtsamples", "CC0-1.0 (Kaggle export; credit mtsamples.com)",
           "kdpsingh/clinspacy", "2efc73a3dbd152cb57aa65e263ae37310e068c61"),
    Corpus("mts_dialog_sections_shared.jsonl", "mts-dialog", "CC-BY-4.0", "abachaa/MTS-Dialog",
           "3ff0801933608d6f570468c13125125fb5cabdea"),
    Corpus("aci_bench_notes_shared.jsonl", "aci-bench", "CC-BY-4.0",
           "microsoft/clinical_visit_note_summarization_corpus", "293e454917c562361409232f65e9d870a45af026"),
    Corpus("zh_chip_ctc_criteria_shared.jsonl", "chineseblue-cmedtc(chip-ctc)", "Apache-2.0", *CHINESE_BLUE),
    Corpus("zh_cehrner_sentences_shared.jsonl", "chineseblue-cehrner", "Apache-2.0", *CHINESE_BLUE,
           ("DRUG", "ANALYTE")),
    Corpus("zh_cmedqaner_shared.jsonl", "chineseblue-cmedqaner", "Apache-2.0", *CHINESE_BLUE, ("DRUG",)),
)
ADE = Corpus("ade_corpus_v2_shared.jsonl", "ade-corpus-v2", "none stated (citation requested): evaluation only",
             "trunghlt/AdverseDrugReaction", "2851af96e26050cf551a2e1f716ff861f7b1059b", ("DRUG", "REACTION"))


# --------------------------------------------------------------------------- labels
@dataclass(frozen=True)
class Span:
    start: int
    end: int
    type: str


@dataclass(frozen=True)
class Label:
    """What a corpus's annotation says of one item once mapped: kinds, spans, how good and how much it counts, or
    (`unknown` non-empty) why it is left out."""

    kinds: frozenset[str] = frozenset()
    spans: tuple[Span, ...] = ()
    quality: str = "gold"
    weight: float = 1.0
    note: str = ""
    unknown: str = ""

    def weakened(self, kind: str) -> Label:
        """This label with a kind added by a weak rule: weak as a whole, and weighted as such."""
        return replace(self, kinds=self.kinds | {kind}, quality="weak", weight=min(self.weight, WEAK))


def unknown(reason: str) -> Label:
    return Label(unknown=reason)


def negative(quality: str, weight: float, note: str = "") -> Label:
    return Label(frozenset(), (), quality, weight, note)


Item = Mapping[str, Any]


def gold_spans(item: Item, mapping: Mapping[str, str]) -> tuple[Span, ...]:
    """The item's spans of the types `mapping` names, renamed; a span whose text is not at its offsets is skipped."""
    text, found = item["text"], []
    for span in item.get("spans") or []:
        kind = mapping.get(span.get("type", ""))
        if kind and text[span["start"]:span["end"]] == span.get("text", text[span["start"]:span["end"]]):
            found.append(Span(span["start"], span["end"], kind))
    return tuple(found)


def detail(item: Item) -> Mapping[str, Any]:
    value = item.get("label_detail")
    return value if isinstance(value, dict) else {}


# --------------------------------------------------------------------------- concept rules (English)
_I = re.IGNORECASE
_ANIMAL = re.compile(r"\b(rats?|mice|mouse|murine|rabbits?|dogs?|canine|monkeys?|primates?|guinea[- ]pigs?|"
                     r"hamsters?|pigs?|swine|sheep|rodents?|animals?|in vitro|cultured|cell lines?|zebrafish|"
                     r"baboons?|ferrets?)\b", _I)
_NEGATION_CUES = frozenset({"no", "not", "none", "without", "neither", "nor", "never", "absence", "absent", "negative",
                            "did not", "was not", "were not", "no evidence"})
_TABLE_COLUMNS = re.compile(r"[A-Za-z)\]]\s{2,}[<>≤≥]?\d|\d\s*\(\s*[<>]?\s*\d+(?:\.\d+)?\s*%?\s*\)|\d+/\d+\s*\(")
_NUMBER = re.compile(r"(?<![A-Za-z])[<>≤≥]?\d+(?:\.\d+)?")
_PROSE = re.compile(r"\b(was|were|is|are|has|have|had|occurred|reported|observed|developed|experienced|"
                    r"included?)\b", _I)
_ALLERGY_WORD = re.compile(r"allerg|anaphyla|\bnk[dm]?a\b|hypersensitiv|intoleran", _I)
_EVENT = re.compile(r"allerg|anaphyla|hives|urticaria|\brash|angioedema|reaction|intoleran|side[- ]effect|adverse|"
                    r"toxicit|-induced|\binduced|overdos|hypersensitiv|swelling|itch|prurit|blister|wheez|"
                    r"\bcaus(?:ed|es|ing)\b|\bdevelop(?:ed|s|ing)?\b|\bafter (?:taking|starting|receiving|being given)",
                    _I)
_MALIGNANCY = re.compile(r"carcinoma|cancer|lymphoma|sarcoma|melanoma|malignan|tumou?r|neoplas|leuka?emia|myeloma|"
                         r"glioma|blastoma|mesothelioma|seminoma|metasta", _I)
_STAGE = re.compile(r"\bstage\b|\bgrade\b|\bgleason\b|\bfigo\b|\b[pcy]?T[0-4][a-c]?N[0-3x]|\bN[0-3]M[01x]|"
                    r"differentiated|\bmetasta|\bclark level|\bbreslow", _I)
_PATHOLOGY_EN = re.compile(r"(biops|patholog|cytolog|histolog|immunohisto|frozen section|specimen|resection|excision|"
                           r"aspirat)\w*[^.;]{0,80}?\b(show|reveal|demonstrat|consistent with|confirm|diagnos|positive|"
                           r"negative|carcinoma|malignan|benign|dysplasia|atypi)", _I)
_GENE_VARIANT = re.compile(r"\b(?:[A-Z][A-Z0-9]{1,6}\d[A-Z0-9]*|HER-?2|HLA-[A-Z]+\*?[\d:]*|BRCA|EGFR|KRAS|BRAF|ALK|"
                           r"CYP\w+)\b[^.;]{0,40}?\b(mutat|variant|polymorph|deletion|amplif|rearrang|fusion|"
                           r"positive|negative|carrier|homozyg|heterozyg|wild[- ]type|allele|genotyp|\*\d)", _I)
_PANIC = re.compile(r"\bcritical(?:ly)?\b|\bpanic\b", _I)

_LEAK = re.compile(r"^\W*(?:current\s+)?(?:medications?|physical exam(?:ination)?|review of systems|social history|"
                   r"family history|past (?:medical|surgical) history|vital signs|plan|assessment|impression)\b"
                   r"[\s,:.\d]*$", _I)
_DOSE = re.compile(r"\b\d+(?:\.\d+)?\s*(?:mg|mcg|g|units?|ml|meq|%)\b|\b(?:p\.o\.|b\.i\.d\.|t\.i\.d\.|q\.i\.d\.|"
                   r"p\.r\.n\.|q\.d\.|daily|nightly|subcutaneous)", _I)
_DENIAL_EN = re.compile(
    r"^\W*(?:none|none known|nil|negative|nka|nkda|nkma|no|unknown|not known)\W*$"
    r"|\bnk[dm]?a\b"
    r"|\bno\s+(?:known\s+)?(?:(?:drug|medication|medicine|medical|food|environmental|seasonal)\s+)?allerg"
    r"|\bdenie[sd]\b[^.;]*\ballerg"
    r"|\ballerg\w*\s+(?:to\s+\w+\s+)?(?:per\s+chart\s+)?(?:are|is|:)\s+(?:none|negative|nil)\b"
    r"|^\W*to\s+(?:medicines|medications|drugs)\s+(?:per\s+chart\s+)?(?:are|is)\s+none"
    r"|\bnot\s+(?:known\s+to\s+be\s+)?allergic\b"
    r"|\bno\s+(?:history\s+of\s+)?(?:any\s+)?allerg", _I)
_CONTRAST_EN = re.compile(r"\b(?:but|however|except|although|other than|apart from)\b|;", _I)
_SEASONAL = re.compile(r"\b(?:seasonal|hay fever|environmental|pollens?|dust|grass|ragweed|dander|mold)\b", _I)
_SUBSTANCE = re.compile(r"\b(?:latex|adhesives?|tape|dyes?|contrast|iodine|shellfish|shrimp|sea ?food|fish|peanuts?|"
                        r"nuts?|eggs?|milk|bees?|wasps?|stings?|bandages?|betadine|nickel|strawberr\w*|foods?)\b", _I)
_REFERENCE = re.compile(r"\b(?:refer|see|chart|listed|as above|mentioned|nonsignificant|unable|unobtainable)\b", _I)
_WORDS = re.compile(r"[A-Za-z]+")
_NEGATED_START = re.compile(r"^\W*(?:no|not|denies|negative)\b", _I)


@lru_cache(maxsize=4096)
def drugs_in(text: str) -> tuple[str, ...]:
    return tuple(drug_mentions(text))


@lru_cache(maxsize=4096)
def results_in(text: str) -> tuple[ResultMention, ...]:
    return tuple(result_mentions(text))


def table_row(text: str) -> bool:
    """A drug label's table row ("Nasopharyngitis   4 (2%)   2 (1%)"): numbers in columns and no sentence verb."""
    return bool(_TABLE_COLUMNS.search(text)) and len(_NUMBER.findall(text)) >= 2 and not _PROSE.search(text)


def drug_with_event(text: str) -> bool:
    """A drug named together with a reaction or clinical-event word: a drug reaction a section prior can hide."""
    if not drugs_in(text):
        return False
    return bool(_EVENT.search(text)) or bool(reaction_spans(unicodedata.normalize("NFKC", text).lower()))


def result_state(text: str) -> str:
    """"critical", "clear" (every value read and none critical), "undecided" (some value the recogniser cannot put
    in a unit) or "" (no result)."""
    mentions = results_in(text)
    if not mentions:
        return ""
    if any(m.critical for m in mentions):
        return "critical"
    return "undecided" if any(m.canonical_value is None for m in mentions) else "clear"


def possible_critical_en(text: str) -> str:
    """Why an English sentence a section prior calls T2-T4 may still state a critical fact ("" when nothing does)."""
    if _ALLERGY_WORD.search(text):
        return "allergy word outside an allergy section"
    if drug_with_event(text):
        return "drug with a reaction or clinical-event word"
    if _MALIGNANCY.search(text) and _STAGE.search(text):
        return "malignancy with a stage or grade"
    if _PATHOLOGY_EN.search(text):
        return "pathology statement outside a pathology section"
    if _GENE_VARIANT.search(text) and not gene_mentions_of(text):
        return "gene with a variant the genetic detector does not read"
    if result_state(text) == "undecided":
        return "analyte with a value whose criticality cannot be judged"
    if _PANIC.search(text) and not result_state(text):
        return "critical or panic wording without a value"
    return ""


def allergy_status_en(text: str) -> tuple[str, str]:
    """("allergy" | "denial" | "unknown", why) for an item of a note's allergy section.

    A denial is an allergy status stated as none (NKDA, "no known drug allergies", "denies allergies", "None.") or a
    named allergy denied ("denies shrimp allergy"); a denial followed by a contrast is read by what follows it
    ("no drug allergies, but latex"). The section leaks (a medication list or the next header after a missed line
    break), and some items refer elsewhere ("Refer to chart."): those are unknown, not negatives."""
    if _LEAK.search(text) or _DOSE.search(text):
        return "unknown", "another section's text (header or medication list)"
    if _DENIAL_EN.search(text):
        contrast = _CONTRAST_EN.search(text)
        rest = text[contrast.end():] if contrast else ""
        if not rest.strip() or _DENIAL_EN.search(rest):
            return "denial", "allergy status denied"
        text = rest
    if _SEASONAL.search(text) and not drugs_in(text):
        return "unknown", "seasonal or environmental allergy only"
    if drugs_in(text) or _SUBSTANCE.search(text) or _ALLERGY_WORD.search(text) or _EVENT.search(text):
        return "allergy", ""
    if _REFERENCE.search(text) or len(_WORDS.findall(text)) > 8:
        return "unknown", "no allergen named (a reference elsewhere or prose)"
    if _NEGATED_START.search(text):
        return "unknown", "a negated finding, not an allergy status"
    return "allergy", "short allergen list, name not in the drug lexicon"


# --------------------------------------------------------------------------- concept rules (Chinese)
_DENIAL_ZH = re.compile(r"(?:无|否认|没有|未发现|未见|未有)[^，,。；;]{0,8}过敏")
_CONTRAST_ZH = re.compile(r"但|然而|除")
_PATHOLOGY_ZH = re.compile(r"(?:病理(?!性)|活检|免疫组化|细胞学|冰冻)[^。；;]{0,12}?"
                           r"(?:示|提示|显示|回报|报告|结果|诊断|检查|为|见|:|：|\()"
                           r"|免疫组化[^。]{0,40}\([+-]")
_MALIGNANCY_ZH = re.compile(r"癌|瘤|白血病|恶性")
_STAGE_ZH = re.compile(r"分化|期|级|浸润|转移|侵犯|侵及")
_GENE_ZH = re.compile(r"基因|突变|融合|扩增|野生型|her-?2|egfr|kras|braf|alk|ros1|brca", _I)
_TAKEN_THEN_ZH = re.compile(r"(?:服用|口服|吃了?|用了?|用药|打了?|注射|输液|静滴|换了?)"
                            r"[^，,。？！]{0,12}(?:后|以后|之后)")
_RECEPTOR = re.compile(r"受体|基因|突变|融合|扩增|表达|HER-?2|\bER\b|\bPR\b|EGFR|ALK|ROS1|KRAS|BRAF|PD-?L1|BRCA", _I)


def possible_critical_zh(text: str, drug: bool, symptom: bool) -> str:
    """Why a Chinese sentence with no label of its own may still state a critical fact ("" when nothing does)."""
    if "过敏" in text:
        return "allergy word (the corpus has no allergy tag)"
    if drug and symptom:
        return "drug and symptom together (a reaction the corpus does not link)"
    if _TAKEN_THEN_ZH.search(text):
        return "a drug taken, then an event"
    if _MALIGNANCY_ZH.search(text) and _STAGE_ZH.search(text):
        return "malignancy with a stage, grade or spread"
    if _GENE_ZH.search(text) and not gene_mentions_of(text):
        return "gene word the genetic detector does not read"
    if result_state(text) == "undecided":
        return "analyte with a value whose criticality cannot be judged"
    return ""


def allergy_status_zh(text: str) -> str:
    """"denial" for a criterion or sentence that states no allergy ("无过敏史", "否认药物过敏史") and holds no
    contrast ("有过敏史，但不包括无症状的季节性过敏" states an allergy), else "allergy"."""
    return "denial" if _DENIAL_ZH.search(text) and not _CONTRAST_ZH.search(text) else "allergy"


# --------------------------------------------------------------------------- per corpus
def tac2017(item: Item, _doc: Sequence[Item]) -> Label:
    """AdverseReaction mentions in FDA label prose: a reaction is named, but of a population, not a patient."""
    text, info = item["text"], detail(item)
    spans = gold_spans(item, {"AdverseReaction": "REACTION", "DrugClass": "DRUG"})
    if table_row(text):
        return unknown("table row (a term and its rates, no statement)")
    if item.get("label") != "T1":
        return replace(negative("gold", DRUG_LABEL), spans=spans)
    if not info.get("has_negation_or_hypothetical_or_animal"):
        return Label(frozenset({"adr"}), spans, "gold", DRUG_LABEL)
    cues = {s.get("text", "").lower() for s in item.get("spans") or [] if s.get("type") == "Negation"}
    animal = any(s.get("type") == "Animal" for s in item.get("spans") or [])
    if animal or cues & _NEGATION_CUES:
        return replace(negative("gold", DRUG_LABEL_NEGATED, "reaction negated or in animals"), spans=spans)
    return unknown("hypothetical, or a negation cue of unclear scope")


def bc5cdr(item: Item, doc: Sequence[Item]) -> Label:
    """Chemical-induced disease pairs, annotated per abstract: a sentence with both ends of a pair most likely states
    it; a sentence naming a disease the abstract links to a drug elsewhere may state it by anaphora."""
    text, info = item["text"], detail(item)
    pairs = {(c, d) for c, d in info.get("cid_pairs") or []}
    reactions = {d for _, d in pairs}
    spans = gold_spans(item, {"Chemical": "DRUG"}) + tuple(
        Span(s["start"], s["end"], "REACTION") for s in item.get("spans") or []
        if s.get("type") == "Disease" and s.get("mesh") in reactions and text[s["start"]:s["end"]] == s.get("text"))
    if pairs:
        if _ANIMAL.search(text):
            return unknown("animal or in-vitro sentence")
        weight = CID_ANIMAL_DOC if info.get("doc_mentions_animals") else CID_HUMAN
        return Label(frozenset({"adr"}), spans, "silver", weight)
    linked = {d for other in doc for _, d in detail(other).get("cid_pairs") or []}
    if any(s.get("type") == "Disease" and s.get("mesh") in linked for s in item.get("spans") or []):
        return unknown("names a disease the abstract links to a drug elsewhere")
    weight = CID_OTHER_PAIR if info.get("subtype") == "no_cid_pair" else CID_NONE
    return replace(negative("silver", weight), spans=spans)


def psytar(item: Item, _doc: Sequence[Item]) -> Label:
    """Sentence-level gold flags of patients' drug reviews: ADR and WD (withdrawal) are reactions; effectiveness,
    symptoms and indications (EF, INF, SSI, DI) are the hard negatives (a drug with an effect is no reaction)."""
    flags = detail(item).get("psytar") or {}
    if flags.get("ADR") or flags.get("WD"):
        return Label(frozenset({"adr"}), (), "gold", GOLD_PATIENT)
    hard = [name for name in ("EF", "INF", "SSI", "DI") if flags.get(name)]
    return negative("gold", GOLD_PATIENT, "hard negative: " + "+".join(hard) if hard else "")


def notes(item: Item, _doc: Sequence[Item]) -> Label:
    """Note sections (MTSamples, MTS-Dialog, ACI-Bench): the section is a prior. Allergy items are read by the
    allergy-status rule; pathology items are pathology; T2-T4 items are negatives unless a concept rule sees a
    possible critical fact in them; items of no tier (plan, medications, narrative) are left out."""
    text, subtype, tier = item["text"], detail(item).get("subtype"), item.get("label")
    if subtype == "allergy":
        status, why = allergy_status_en(text)
        if status == "unknown":
            return unknown(f"allergy section: {why}")
        if status == "denial":
            return negative("silver", SECTION, why)
        return Label(frozenset({"allergy"}), (), "silver", SECTION, why)
    if subtype == "pathology_or_molecular":
        return Label(frozenset({"pathology"}), (), "silver", SECTION_OTHER)
    if subtype == "adr":
        return Label(frozenset({"adr"}), (), "silver", SECTION_OTHER)
    if tier in ("T2", "T3", "T4"):
        reason = possible_critical_en(text)
        return unknown(f"section prior {tier}, {reason}") if reason else negative("silver", SECTION_OTHER)
    return unknown("section gives no tier (plan, medications, narrative)")


_CTC_NEGATIVE = frozenset({"Life Expectancy", "Device", "Blood Donation", "Healthy", "Nursing", "Disabilities"})


def chip_ctc(item: Item, _doc: Sequence[Item]) -> Label:
    """Gold categories of Chinese trial criteria: criteria language ("已知对XX过敏者"), so a lower weight."""
    text, info = item["text"], detail(item)
    category, tier = info.get("ctc_category", ""), item.get("label")
    if category == "Allergy Intolerance":
        if allergy_status_zh(text) == "denial":
            return negative("gold", CRITERIA, "allergy status denied")
        return Label(frozenset({"allergy"}), (), "gold", CRITERIA)
    if category == "Receptor Status":
        if _RECEPTOR.search(text):
            return Label(frozenset({"genetic"}), (), "gold", CRITERIA)
        return unknown("receptor category, no receptor or gene named")
    if category == "Laboratory Examinations" or tier in ("T3", "T4") or category in _CTC_NEGATIVE:
        return negative("gold", CRITERIA)
    if category == "Diagnostic":
        return unknown("diagnostic criteria mix imaging, endoscopy and pathology")
    return unknown(f"category {category or '(none)'} says neither way")


def cehrner(item: Item, _doc: Sequence[Item]) -> Label:
    """Chinese EHR sentences with NER spans but no allergy, pathology or reaction tags: 药物 is DRUG, 实验室检验 is
    ANALYTE; pathology is found by a concept rule (weak); the rest are negatives only when no rule sees a
    possible critical fact (the corpus's null is not a negative)."""
    text = item["text"]
    spans = gold_spans(item, {"药物": "DRUG", "实验室检验": "ANALYTE"})
    types = {s.get("type") for s in item.get("spans") or []}
    if _PATHOLOGY_ZH.search(text):
        return Label(frozenset({"pathology"}), spans, "weak", WEAK, "pathology statement (concept rule)")
    reason = possible_critical_zh(text, "药物" in types, "症状" in types)
    if reason:
        return unknown(reason)
    return replace(negative("weak", WEAK), spans=spans)


def cmedqaner(item: Item, _doc: Sequence[Item]) -> Label:
    """Patients' online questions with NER spans: drug is DRUG; a symptom is not a REACTION unless linked, and
    nothing links them, so a question naming both is left out."""
    types = {s.get("type") for s in item.get("spans") or []}
    reason = possible_critical_zh(item["text"], "drug" in types, "symptom" in types)
    if reason:
        return unknown(reason)
    return replace(negative("weak", WEAK), spans=gold_spans(item, {"drug": "DRUG"}))


MAPPERS: dict[str, Callable[[Item, Sequence[Item]], Label]] = {
    "tac2017-spl-adr": tac2017, "bc5cdr": bc5cdr, "psytar": psytar, "mtsamples": notes, "mts-dialog": notes,
    "aci-bench": notes, "chineseblue-cmedtc(chip-ctc)": chip_ctc, "chineseblue-cehrner": cehrner,
    "chineseblue-cmedqaner": cmedqaner,
}


# --------------------------------------------------------------------------- weak layers
@lru_cache(maxsize=1)
def genes_module() -> ModuleType | None:
    """vocab.genes when it exists (another change adds it); without it the genetic layer is skipped."""
    if importlib.util.find_spec("ebmrag.vocab.genes") is None:
        return None
    return importlib.import_module("ebmrag.vocab.genes")


@lru_cache(maxsize=4096)
def gene_mentions_of(text: str) -> tuple[Any, ...]:
    module = genes_module()
    return tuple(module.gene_mentions(text)) if module is not None else ()


_GENE_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*")


def gene_spans(text: str, mention: Any) -> list[Span]:
    """GENE over the gene as written inside the mention (its symbol, or a form the vocabulary reads as it); VARIANT
    over each run of the variant's words as the text writes them ("G551D", "mutation-positive", "homozygous"), not
    the words between them ("in the", "or were")."""
    start, end = int(mention.start), int(mention.end)
    module = genes_module()
    gene = None
    if mention.gene and module is not None:
        reads = module.vocabulary().gene
        gene = next((m.span() for m in _GENE_TOKEN.finditer(text, start, end)
                     if m.group() == mention.gene or m.group().upper() == str(mention.gene).upper()
                     or reads(m.group()) == mention.gene), None)
    words: list[tuple[int, int]] = []
    cursor = start
    for word in str(mention.variant).split():
        at = text.find(word, cursor, end)
        at = at if at >= 0 else text.find(word, start, end)
        if at < 0 or (gene is not None and at < gene[1] and gene[0] < at + len(word)):
            continue
        words.append((at, at + len(word)))
        cursor = at + len(word)
    spans = [Span(*gene, "GENE")] if gene is not None else []
    return spans + [Span(a, b, "VARIANT") for a, b in _runs(text, sorted(set(words)))]


def _runs(text: str, words: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Words joined into one span where only spaces or punctuation lie between them."""
    runs: list[tuple[int, int]] = []
    for a, b in words:
        if runs and runs[-1][1] <= a and not any(c.isalnum() for c in text[runs[-1][1]:a]):
            runs[-1] = (runs[-1][0], max(b, runs[-1][1]))
        elif not runs or a >= runs[-1][1]:
            runs.append((a, b))
    return runs


@lru_cache(maxsize=1)
def analyte_surfaces() -> dict[str, tuple[str, ...]]:
    """Every written name of each analyte, longest first: where in a result mention the analyte ends."""
    tables = read_result_tables(DEFAULT_ANALYTES_PATH, DEFAULT_CRITICAL_PATH)
    names: dict[str, list[str]] = {}
    for surface, meaning in tables.surfaces.items():
        if meaning.analyte is not None:
            names.setdefault(meaning.analyte.name, []).append(surface)
    return {name: tuple(sorted(found, key=len, reverse=True)) for name, found in names.items()}


_VALUE = re.compile(r"[<>≤≥≦≧＜＞]=?\s*\d|\d")


def result_spans(text: str, mention: ResultMention) -> list[Span]:
    """ANALYTE over the name as written, VALUE from the comparator or number to the end of the unit."""
    piece = "".join(c if len(n := unicodedata.normalize("NFKC", c)) != 1 else n
                    for c in text[mention.start:mention.end])
    folded = piece.casefold()
    name = next((len(s) for s in analyte_surfaces().get(mention.analyte, ()) if folded.startswith(s.casefold())), 0)
    value = _VALUE.search(piece, name)
    if value is None:
        return []
    analyte_end = name or len(piece[:value.start()].rstrip(" :=|\t"))
    spans = [Span(mention.start + value.start(), mention.end, "VALUE")]
    return [Span(mention.start, mention.start + analyte_end, "ANALYTE"), *spans] if analyte_end else spans


def add_spans(spans: tuple[Span, ...], new: Iterable[Span]) -> tuple[Span, ...]:
    """`spans` with each new span that overlaps none of its own type."""
    kept = list(spans)
    for span in new:
        if span.end > span.start and not any(s.type == span.type and s.start < span.end and span.start < s.end
                                              for s in kept):
            kept.append(span)
    return tuple(kept)


def weak_layers(text: str, lang: str, label: Label) -> Label:
    """Result and genetic mentions added to a kept label: spans always, the kind beyond a critical limit or for a
    genetic result, in either language (the detector reads Chinese result words, and symbols holding a digit in any
    case: "ugt1a1*28"), except in a sentence about animals ("CX3CR1 knockout mice"): a model organism's genotype is
    no patient's result."""
    mentions = results_in(text)
    label = replace(label, spans=add_spans(label.spans, (s for m in mentions for s in result_spans(text, m))))
    if any(m.critical for m in mentions) and "critical_result" not in label.kinds:
        label = label.weakened("critical_result")
    genes = gene_mentions_of(text)
    label = replace(label, spans=add_spans(label.spans, (s for m in genes for s in gene_spans(text, m))))
    if genes and "genetic" not in label.kinds and not _ANIMAL.search(text):
        label = label.weakened("genetic")
    return label


# --------------------------------------------------------------------------- examples and splits
def split_of(group: str) -> str:
    """check for the check half; of the tune half, dev for one group in ten (by hash), train for the rest."""
    if half_of(group) == "check":
        return "check"
    value = int(hashlib.sha256(f"recogniser-dev:{group}".encode()).hexdigest(), 16)
    return "dev" if value % 100 < DEV_SHARE else "train"


def span_types(corpus: Corpus) -> list[str]:
    """The types this example marks wherever they occur: its corpus's, and the weak layers' everywhere."""
    everywhere = ("ANALYTE", "VALUE") + (("GENE", "VARIANT") if genes_module() is not None else ())
    marked = set(corpus.spans) | set(everywhere)
    return [t for t in SPAN_TYPES if t in marked]


def example(item_id: str, text: str, lang: str, corpus: Corpus, label: Label) -> dict[str, Any]:
    return {"id": item_id, "text": text, "lang": lang, "kinds": [k for k in KINDS if k in label.kinds],
            "spans": [{"start": s.start, "end": s.end, "type": s.type}
                      for s in sorted(label.spans, key=lambda s: (s.start, s.end, SPAN_TYPES.index(s.type)))],
            "source": corpus.name, "licence": corpus.licence, "label_quality": label.quality,
            "weight": label.weight, "span_types": span_types(corpus), "note": label.note,
            "train_allowed": True}


@dataclass
class Tally:
    """What the run counted, for the summary and the card."""

    examples: Counter[tuple[str, str, str, str, str]] = field(default_factory=Counter)  # split, source, kind, lang, q
    kinds: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)  # split, kind, lang, quality
    unknown: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # source, half, reason
    notes: Counter[tuple[str, str]] = field(default_factory=Counter)  # source, note
    duplicates: Counter[str] = field(default_factory=Counter)  # split
    allergy_guess: Counter[tuple[str, str]] = field(default_factory=Counter)  # (guess, ours)
    ade: Counter[tuple[str, str]] = field(default_factory=Counter)  # half, kind
    texts: dict[str, set[tuple[str, str]]] = field(default_factory=lambda: {s: set() for s in SPLITS})  # source, digest

    def check_in_train(self) -> Counter[str]:
        """Per source, check texts that train holds too: the corpora repeat some texts under other documents
        (MTSamples' specialties, MTS-Dialog's splits, CDR abstracts), and boilerplate recurs ("Lungs: Clear.")."""
        trained = {digest for _, digest in self.texts["train"]}
        return Counter(source for source, digest in self.texts["check"] if digest in trained)

    def count(self, split: str, record: Mapping[str, Any]) -> None:
        kinds = record["kinds"] or ["(none)"]
        for kind in kinds:
            self.kinds[(split, kind, record["lang"], record["label_quality"])] += 1
        self.examples[(split, record["source"], "+".join(kinds), record["lang"], record["label_quality"])] += 1
        if record["note"]:
            self.notes[(record["source"], record["note"])] += 1


class Writers:
    """The three split files, written to temporary names and moved in place at the end (a failed run leaves the old
    files); an example repeated within a split (same text, same kinds) is written once."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.handles: dict[str, TextIO] = {s: (out / f".{s}.jsonl.part").open("w", encoding="utf-8") for s in SPLITS}
        self.keys: dict[str, set[str]] = {s: set() for s in SPLITS}

    def write(self, split: str, record: Mapping[str, Any], tally: Tally) -> None:
        key = hashlib.sha1(json.dumps([record["text"], record["kinds"]], ensure_ascii=False).encode()).hexdigest()
        if key in self.keys[split]:
            tally.duplicates[split] += 1
            return
        self.keys[split].add(key)
        tally.texts[split].add((record["source"], hashlib.sha1(record["text"].encode()).hexdigest()))
        self.handles[split].write(json.dumps(record, ensure_ascii=False) + "\n")
        tally.count(split, record)

    def close(self) -> None:
        for split, handle in self.handles.items():
            handle.close()
            os.replace(self.out / f".{split}.jsonl.part", self.out / f"{split}.jsonl")


def documents(path: Path, advance: Callable[[int], None]) -> Iterator[list[tuple[Item, Any]]]:
    """The file's items, one document (group) at a time, each with its parse by eval.labelled_tiers."""
    with path.open(encoding="utf-8") as lines:
        parsed = ((json.loads(line), line) for line in lines if line.strip())
        for _, group in groupby(((raw, parse_item(raw), len(line.encode())) for raw, line in parsed),
                                key=lambda row: row[1].group if row[1] is not None else ""):
            rows = list(group)
            advance(sum(size for _, _, size in rows))
            yield [(raw, item) for raw, item, _ in rows if item is not None]


def build_corpus(corpus: Corpus, folder: Path, writers: Writers, tally: Tally, advance: Callable[[int], None]) -> None:
    mapper = MAPPERS[corpus.name]
    for doc in documents(folder / corpus.file, advance):
        raws = [raw for raw, _ in doc]
        for raw, item in doc:
            split = split_of(item.group)
            label = mapper(raw, raws)
            if mapper is notes and detail(raw).get("subtype") == "allergy":
                tally.allergy_guess[(str(bool(raw.get("allergy_negation_guess"))), allergy_outcome(label))] += 1
            if label.unknown:
                tally.unknown[(corpus.name, "check" if split == "check" else "tune", label.unknown)] += 1
                continue
            record = example(item.id, item.text, item.lang, corpus, weak_layers(item.text, item.lang, label))
            writers.write(split, record, tally)


def allergy_outcome(label: Label) -> str:
    """What our allergy-status rule made of an allergy-section item: denial, allergy or unknown."""
    if label.unknown:
        return "unknown"
    return "allergy" if label.kinds else "denial"


def ade_spans(text: str, names: Iterable[str], kind: str) -> list[Span]:
    """Every occurrence of each annotated name (the corpus gives names, not offsets), at word boundaries."""
    spans = []
    for name in names:
        for match in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text, _I):
            spans.append(Span(match.start(), match.end(), kind))
    return list(add_spans((), spans))


def build_ade(path: Path, out: Path, tally: Tally) -> None:
    """ADE-Corpus-V2 as an evaluation set: both halves (`half` says which; report on check), only the ADR kind
    known (`kinds_known`): its no_adr sentences may state pathology or results."""
    temporary = out / ".ade_eval.jsonl.part"
    with path.open(encoding="utf-8") as lines, temporary.open("w", encoding="utf-8") as handle:
        for line in lines:
            raw = json.loads(line)
            item = parse_item(raw)
            if item is None:
                continue
            adr = raw.get("kind") == "adr"
            spans = (ade_spans(item.text, raw.get("drugs", []), "DRUG")
                     + ade_spans(item.text, raw.get("effects", []), "REACTION")) if adr else []
            half = half_of(item.group)
            record = {"id": item.id, "text": item.text, "lang": item.lang, "kinds": ["adr"] if adr else [],
                      "spans": [{"start": s.start, "end": s.end, "type": s.type}
                                for s in sorted(spans, key=lambda s: (s.start, s.end))],
                      "source": ADE.name, "licence": ADE.licence, "label_quality": "gold", "weight": 1.0,
                      "span_types": ["DRUG", "REACTION"] if adr else [], "note": "evaluation only",
                      "train_allowed": False, "half": half, "kinds_known": ["adr"]}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            tally.ade[(half, "adr" if adr else "no_adr")] += 1
    os.replace(temporary, out / "ade_eval.jsonl")


def check_sources(data_root: Path) -> None:
    """Every corpus's commit as SOURCE.md states it: a snapshot replaced under us fails here, not in the card."""
    for corpus, source in [(c, data_root / "text_corpora" / "SOURCE.md") for c in CORPORA] + [
            (ADE, data_root / "ade_corpus" / "SOURCE.md")]:
        text = source.read_text(encoding="utf-8")
        if corpus.commit not in text or corpus.repo not in text:
            raise SystemExit(f"{source}: no longer names {corpus.repo} @ {corpus.commit} for {corpus.file}")


# --------------------------------------------------------------------------- summary
def summary(tally: Tally, command: str) -> list[str]:
    """The counts section of the card, printed at the end of every run."""
    layer = "vocab.genes" if genes_module() is not None else "skipped (vocab.genes absent)"
    return ["## Counts", "", f"Command: `{command}`. Genetic layer: {layer}.", "", *_per_split(tally), "",
            *_per_kind(tally), "", *_per_source(tally), "", *_left_out(tally), "", *_allergy_agreement(tally), "",
            "### Other counts", "", "- Repeated examples (same text and kinds) written once: "
            + ", ".join(f"{s} {tally.duplicates[s]:,}" for s in SPLITS) + ".", _overlap(tally), "",
            "### ADE-Corpus-V2 evaluation set (`ade_eval.jsonl`, never trained on)", "",
            "| half | adr | no_adr |", "|---|---|---|",
            *(f"| {h} | {tally.ade[(h, 'adr')]:,} | {tally.ade[(h, 'no_adr')]:,} |" for h in ("tune", "check"))]


def _row(*cells: object) -> str:
    return "| " + " | ".join(f"{c:,}" if isinstance(c, int) else str(c) for c in cells) + " |"


def _per_split(tally: Tally) -> list[str]:
    lines = ["### Examples per split and source", "", _row("source", *SPLITS, "left out (tune)", "left out (check)"),
             "|---|" + "---|" * (len(SPLITS) + 2)]
    for name in [c.name for c in CORPORA] + ["**all**"]:
        per = [sum(n for (s, src, *_), n in tally.examples.items() if s == split and name in (src, "**all**"))
               for split in SPLITS]
        gone = [sum(n for (src, h, _), n in tally.unknown.items() if h == half and name in (src, "**all**"))
                for half in ("tune", "check")]
        lines.append(_row(name, *per, *gone))
    return lines


def _per_kind(tally: Tally) -> list[str]:
    lines = ["### Kinds per split, language and label quality", "",
             "An example with two kinds counts under each; `(none)` is a negative.", "",
             _row("split", "kind", "lang", *QUALITIES), "|---|---|---|" + "---|" * len(QUALITIES)]
    for split in SPLITS:
        for kind in (*KINDS, "(none)"):
            for lang in ("en", "zh"):
                row = [tally.kinds[(split, kind, lang, q)] for q in QUALITIES]
                lines += [_row(split, kind, lang, *row)] if any(row) else []
    return lines


def _per_source(tally: Tally) -> list[str]:
    lines = ["### Per source: kinds and label quality per split", "",
             "Kinds joined by `+` as the examples carry them; `(none)` is a negative.", "",
             _row("source", "lang", "kinds", "quality", *SPLITS), "|---|---|---|---|" + "---|" * len(SPLITS)]
    for corpus in CORPORA:
        rows = sorted({(lang, kinds, q) for (_, src, kinds, lang, q) in tally.examples if src == corpus.name},
                      key=lambda r: (r[0], r[1] == "(none)", r[1], QUALITIES.index(r[2])))
        lines += [_row(corpus.name, lang, kinds, quality,
                       *(tally.examples[(split, corpus.name, kinds, lang, quality)] for split in SPLITS))
                  for lang, kinds, quality in rows]
    return lines


def _left_out(tally: Tally) -> list[str]:
    lines = ["### Left out as unknown, per source and reason (tune + check halves)", "",
             _row("source", "reason", "tune", "check"), "|---|---|---|---|"]
    for src, why in sorted({(src, why) for src, _, why in tally.unknown}):
        lines.append(_row(src, why, tally.unknown[(src, "tune", why)], tally.unknown[(src, "check", why)]))
    return [*lines, "", "### Notes on kept examples (all splits, after repeats are dropped)", "",
            _row("source", "note", "examples"), "|---|---|---|",
            *(_row(src, note, n) for (src, note), n in sorted(tally.notes.items()))]


def _overlap(tally: Tally) -> str:
    seen = tally.check_in_train()
    return (f"- Check examples whose text train also holds: {sum(seen.values()):,} ("
            + ", ".join(f"{source} {n:,}" for source, n in seen.most_common()) + "); the halves split documents, "
            "and the corpora repeat some texts under other documents.")


def _allergy_agreement(tally: Tally) -> list[str]:
    """Our allergy-status rule against the corpora's `allergy_negation_guess` regex, on every allergy-section item."""
    agree = sum(n for (guess, ours), n in tally.allergy_guess.items() if (guess == "True") == (ours == "denial"))
    total = sum(tally.allergy_guess.values())
    lines = ["### Allergy-status denial: our rule against `allergy_negation_guess` (allergy-section items, both "
             "halves)",
             "", f"Agreement on denial / not denial: {agree:,} of {total:,}"
             + (f" ({100 * agree / total:.1f} %)." if total else "."), "",
             "| guess | ours: denial | ours: allergy | ours: unknown |", "|---|---|---|---|"]
    for guess in ("True", "False"):
        lines.append(f"| {guess.lower()} | " + " | ".join(f"{tally.allergy_guess[(guess, o)]:,}"
                                                          for o in ("denial", "allergy", "unknown")) + " |")
    return lines


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("build/recogniser_data"))
    parser.add_argument("--card", type=Path, default=None, help="write the counts into this card (between markers)")
    args = parser.parse_args()
    check_sources(args.data_root)
    if genes_module() is None:
        log.warning("vocab.genes is absent: no genetic layer (GENE/VARIANT spans, weak genetic kind)")
    folder = args.data_root / "text_corpora"
    writers, tally = Writers(args.out), Tally()
    total = sum((folder / c.file).stat().st_size for c in CORPORA)
    with Progress() as progress:
        task = progress.add_task("examples", total=total)
        for corpus in CORPORA:
            progress.update(task, description=corpus.name)
            build_corpus(corpus, folder, writers, tally, lambda n: progress.update(task, advance=n))
            log.info("%s: %d examples, %d left out", corpus.name,
                     sum(n for (_, src, *_), n in tally.examples.items() if src == corpus.name),
                     sum(n for (src, *_), n in tally.unknown.items() if src == corpus.name))
    writers.close()
    build_ade(args.data_root / "ade_corpus" / ADE.file, args.out, tally)
    log.info("wrote %s/{train,dev,check,ade_eval}.jsonl", args.out)
    command = " ".join(["python bench/recogniser_data.py", f"--data-root {args.data_root}", f"--out {args.out}",
                        *([f"--card {args.card}"] if args.card else [])])
    emit(args.card, "recogniser-data", summary(tally, command))


if __name__ == "__main__":
    main()
