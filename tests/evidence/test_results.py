from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.errors import ConfigError
from ebmrag.evidence.entities import EntityCompressor, default_extractor
from ebmrag.evidence.result_tables import DEFAULT_ANALYTES_PATH, DEFAULT_CRITICAL_PATH
from ebmrag.evidence.results import (
    ResultMention,
    ResultVocabulary,
    critical_results,
    load_vocabulary,
    result_mentions,
)


def only(text: str) -> ResultMention:
    found = result_mentions(text)
    assert len(found) == 1, f"{text!r}: {found}"
    return found[0]


@pytest.mark.parametrize(
    ("text", "analyte", "value", "unit", "span"),
    [
        ("K 6.8 mmol/L", "potassium", 6.8, "mmol/L", "K 6.8 mmol/L"),
        ("Repeat labs: K+ = 6.8 at 06:00", "potassium", 6.8, "", "K+ = 6.8"),
        ("He had a potassium of 6.8 mEq/L on arrival.", "potassium", 6.8, "mEq/L", "potassium of 6.8 mEq/L"),
        ("His serum potassium was 6.8 this morning.", "potassium", 6.8, "", "serum potassium was 6.8"),
        ("Na: 118", "sodium", 118.0, "", "Na: 118"),
        ("INR 5.2 on warfarin", "INR", 5.2, "", "INR 5.2"),
        ("Hb 6.1 g/dL", "hemoglobin", 6.1, "g/dL", "Hb 6.1 g/dL"),
        ("血钾6.8mmol/L，患者诉乏力。", "potassium", 6.8, "mmol/L", "血钾6.8mmol/L"),
        ("钾 6.8 mmol/L", "potassium", 6.8, "mmol/L", "钾 6.8 mmol/L"),
        ("血清钾：6.8", "potassium", 6.8, "", "血清钾：6.8"),
        ("K+ 6.8↑", "potassium", 6.8, "", "K+ 6.8"),
        ("肌酐 456 μmol/L", "creatinine", 456.0, "μmol/L", "肌酐 456 μmol/L"),
        ("eGFR 12 mL/min/1.73m2", "eGFR", 12.0, "mL/min/1.73m2", "eGFR 12 mL/min/1.73m2"),
        ("Potassium | 6.8 | mmol/L | H", "potassium", 6.8, "mmol/L", "Potassium | 6.8 | mmol/L"),
        ("Kalium 6,8 mmol/l", "potassium", 6.8, "mmol/l", "Kalium 6,8 mmol/l"),
        ("Troponin T <14 ng/L", "troponin T", 14.0, "ng/L", "Troponin T <14 ng/L"),
        ("Plt 150,000/µL", "platelet count", 150000.0, "/μL", "Plt 150,000/µL"),  # NFKC: micro sign -> mu
        ("血小板 15×10⁹/L", "platelet count", 15.0, "×10^9/L", "血小板 15×10⁹/L"),
        ("HGB 58 g/L, PLT 12", "hemoglobin", 58.0, "g/L", "HGB 58 g/L"),
        ("谷丙转氨酶 1250 U/L", "alanine aminotransferase", 1250.0, "U/L", "谷丙转氨酶 1250 U/L"),
        ("降钙素原 12.5 ng/ml", "procalcitonin", 12.5, "ng/ml", "降钙素原 12.5 ng/ml"),
        ("lactate came back at 5.1", "lactate", 5.1, "", "lactate came back at 5.1"),
    ],
)
def test_layouts(text: str, analyte: str, value: float, unit: str, span: str) -> None:
    mention = result_mentions(text)[0]
    assert (mention.analyte, mention.value, mention.unit) == (analyte, value, unit)
    assert text[mention.start:mention.end] == span


def test_several_results_in_one_line_english_and_chinese() -> None:
    line = "BMP: Na 138, K 4.1, Cl 100, HCO3 24, BUN 20, Cr 1.0, Glu 110. 复查：血钠 131 mmol/L，尿素氮 7.2 mmol/L"
    names = [m.analyte for m in result_mentions(line)]
    assert names == ["sodium", "potassium", "chloride", "bicarbonate", "urea nitrogen", "creatinine", "glucose",
                     "sodium", "urea nitrogen"]


def test_codes_come_from_the_vocabulary() -> None:
    assert only("K 4.1").loinc == "2823-3"
    assert only("血红蛋白 98 g/L").loinc == "718-7"
    assert only("eGFR 45").loinc == "33914-3"
    assert only("Trop 0.5").loinc == "", "an unspecified troponin has no single LOINC code"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("creatinine 2.1 mg/dL", 185.64),  # mg/dL x 88.4 -> µmol/L
        ("Cr 2.1", 185.64),  # bare: only mg/dL is plausible
        ("Cr 456", 456.0),  # bare: only µmol/L is plausible
        ("glucose 90 mg/dL", 4.996),
        ("Hb 6.1 g/dL", 61.0),
        ("Alb 2.1", 21.0),
        ("Ca 8.5", 2.121),
        ("HCT 0.31", 31.0),
        ("WBC 12,400/mm3", 12.4),
        ("PaCO2 5.3 kPa", 39.75),
        ("HbA1c 48 mmol/mol", 6.543),
    ],
)
def test_units_convert_to_the_canonical_unit(text: str, canonical: float) -> None:
    assert only(text).canonical_value == pytest.approx(canonical, rel=1e-3)


