"""`eval tiers --text-only --labelled`: labelled JSONL files (ours, the external corpora's, ADE-Corpus-V2's),
scored with the real classifier, split into halves, and reported per file, language and kind."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.errors import RecordError
from ebmrag.eval.halves import half_of
from ebmrag.eval.labelled_tiers import (
    AdrMeasure,
    labelled_markdown,
    measure_labelled,
    read_labelled,
)
from ebmrag.eval.tier_agreement import labelled_case_texts
from ebmrag.records.fragment import Tier
from tests.conftest import SHARED_DATA

ADE_FILE = SHARED_DATA / "ade_corpus" / "ade_corpus_v2_shared.jsonl"

OURS: list[dict[str, Any]] = [
    {"id": "note1:allergy:0", "text": "Allergic to penicillin: anaphylaxis in 2019.", "lang": "en", "tier": "T1",
     "kind": "allergy"},
    {"id": "note1:path:0", "text": "Biopsy of the colon showed moderately differentiated adenocarcinoma.",
     "lang": "en", "tier": "T1", "kind": "pathology"},
    {"id": "note1:lab:0", "text": "Serum creatinine was 2.1 mg/dL and potassium 5.8 mmol/L.", "lang": "en",
     "tier": "T2", "kind": "lab"},
    {"id": "note2:imaging:0", "text": "CT of the chest showed a 3 cm mass in the right upper lobe.", "lang": "en",
     "tier": "T2", "kind": "imaging"},
    {"id": "note2:exam:0", "text": "On examination the abdomen was soft with mild tenderness in the left lower "
     "quadrant.", "lang": "en", "tier": "T3", "kind": "exam"},
    {"id": "note2:history:0", "text": "She reports three days of cough and feeling tired.", "lang": "en",
     "tier": "T4", "kind": "history"},
    {"id": "note3:history:0", "text": "患者三天前开始咳嗽，伴乏力。", "lang": "zh", "tier": "T4", "kind": "history"},
    {"id": "note3:lab:0", "text": "血常规：白细胞12.5×10^9/L，血红蛋白98g/L。", "lang": "zh", "tier": "T2",
     "kind": "lab"},
    {"id": "note3:filler:0", "text": "The patient was seen in the clinic today.", "lang": "en", "tier": None,
     "kind": "filler"},
    {"id": "note4:filler:0", "text": "Follow up in two weeks.", "lang": "en", "kind": "filler"},
    {"id": "note4:filler:1", "text": "   ", "lang": "en", "kind": "filler"},
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def classifier(resources):  # type: ignore[no-untyped-def]
    """The classifier `eval tiers` uses: the bundled rules and tier model, from the composition root."""
    return resources.tier_classifier


def test_the_three_line_shapes_are_read(tmp_path: Path) -> None:
    corpus = {"id": "mtsamples:7:2:0", "text": "LUNGS: Clear to auscultation.", "lang": "en", "label": "T3",
              "label_detail": {"subtype": "exam", "section": "PHYSICAL EXAMINATION"}, "source": "mtsamples"}
    unlabelled = {"id": "cehrner:train:5:1", "text": "术后恢复良好。", "lang": "zh", "label": None,
                  "label_detail": {"subtype": "no_lab_imaging_span"}}
    adr = {"id": "ade-1-0", "text": "Hepatitis after isoniazid.", "lang": "en", "kind": "adr", "tier": "T1",
           "drugs": ["isoniazid"], "effects": ["hepatitis"], "pmid": "1"}
    no_adr = {"id": "ade-1-1", "text": "The patient recovered.", "lang": "en", "kind": "no_adr", "pmid": "1"}
    source = read_labelled(write_jsonl(tmp_path / "mixed.jsonl", [corpus, unlabelled, adr, no_adr, *OURS]))
    items = {item.id: item for item in source.items}
    assert source.empty == 1 and len(items) == 14
    assert (items["mtsamples:7:2:0"].gold, items["mtsamples:7:2:0"].kind) == (Tier.T3, "exam")
    assert items["mtsamples:7:2:0"].group == "mtsamples:7:2"
    assert (items["cehrner:train:5:1"].gold, items["cehrner:train:5:1"].kind) == (None, "no_lab_imaging_span")
    assert (items["ade-1-0"].gold, items["ade-1-0"].kind, items["ade-1-0"].group) == (Tier.T1, "adr", "ade:1")
    assert (items["ade-1-1"].gold, items["ade-1-1"].kind, items["ade-1-1"].group) == (None, "no_adr", "ade:1")
    assert items["note3:lab:0"].lang == "zh" and items["note4:filler:0"].gold is None


@pytest.mark.model
def test_every_item_is_counted_per_kind_and_language_and_only_tiered_ones_are_scored(tmp_path: Path,
                                                                                     classifier) -> None:  # type: ignore[no-untyped-def]
    path = write_jsonl(tmp_path / "ours.jsonl", OURS)
    report = measure_labelled([path], classifier)
    (score,) = report.files
    assert score.name == "ours.jsonl" and score.empty == 1 and score.lines == 10
    assert {kind: counts.items for kind, counts in score.kinds.items()} == {
        "allergy": 1, "pathology": 1, "lab": 2, "imaging": 1, "exam": 1, "history": 2, "filler": 2}
    assert {lang: counts.items for lang, counts in score.languages.items()} == {"en": 8, "zh": 2}
    assert score.overall.items == 10 and score.overall.labelled == 8, "the two filler items have no tier"
    assert score.kinds["filler"].labelled == 0 and score.kinds["filler"].agreement is None
    assert sum(score.kinds["filler"].predicted.values()) == 2, "items without a tier still get a tier"
    assert {gold for gold, _ in score.overall.confusion} == {Tier.T1, Tier.T2, Tier.T3, Tier.T4}
    for counts in (score.overall, *score.kinds.values()):
        assert sum(counts.share(t) for t in Tier) == pytest.approx(1.0)
    assert score.overall.support(Tier.T1) == 2 and score.kinds["allergy"].precision(Tier.T1) is None
    assert score.adr is None
    text = "\n".join(labelled_markdown(report))
    assert "### ours.jsonl" in text and "| filler | 2 |" in text and "| zh | 2 |" in text


def test_adr_measures_are_recall_false_rate_and_balanced_precision() -> None:
    measure = AdrMeasure(adr=40, adr_t1=10, no_adr=100, no_adr_t1=5)
    assert measure.recall == 0.25 and measure.no_adr_t1_rate == 0.05
    assert measure.balanced_precision == pytest.approx(0.25 / 0.30)
    assert AdrMeasure(10, 0, 10, 0).balanced_precision == 0.0
    assert measure.to_json()["balanced_precision"] == round(0.25 / 0.30, 4)


@pytest.mark.model
def test_halves_partition_the_items_and_keep_a_document_together(tmp_path: Path, classifier) -> None:  # type: ignore[no-untyped-def]
    rows = [{"id": f"corpus:doc{d}:s:{i}", "text": text, "lang": "en", "tier": tier, "kind": kind}
            for d in range(12) for i, (text, tier, kind) in
            enumerate([("Potassium was 3.1 mmol/L.", "T2", "lab"), ("He has had a headache for a week.", "T4",
                                                                    "history")])]
    path = write_jsonl(tmp_path / "halves.jsonl", rows)
    full = measure_labelled([path], classifier, "all").files[0]
    tune = measure_labelled([path], classifier, "tune").files[0]
    check = measure_labelled([path], classifier, "check").files[0]
    assert tune.overall.items + check.overall.items == full.overall.items == 24
    assert tune.overall.predicted + check.overall.predicted == full.overall.predicted
    assert tune.overall.items == 2 * sum(half_of(f"corpus:doc{d}:s") == "tune" for d in range(12))
    assert 0 < tune.overall.items < 24, "twelve documents fall in both halves"
    for part in (tune, check):
        assert part.kinds["lab"].items == part.kinds["history"].items, "a document's two sentences stay together"
    with pytest.raises(ValueError, match="half must be one of"):
        measure_labelled([path], classifier, "train")


@pytest.mark.data
def test_agentclinic_and_cmb_texts_split_by_case() -> None:
    assert SHARED_DATA.is_dir(), f"the shared data ({SHARED_DATA}) sits beside the checkout in CI"
    for source, items in labelled_case_texts(SHARED_DATA).items():
        cases = Counter(item.case for item in items)
        halves = Counter(half_of(case) for case in cases)
        assert len(cases) > 10 and halves["tune"] > 0 and halves["check"] > 0, source
        assert max(cases.values()) > 1, f"{source}: a case holds several texts, all in its one half"


def test_a_malformed_line_names_the_file_and_line(tmp_path: Path) -> None:
    good = json.dumps(OURS[0])
    for bad, problem in (("{not json", "not valid JSON"), ('{"id": "x", "text": "Hi.", "tier": "T5"}', "T5"),
                         ('{"id": "x", "lang": "en"}', "missing 'text'"), ("[1, 2]", "JSON object")):
        path = tmp_path / "bad.jsonl"
        path.write_text(f"{good}\n\n{bad}\n", encoding="utf-8")
        with pytest.raises(RecordError, match=problem) as raised:
            read_labelled(path)
        assert raised.value.where == f"{path}:3"


@pytest.mark.data
@pytest.mark.model
def test_a_slice_of_the_real_ade_corpus(tmp_path: Path, classifier) -> None:  # type: ignore[no-untyped-def]
    assert ADE_FILE.is_file(), f"the shared data ({SHARED_DATA}) sits beside the checkout in CI"
    every = ADE_FILE.read_text(encoding="utf-8").splitlines()  # ADR sentences first, then the others
    lines = [line for line in every if '"kind": "adr"' in line][:100] + \
        [line for line in every if '"kind": "no_adr"' in line][:100]
    path = tmp_path / "ade_slice.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kinds = Counter(json.loads(line)["kind"] for line in lines)
    assert kinds == {"adr": 100, "no_adr": 100}
    (score,) = measure_labelled([path], classifier).files
    assert {kind: counts.items for kind, counts in score.kinds.items()} == dict(kinds)
    assert score.overall.labelled == kinds["adr"], "ADR sentences are the only ones with a tier"
    assert score.overall.precision(Tier.T1) is None, "every labelled item is T1: precision would be 100 % by design"
    adr = score.adr
    assert adr is not None and (adr.adr, adr.no_adr) == (kinds["adr"], kinds["no_adr"])
    assert adr.adr_t1 == score.kinds["adr"].predicted[Tier.T1] == score.overall.confusion[(Tier.T1, Tier.T1)]
    assert adr.recall == pytest.approx(score.overall.recall(Tier.T1) or 0.0)
    r, f = adr.recall, adr.no_adr_t1_rate
    assert adr.balanced_precision == pytest.approx(r / (r + f) if r + f else 0.0)
    tune = measure_labelled([path], classifier, "tune").files[0]
    check = measure_labelled([path], classifier, "check").files[0]
    assert tune.overall.items + check.overall.items == 200
    assert "ADR recall" in "\n".join(labelled_markdown(measure_labelled([path], classifier)))


@pytest.mark.model
def test_the_command_writes_the_markdown_and_json(tmp_path: Path) -> None:
    folder = tmp_path / "labelled"
    folder.mkdir()
    write_jsonl(folder / "ours.jsonl", OURS)
    write_jsonl(folder / "ade.jsonl", [
        {"id": "ade-9-0", "text": "Rash and fever after carbamazepine.", "lang": "en", "kind": "adr", "tier": "T1",
         "pmid": "9"},
        {"id": "ade-9-1", "text": "He was treated with prednisone.", "lang": "en", "kind": "no_adr", "pmid": "9"}])
    out = tmp_path / "report.md"
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "tiers", "--text-only", "--labelled", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Tier classifier on labelled text (sections hidden), half: all")
    assert f"Command: `ebmrag eval tiers --text-only --labelled {folder} --out {out}`" in text
    assert "### ade.jsonl" in text and "### ours.jsonl" in text and "ADR recall" in text
    as_json = runner.invoke(app, ["eval", "tiers", "--text-only", "--labelled", str(folder / "ours.jsonl"),
                                  "--half", "tune", "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["half"] == "tune" and set(data["labelled"]["files"]) == {"ours.jsonl"}
    expected = sum(half_of(":".join(r["id"].split(":")[:3])) == "tune" for r in OURS if r["text"].strip())
    assert data["labelled"]["files"]["ours.jsonl"]["items"] == expected


def test_the_command_fails_in_one_line_on_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(OURS[0]) + "\n" + '{"id": "x", "text": 5}\n', encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "tiers", "--text-only", "--labelled", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2" in result.output and "Traceback" not in result.output
    missing = runner.invoke(app, ["eval", "tiers", "--text-only", "--labelled", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "none.jsonl" in missing.output
    no_flag = runner.invoke(app, ["eval", "tiers", "--labelled", str(bad)])
    assert no_flag.exit_code == 2 and "--text-only" in no_flag.output
    wrong_half = runner.invoke(app, ["eval", "tiers", "--text-only", "--labelled", str(bad), "--half", "train"])
    assert wrong_half.exit_code == 2 and "half must be one of" in wrong_half.output
