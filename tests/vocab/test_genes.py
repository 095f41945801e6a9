"""Genetic and pharmacogenomic results recognised by grammar, for genes the old typed list never named.

Recall: sentences written for this test across pharmacogenes, hereditary cancer genes, tumour drivers and HLA,
in the notations laboratories and clinicians use (HGVS, protein shorthand, star alleles, HLA alleles, rsIDs,
exons, fusions, copy number, zygosity, phenotypes, ACMG classes), English and Chinese. Precision: symbols that
are words or abbreviations too, vertebrae, arthrodeses, protein markers and statistics must stay silent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, RuleBook
from ebmrag.vocab.genes import GRAMMAR, GeneVocabulary, gene_mentions, vocabulary

# (text, the gene a mention must name, a part of its variant as written)
RESULTS = [
    ("Pharmacogenomic panel: CYP2D6 *4/*4, poor metabolizer.", "CYP2D6", "*4/*4"),
    ("CYP2C9*1/*3 with VKORC1 -1639G>A; start warfarin at a reduced dose.", "CYP2C9", "*1/*3"),
    ("VKORC1 c.-1639G>A homozygous.", "VKORC1", "c.-1639G>A"),
    ("TPMT *1/*3A, intermediate metabolizer: reduce azathioprine.", "TPMT", "*1/*3A"),
    ("NUDT15 p.Arg139Cys heterozygous.", "NUDT15", "p.Arg139Cys"),
    ("DPYD c.1905+1G>A (DPYD*2A) detected in the germline panel.", "DPYD", "c.1905+1G>A"),
    ("UGT1A1 *28/*28 genotype consistent with Gilbert syndrome.", "UGT1A1", "*28/*28"),
    ("SLCO1B1 rs4149056 TC, decreased function.", "SLCO1B1", "rs4149056"),
    ("CYP3A5 *3/*3 (non-expresser); tacrolimus dosed per protocol.", "CYP3A5", "*3/*3"),
    ("G6PD c.563C>T hemizygous (Mediterranean variant).", "G6PD", "c.563C>T"),
    ("RYR1 c.7300G>A, a pathogenic variant for malignant hyperthermia.", "RYR1", "c.7300G>A"),
    ("MT-RNR1 m.1555A>G detected: avoid aminoglycosides.", "MT-RNR1", "m.1555A>G"),
    ("HLA-A*31:01 carrier; carbamazepine avoided.", "HLA-A", "*31:01"),
    ("HLA-B*1502 positive in this Han Chinese patient.", "HLA-B", "1502"),
    ("HLA-B*58:01 was detected before starting allopurinol.", "HLA-B", "58:01"),
    ("Germline testing: PALB2 c.3113G>A (p.Trp1038*), pathogenic.", "PALB2", "c.3113G>A"),
    ("A likely pathogenic variant in CHEK2 (c.1100delC) was reported.", "CHEK2", "c.1100delC"),
    ("ATM heterozygous truncating variant identified.", "ATM", "truncating"),
    ("MSH6 c.3261dupC frameshift.", "MSH6", "c.3261dupC"),
    ("PMS2 exon 11 deletion confirmed by MLPA.", "PMS2", "exon 11 deletion"),
    ("CDH1 germline mutation; prophylactic gastrectomy discussed.", "CDH1", "mutation"),
    ("Biallelic MUTYH variants (p.Tyr179Cys and p.Gly396Asp).", "MUTYH", "p.Tyr179Cys"),
    ("BRAF V600E mutation detected in the melanoma.", "BRAF", "V600E"),
    ("NRAS Q61K mutant.", "NRAS", "Q61K"),
    ("PIK3CA H1047R identified on next-generation sequencing.", "PIK3CA", "H1047R"),
    ("IDH1 R132H mutant astrocytoma.", "IDH1", "R132H"),
    ("FLT3-ITD positive acute myeloid leukaemia with NPM1 mutation.", "FLT3", "ITD"),
    ("KIT exon 11 deletion in the gastrointestinal stromal tumour.", "KIT", "exon 11 deletion"),
    ("CCDC6-RET fusion detected by RNA sequencing.", "CCDC6::RET", "fusion"),
    ("SLC34A2::ROS1 fusion.", "SLC34A2::ROS1", "fusion"),
    ("MET exon 14 skipping alteration.", "MET", "exon 14 skipping"),
    ("ERBB2 amplification by FISH, ratio 5.1.", "ERBB2", "amplification"),
    ("FGFR2 rearrangement in intrahepatic cholangiocarcinoma.", "FGFR2", "rearrangement"),
    ("CALR exon 9 mutation (type 1, 52-bp deletion).", "CALR", "exon 9 mutation"),
    ("ESR1 Y537S detected in circulating tumour DNA.", "ESR1", "Y537S"),
    ("MGMT promoter methylated glioblastoma.", "MGMT", "methylated"),
    ("SMN1 homozygous deletion of exon 7.", "SMN1", "homozygous"),
    ("检测结果：DPYD c.1236G>A 杂合突变。", "DPYD", "c.1236G>A"),
    ("CYP2C19*2/*2 慢代谢型，建议换用替格瑞洛。", "CYP2C19", "*2/*2"),
    ("HLA-B*58:01 阳性，禁用别嘌醇。", "HLA-B", "58:01"),
    ("检出PIK3CA基因E545K突变。", "PIK3CA", "E545K"),
    ("NTRK1融合阳性。", "NTRK1", "融合"),
    ("MET基因扩增。", "MET", "扩增"),
    ("ROS1阳性肺腺癌，克唑替尼治疗中。", "ROS1", "阳性"),
    ("JAK2-negative, CALR-mutated essential thrombocythaemia.", "CALR", "mutated"),
]


@pytest.mark.parametrize(("text", "gene", "variant"), RESULTS)
def test_any_genes_result_is_recognised(text: str, gene: str, variant: str) -> None:
    mentions = gene_mentions(text)
    named = [m for m in mentions if m.gene == gene]
    assert named, (text, [m.describe() for m in mentions])
    assert any(variant in m.variant for m in named), [m.describe() for m in named]


@pytest.mark.parametrize(("text", "variant"), [
    ("Tumour is MSI-high with a TMB of 18 mut/Mb.", "MSI-high"),
    ("Mismatch repair deficient (dMMR) on immunohistochemistry.", "dMMR"),
    ("Karyotype 46,XX,t(15;17)(q24;q21).", "t(15;17)"),
    ("1p/19q codeletion present.", "1p/19q codeletion"),
    ("She is heterozygous for factor V Leiden.", "heterozygous"),
    ("Ultrarapid metabolizer: codeine contraindicated.", "Ultrarapid metabolizer"),
    ("Variant of uncertain significance only.", "Variant of uncertain significance"),
    ("微卫星高度不稳定（MSI-H）。", "微卫星高度不稳定"),
])
def test_results_that_name_no_gene_are_recognised(text: str, variant: str) -> None:
    assert any(variant in m.variant for m in gene_mentions(text)), gene_mentions(text)


@pytest.mark.parametrize("text", [
    "MET with the family to discuss the plan.",
    "Her CAT scan showed a focal ileus.",
    "The SET of labs was sent.",
    "Mild AR and trace MR on the echo; PC follow-up in a month.",
    "ACE inhibitor stopped for cough.",
    "C5-C6 anterior cervical discectomy and fusion.",
    "PIP joint fusion of the second toe.",
    "CD20 positive B cells on flow cytometry.",
    "URINE SCREEN WAS NEGATIVE. SHE WAS SENT HOME.",
    "EGFR 45 mL/min/1.73 m2 this morning.",
    "Glucose differed among groups (F(33) = 3.35; r(2) = 0.32).",
    "Testing for microsatellite instability is still pending.",
    "PEG tube insertion tomorrow.",
    "有较复杂合并证型者，以及单纯合并感染者。",
    "行腰椎融合术。",
    "HR阳性乳腺癌，Ki-67阳性率30%。",
    "Etanercept, a TNF receptor fusion protein, was started.",
])
def test_words_and_abbreviations_are_not_results(text: str) -> None:
    assert gene_mentions(text) == [], [m.describe() for m in gene_mentions(text)]


def test_a_pharmacogene_names_the_drugs_cpic_pairs_with_it() -> None:
    mention = gene_mentions("CYP2C19 *2/*17 intermediate metabolizer.")[0]
    assert mention.gene == "CYP2C19" and "clopidogrel" in mention.drugs
    assert "CPIC: " in mention.describe() and "clopidogrel" in mention.describe()
    assert gene_mentions("NRAS Q61K mutant.")[0].drugs == ()  # no CPIC pair: no drugs


def test_written_forms_name_their_gene() -> None:
    assert [m.gene for m in gene_mentions("HER2 amplified, ratio 4.2.")] == ["ERBB2"]
    assert [m.gene for m in gene_mentions("GBA N370S heterozygous.")] == ["GBA1"]  # CPIC's spelling
    assert {m.gene for m in gene_mentions("NTRK1/3 fusion negative on the RNA panel.")} == {"NTRK1", "NTRK3"}
    assert [m.gene for m in gene_mentions("brca2 c.5946delT")] == ["BRCA2"]  # a form with a digit, any case


def test_the_vocabulary_is_built_once_by_the_rule_book() -> None:
    vocab = vocabulary()
    assert vocab is vocabulary()
    assert vocab.gene("CYP2D6") == "CYP2D6" and vocab.gene("MET") == "MET" and vocab.gene("Met") is None
    assert len(vocab.written) > 19_000


def test_a_grammar_word_without_an_anchor_names_the_file(tmp_path: Path) -> None:
    shutil.copytree(FOLDER, tmp_path / "rules")
    grammar = tmp_path / "rules" / GRAMMAR
    grammar.write_text(grammar.read_text(encoding="utf-8").replace('zygosity = ["compound heterozygo',
                                                                     'zygosity = ["carrier", "compound heterozygo'),
                       encoding="utf-8")
    with pytest.raises(ConfigError, match=r"grammar\.toml.*'carrier' holds no anchor"):
        vocabulary(RuleBook(tmp_path / "rules"))


def test_from_files_reads_what_the_book_reads() -> None:
    assert GeneVocabulary.from_files().written == vocabulary().written


NOTES = ("mtsamples_sections_shared.jsonl", "aci_bench_notes_shared.jsonl", "mts_dialog_sections_shared.jsonl")


@pytest.mark.data
def test_patient_reports_and_examinations_are_almost_never_genetic_results(shared_data: Path) -> None:
    """The false-alarm count of docs/tiers.md: of the 20,155 sentences of the shared sectioned notes whose section
    makes them T3 or T4, the recogniser finds a result in one ("He is JAK-2 positive.", a history line)."""
    sentences = [item["text"] for name in NOTES
                 for line in (shared_data / "text_corpora" / name).read_text(encoding="utf-8").splitlines()
                 if (item := json.loads(line)).get("label") in ("T3", "T4")]
    fired = [text for text in sentences if gene_mentions(text)]
    assert len(sentences) > 20_000 and len(fired) <= 2, fired
