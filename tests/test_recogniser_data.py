"""bench/recogniser_data.py: what each corpus's annotation is mapped to, and that ADE-Corpus-V2 never reaches train.

Every line below is written for this test; none is copied from a corpus.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_scripts import load_script


@pytest.fixture(scope="module")
def rd() -> ModuleType:
    return load_script("recogniser_data")


def spans_of(text: str, label: Any) -> list[tuple[str, str]]:
    return sorted((s.type, text[s.start:s.end]) for s in label.spans)


@pytest.mark.parametrize(("text", "status"), [
    ("No known drug allergies.", "denial"),
    ("NKDA.", "denial"),
    ("None.", "denial"),
    ("The patient denies any allergy to peanuts.", "denial"),
    ("No drug allergies, but she reacts to latex gloves.", "allergy"),
    ("Amoxicillin causes hives.", "allergy"),
    ("Codeine and adhesive tape.", "allergy"),
    ("Seasonal allergies only.", "unknown"),
    ("Metoprolol 50 mg p.o. daily.", "unknown"),
    ("CURRENT MEDICATIONS,1.", "unknown"),
    ("See the chart.", "unknown"),
    ("No eczema.", "unknown"),
])
def test_allergy_status_reads_denials_leaks_and_allergens(rd: ModuleType, text: str, status: str) -> None:
    assert rd.allergy_status_en(text)[0] == status


def test_chinese_allergy_denial_needs_no_contrast(rd: ModuleType) -> None:
    assert rd.allergy_status_zh("无药物过敏史者") == "denial"
    assert rd.allergy_status_zh("对头孢类抗生素过敏者") == "allergy"
    assert rd.allergy_status_zh("无食物过敏史，但对青霉素过敏") == "allergy"
    assert rd.allergy_status_zh("有药物过敏史，但不包括无症状的花粉过敏") == "allergy"


def tac(text: str, spans: list[dict[str, Any]], flagged: bool = False) -> dict[str, Any]:
    return {"id": "tac2017:train:x:S1:0", "text": text, "label": "T1" if any(
        s["type"] == "AdverseReaction" for s in spans) else None,
            "label_detail": {"has_negation_or_hypothetical_or_animal": flagged}, "spans": spans}


def span(text: str, part: str, kind: str, **extra: Any) -> dict[str, Any]:
    start = text.index(part)
    return {"start": start, "end": start + len(part), "type": kind, "text": part, **extra}


def test_tac_positive_is_a_lower_weighted_adr_with_its_reactions(rd: ModuleType) -> None:
    text = "Pancreatitis was reported in patients taking the drug."
    label = rd.tac2017(tac(text, [span(text, "Pancreatitis", "AdverseReaction")]), [])
    assert label.kinds == {"adr"} and label.quality == "gold" and label.weight == rd.DRUG_LABEL
    assert spans_of(text, label) == [("REACTION", "Pancreatitis")]


def test_tac_table_rows_and_unclear_flags_are_left_out_and_negations_are_negatives(rd: ModuleType) -> None:
    row = "Gastritis        7 (3%)       2 (1%)"
    assert rd.tac2017(tac(row, [span(row, "Gastritis", "AdverseReaction")]), []).unknown.startswith("table row")
    negated = "No seizures occurred in the trial."
    label = rd.tac2017(tac(negated, [span(negated, "seizures", "AdverseReaction"), span(negated, "No", "Negation")],
                           flagged=True), [])
    assert not label.unknown and label.kinds == set() and label.weight == rd.DRUG_LABEL_NEGATED
    maybe = "Hepatotoxicity may occur with higher doses."
    assert rd.tac2017(tac(maybe, [span(maybe, "Hepatotoxicity", "AdverseReaction")], flagged=True), []).unknown


def cdr(text: str, spans: list[dict[str, Any]], pairs: list[list[str]], animals: bool = False) -> dict[str, Any]:
    return {"id": "bc5cdr:train:1:0", "text": text, "spans": spans,
            "label_detail": {"subtype": "adr_candidate" if pairs else "no_pair", "cid_pairs": pairs,
                             "doc_mentions_animals": animals}}


def test_bc5cdr_pairs_give_drug_and_reaction_and_anaphora_is_left_out(rd: ModuleType) -> None:
    text = "A woman developed lactic acidosis on metformin."
    item = cdr(text, [span(text, "lactic acidosis", "Disease", mesh="D1"), span(text, "metformin", "Chemical",
                                                                                 mesh="C1")], [["C1", "D1"]])
    label = rd.bc5cdr(item, [item])
    assert label.kinds == {"adr"} and label.quality == "silver" and label.weight == rd.CID_HUMAN
    assert spans_of(text, label) == [("DRUG", "metformin"), ("REACTION", "lactic acidosis")]
    later = "The lactic acidosis resolved with dialysis."
    echo = cdr(later, [span(later, "lactic acidosis", "Disease", mesh="D1")], [])
    assert rd.bc5cdr(echo, [item, echo]).unknown.startswith("names a disease the abstract links")
    rats = "Metformin gave lactic acidosis in rats."
    in_rats = cdr(rats, [span(rats, "lactic acidosis", "Disease", mesh="D1")], [["C1", "D1"]], animals=True)
    assert rd.bc5cdr(in_rats, [in_rats]).unknown == "animal or in-vitro sentence"
    alone = "Metformin is a biguanide."
    negative = rd.bc5cdr(cdr(alone, [span(alone, "Metformin", "Chemical", mesh="C1")], []), [])
    assert negative.kinds == set() and spans_of(alone, negative) == [("DRUG", "Metformin")]


def test_psytar_reactions_and_withdrawal_are_adr_and_effects_are_hard_negatives(rd: ModuleType) -> None:
    flags = {"ADR": 0, "WD": 1, "EF": 0, "INF": 0, "SSI": 0, "DI": 0}
    assert rd.psytar({"text": "x", "label_detail": {"psytar": flags}}, []).kinds == {"adr"}
    label = rd.psytar({"text": "x", "label_detail": {"psytar": {**flags, "WD": 0, "EF": 1}}}, [])
    assert label.kinds == set() and label.note == "hard negative: EF"


@pytest.mark.parametrize(("text", "subtype", "tier", "expected"), [
    ("Lungs are clear to auscultation.", "exam", "T3", set()),
    ("She broke out in hives after a dose of cefalexin.", "history", "T4", None),
    ("Biopsy showed invasive ductal carcinoma.", "history", "T4", None),
    ("Resection of a grade 2 sarcoma in 2019.", "history", "T4", None),
    ("Continue current medications.", "other", None, None),
    ("Sections show a benign fibroadenoma.", "pathology_or_molecular", "T1", {"pathology"}),
    ("Allergic to cefalexin.", "allergy", "T1", {"allergy"}),
    ("No known allergies.", "allergy", "T1", set()),
])
def test_note_sections_are_priors_and_possible_criticals_stay_out(rd: ModuleType, text: str, subtype: str,
                                                                 tier: str | None, expected: set[str] | None) -> None:
    label = rd.notes({"text": text, "label": tier, "label_detail": {"subtype": subtype}}, [])
    assert (None if label.unknown else label.kinds) == expected


def test_chinese_corpora_map_categories_spans_and_concepts(rd: ModuleType) -> None:
    ctc = {"text": "既往对造影剂过敏者", "label": "T1", "label_detail": {"ctc_category": "Allergy Intolerance"}}
    assert rd.chip_ctc(ctc, []).kinds == {"allergy"}
    assert rd.chip_ctc({"text": "样本保存不足一年", "label": "T1",
                        "label_detail": {"ctc_category": "Receptor Status"}}, []).unknown
    disease = {"text": "合并其他疾病者", "label": None, "label_detail": {"ctc_category": "Disease"}}
    assert rd.chip_ctc(disease, []).unknown
    path = "术后病理示:胃腺癌。"
    assert rd.cehrner({"text": path, "spans": []}, []).kinds == {"pathology"}
    both = "口服阿司匹林,感恶心。"
    ner = [span(both, "阿司匹林", "药物"), span(both, "恶心", "症状")]
    assert rd.cehrner({"text": both, "spans": ner}, []).unknown
    question = "布洛芬一天能吃几次？"
    label = rd.cmedqaner({"text": question, "spans": [span(question, "布洛芬", "drug")]}, [])
    assert label.kinds == set() and label.quality == "weak" and spans_of(question, label) == [("DRUG", "布洛芬")]


def test_weak_layers_add_critical_results_with_analyte_and_value(rd: ModuleType) -> None:
    text = "Potassium 7.1 mmol/L this morning."
    label = rd.weak_layers(text, "en", rd.negative("silver", rd.SECTION_OTHER))
    assert label.kinds == {"critical_result"} and label.quality == "weak" and label.weight == rd.WEAK
    assert spans_of(text, label) == [("ANALYTE", "Potassium"), ("VALUE", "7.1 mmol/L")]
    calm = "Sodium 139, potassium 4.2."
    label = rd.weak_layers(calm, "en", rd.negative("silver", rd.SECTION_OTHER))
    assert label.kinds == set() and label.quality == "silver" and ("VALUE", "4.2") in spans_of(calm, label)


def test_splits_follow_the_halves_and_dev_is_a_tenth_of_tune(rd: ModuleType) -> None:
    from ebmrag.eval.halves import half_of
    keys = [f"corpus:doc{i}:0" for i in range(4000)]
    splits = [rd.split_of(k) for k in keys]
    assert all((s == "check") == (half_of(k) == "check") for k, s in zip(keys, splits, strict=True))
    tune = [s for s in splits if s != "check"]
    assert 0.07 < tune.count("dev") / len(tune) < 0.13
    assert splits == [rd.split_of(k) for k in keys]


def write_data_root(rd: ModuleType, root: Path) -> None:
    """One or two lines a corpus, and SOURCE.md files naming each corpus's repository and commit."""
    folder = root / "text_corpora"
    folder.mkdir(parents=True)
    (root / "ade_corpus").mkdir()
    (folder / "SOURCE.md").write_text("\n".join(f"{c.repo} {c.commit}" for c in rd.CORPORA))
    (root / "ade_corpus" / "SOURCE.md").write_text(f"{rd.ADE.repo} {rd.ADE.commit}")
    notes = {"label": "T3", "label_detail": {"subtype": "exam"}, "lang": "en"}
    lines: dict[str, list[dict[str, Any]]] = {c.file: [] for c in rd.CORPORA}
    lines["mtsamples_sections_shared.jsonl"] = [{"id": f"mtsamples:{i}:1:0", "text": f"Abdomen soft, note {i}.",
                                                 **notes} for i in range(40)]
    lines["psytar_sentences_shared.jsonl"] = [{"id": "psytar:1", "text": "It made me dizzy.", "lang": "en",
                                               "label": "T1", "label_detail": {"psytar": {"ADR": 1}}}]
    for name, rows in lines.items():
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    ade = [{"id": f"ade-{i}-0", "text": "Rash after cotrimoxazole.", "lang": "en", "kind": "adr", "tier": "T1",
            "drugs": ["cotrimoxazole"], "effects": ["Rash"], "pmid": str(i)} for i in range(10)]
    (root / "ade_corpus" / rd.ADE.file).write_text("".join(json.dumps(r) + "\n" for r in ade))


def test_a_run_keeps_ade_out_of_training_and_is_repeatable(rd: ModuleType, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    write_data_root(rd, tmp_path / "data")
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["recogniser_data.py", "--data-root", str(tmp_path / "data"), "--out", str(out)])
    rd.main()
    first = {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
    assert set(first) == {"train.jsonl", "dev.jsonl", "check.jsonl", "ade_eval.jsonl"}
    kept = [json.loads(line) for name in ("train.jsonl", "dev.jsonl", "check.jsonl")
            for line in first[name].decode().splitlines()]
    assert len(kept) == 41 and all(r["train_allowed"] and r["source"] != rd.ADE.name for r in kept)
    ade = [json.loads(line) for line in first["ade_eval.jsonl"].decode().splitlines()]
    assert len(ade) == 10 and not any(r["train_allowed"] for r in ade)
    assert {(s["type"], r["text"][s["start"]:s["end"]]) for r in ade for s in r["spans"]} == {
        ("DRUG", "cotrimoxazole"), ("REACTION", "Rash")}
    rd.main()
    assert first == {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