def test_a_bare_value_plausible_in_two_units_is_not_guessed() -> None:
    mention = only("Glucose 45")  # 45 mg/dL (2.5 mmol/L) or 45 mmol/L: both possible
    assert mention.canonical_value is None and mention.critical == ""


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("K 6.8 mmol/L", "potassium 6.8 mmol/L ≥ 6.0 (critical high)"),
        ("K 2.3", "potassium 2.3 ≤ 2.5 mmol/L (critical low)"),
        ("Na 118", "sodium 118 ≤ 120 mmol/L (critical low)"),
        ("INR 5.2", "INR 5.2 ≥ 5.0 (critical high)"),
        ("血钾6.8mmol/L", "potassium 6.8 mmol/L ≥ 6.0 (critical high)"),
        ("Hb 6.1 g/dL", "hemoglobin 6.1 g/dL = 61 g/L ≤ 70 (critical low)"),
        ("glucose 500 mg/dL", "glucose 500 mg/dL = 27.8 mmol/L ≥ 27.8 (critical high)"),
        ("glucose 50 mg/dL", "glucose 50 mg/dL = 2.78 mmol/L ≤ 2.8 (critical low)"),
        ("Plt 12,000", "platelet count 12,000 (read as /µL) = 12 10^9/L ≤ 20 (critical low)"),
        ("pH 7.08", "pH 7.08 ≤ 7.2 (critical low)"),
        ("乳酸 6.2 mmol/L", "lactate 6.2 mmol/L ≥ 4.0 (critical high)"),
        ("K >7.0", "potassium >7.0 ≥ 6.0 mmol/L (critical high)"),
        ("血钠 ≤115 mmol/L", "sodium ≤115 mmol/L ≤ 120 (critical low)"),
    ],
)
def test_critical_values_are_flagged(text: str, reason: str) -> None:
    assert [m.critical for m in critical_results(text)] == [reason]


@pytest.mark.parametrize(
    "text",
    ["K 4.1", "Na 138", "INR 2.4", "Hb 10.2 g/dL", "K <6.5", "Plt >10", "Creatinine 2.1 mg/dL", "Trop 5000 ng/L"],
)
def test_values_inside_the_limits_are_not_critical(text: str) -> None:
    assert result_mentions(text) and not critical_results(text)


@pytest.mark.parametrize(
    "text",
    [
        "potassium chloride 20 mEq PO daily",
        "K 20 mEq PO bid",
        "KCl 20 mEq IV",
        "Replete K 4 tabs",
        "Mg 2 IV now",
        "Sodium bicarbonate 50 mEq given.",
        "sodium 2 g diet",
        "氯化钾 10ml 口服",
        "补钾 3g",
        "Seen on 2023-06-12, discharged 12/06/2023.",
        "Na and K were within normal limits, no further labs today.",
        "BP 120/80 mmHg, HR 88, RR 16, T 37.2, SpO2 97%.",
        "Stage 4 chronic kidney disease.",
        "K 20",  # potassium 20 mmol/L is not plausible
        "Na 12",
        "Ca 125",
        "CA 19-9 45 U/mL",
        "pH 5.5",
        "PT 3x/week",
        "vitamin K 10 mg",
        "Vitamin K 10",
        "urine sodium 20 mmol/L",
        "neutrophils 85%",
        "glucose 5% 500 mL",
        "Na 45 years",
        "K 3.5-5.0 mmol/L",
    ],
)
def test_doses_dates_vitals_and_other_words_are_not_results(text: str) -> None:
    assert result_mentions(text) == []


def test_full_width_input_is_normalised_and_spans_index_the_original() -> None:
    text = "化验：Ｋ＋：６．８ ｍｍｏｌ／Ｌ，Ｎａ １１８"
    found = result_mentions(text)
    assert [(m.analyte, m.value, m.unit) for m in found] == [("potassium", 6.8, "mmol/L"), ("sodium", 118.0, "")]
    assert text[found[0].start:found[0].end] == "Ｋ＋：６．８ ｍｍｏｌ／Ｌ"
    assert text[found[1].start:found[1].end] == "Ｎａ １１８"
    assert all(m.critical for m in found)


def test_spans_survive_characters_that_expand_under_nfkc() -> None:
    text = "T 38.5℃, K 6.8"  # ℃ becomes two characters, °C
    mention = only(text)
    assert text[mention.start:mention.end] == "K 6.8"


# ------------------------------------------------------------------------------------------ compression
@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            "Labs this morning: sodium 128, potassium 6.8 mmol/L, creatinine 2.1 mg/dL, the patient feels fine "
            "and has no complaints today.",  # every result abnormal: a panel keeps them all (a normal one is counted)
            ["sodium 128", "potassium 6.8 mmol/L", "creatinine 2.1 mg/dL"],
        ),
        ("血钾6.8mmol/L，患者诉乏力。", ["血钾6.8mmol/L"]),
        ("Seen on the ward round with family, K+ 6.8↑, Na 118, all questions answered.", ["K+ 6.8", "Na 118"]),
        ("患者乏力，血清钾：6.8，心电图示T波高尖。", ["血清钾：6.8"]),
        ("Chemistry: Sodium: 138; the family visited and asked about parking.", ["Sodium: 138"]),
    ],
)
def test_compressed_state_keeps_the_analyte_and_its_value(text: str, kept: list[str]) -> None:
    state_b = EntityCompressor(default_extractor()).compress(text)
    for piece in kept:
        assert piece.lower() in state_b.text.lower(), state_b.text
    assert state_b.entities_kept == state_b.entities_total


def test_compression_still_drops_what_holds_no_entity() -> None:
    text = "Labs this morning: potassium 6.8 mmol/L, the patient enjoyed his breakfast and asked about parking."
    state_b = EntityCompressor(default_extractor()).compress(text).text
    assert "6.8 mmol/L" in state_b and "parking" not in state_b


# ------------------------------------------------------------------------------------------ vocabulary files
def test_vocabulary_is_loaded_once() -> None:
    assert load_vocabulary() is load_vocabulary()
    assert len(load_vocabulary().analytes) >= 40


def _copy(tmp_path: Path, analytes: str | None = None, critical: str | None = None) -> tuple[Path, Path]:
    a, c = tmp_path / "analytes.toml", tmp_path / "critical_values.toml"
    a.write_text(analytes if analytes is not None else DEFAULT_ANALYTES_PATH.read_text(encoding="utf-8"),
                 encoding="utf-8")
    c.write_text(critical if critical is not None else DEFAULT_CRITICAL_PATH.read_text(encoding="utf-8"),
                 encoding="utf-8")
    return a, c


def test_a_custom_vocabulary_reads_like_the_bundled_one(tmp_path: Path) -> None:
    vocabulary = ResultVocabulary.from_files(*_copy(tmp_path))
    assert vocabulary.mentions("K 6.8") == result_mentions("K 6.8")


_ORIGINAL = DEFAULT_ANALYTES_PATH.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("analytes", "critical", "message"),
    [
        ("[[analyte]\nname = 'x'", None, r"analytes\.toml is not valid TOML"),
        (_ORIGINAL.replace('range = [1.0, 12.0]', 'range = [12.0, 1.0]'), None, r"#\d+ \(potassium\): range"),
        (_ORIGINAL.replace('"2823-3"', '"2823-4"'), None, r"\(potassium\): '2823-4' is not a LOINC code"),
        (_ORIGINAL.replace('units = { "mmol/L" = 1.0, "mEq/L" = 1.0 }', 'units = { "mEq/L" = "one" }', 1), None,
         r"\(potassium\): unit 'mEq/L' needs a factor"),
        (_ORIGINAL.replace('abbreviations = ["Na", "Na+", "NA"]', 'abbreviations = ["Na", "K"]'), None,
         r"\(sodium\): 'K' is already listed by \[\[analyte\]\] #\d+ \(potassium\)"),
        (_ORIGINAL.replace('name = "potassium"', 'name = "potassium"\ncolour = "red"'), None,
         r"\(potassium\): unknown keys \['colour'\]"),
        (None, "[potassium]\nunit = 'mg/dL'\nhigh = 6.0\n", r"critical_values\.toml: \[potassium\]: unit 'mg/dL'"),
        (None, "[glucose]\nunit = 'mmol/L'\nhigh = 500\n", r"\[glucose\]: limit 500.* outside the plausible range"),
        (None, "[unobtainium]\nunit = ''\nhigh = 1\n", r"\[unobtainium\]: no analyte of that name"),
        (None, "[potassium]\nunit = 'mmol/L'\nlow = 6.0\nhigh = 2.5\n", r"\[potassium\]: needs low and/or high"),
    ],
)
def test_bad_vocabulary_files_name_the_file_and_entry(tmp_path: Path, analytes: str | None, critical: str | None,
                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ResultVocabulary.from_files(*_copy(tmp_path, analytes, critical))


@pytest.mark.parametrize("text", ["凌晨急查血钠回报为118mmol/L，已通知上级医生。", "血钾复查为6.6mmol/L，予降钾处理。"])
def test_a_chinese_reporting_verb_between_the_name_and_its_value(text: str) -> None:
    """回报 / 复查为 ("came back at", "on repeat was") join a name to its value as "came back at" does in English."""
    (found,) = result_mentions(text)
    assert found.critical, found
