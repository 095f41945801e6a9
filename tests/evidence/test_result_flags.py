"""Whether a result, and a text of results, is critical, abnormal or normal (evidence/result_flags.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ebmrag.errors import ConfigError
from ebmrag.evidence.result_flags import (
    ABNORMAL,
    CRITICAL,
    NORMAL,
    flag_grammar,
    flagged_results,
    result_flag,
    result_readings,
)
from ebmrag.evidence.result_tables import DEFAULT_ANALYTES_PATH, DEFAULT_CRITICAL_PATH, read_result_tables
from ebmrag.evidence.results import result_mentions
from ebmrag.rules import FOLDER, RuleBook


def flags_of(text: str) -> dict[str, str]:
    return {f.mention.analyte: f.flag for f in flagged_results(text)}


# ------------------------------------------------------------------------------------------------ per result
def test_a_basic_metabolic_panel_within_its_intervals_is_normal() -> None:
    line = "BMP 06:10: Na 139 mmol/L, K 4.3 mmol/L, Cl 103 mmol/L, HCO3 25 mmol/L, BUN 16 mg/dL, Cr 0.9 mg/dL"
    assert set(flags_of(line).values()) == {NORMAL} and len(flags_of(line)) == 6
    assert result_flag(line) == NORMAL
    assert all("within the adult reference interval" in f.why for f in flagged_results(line))


def test_one_flagged_value_makes_the_panel_abnormal() -> None:
    line = "Na 137 mmol/L, K 5.2 mmol/L H, glucose 5.1 mmol/L"
    flags = {f.mention.analyte: (f.flag, f.why) for f in flagged_results(line)}
    assert flags["potassium"] == (ABNORMAL, "flagged H"), "the laboratory's flag wins over the interval (5.3)"
    assert flags["sodium"][0] == flags["glucose"][0] == NORMAL
    assert result_flag(line) == ABNORMAL


@pytest.mark.parametrize(
    ("text", "flag", "why"),
    [
        ("K 5.4 (3.5-5.0)", ABNORMAL, "above its reference range 3.5-5.0"),
        ("Potassium 5.2 mmol/L ref 3.5–5.0", ABNORMAL, "above its reference range 3.5-5.0"),
        ("Sodium 131 mmol/L (135–145)", ABNORMAL, "below its reference range 135-145"),
        ("CRP 3 mg/L (<5)", NORMAL, "within its reference range <5"),
        ("血红蛋白 108 g/L 参考值 130-175", ABNORMAL, "below its reference range 130-175"),
        ("Glucose 6.4 mmol/L (3.9-7.8)", NORMAL, "within its reference range 3.9-7.8"),
        ("Creatinine 1.6 mg/dL (0.6-1.2) H", ABNORMAL, "flagged H"),
        ("K 4.6 N", NORMAL, "flagged N"),
        ("INR 3.1 HH", CRITICAL, "flagged HH"),
    ],
)
def test_written_flags_and_ranges(text: str, flag: str, why: str) -> None:
    (found,) = flagged_results(text)
    assert (found.flag, found.why) == (flag, why)


def test_a_written_range_wins_over_the_adult_interval() -> None:
    """5.2 is above the adult interval (3.5-5.0) but inside this laboratory's own range; 4.9 the other way."""
    assert flags_of("K 5.2 (3.5-5.5)") == {"potassium": NORMAL}
    assert flags_of("K 5.2") == {"potassium": ABNORMAL}
    assert flags_of("K 4.9 (3.5-4.8)") == {"potassium": ABNORMAL}


def test_a_critical_potassium_is_critical() -> None:
    (found,) = flagged_results("Repeat potassium 6.7 mmol/L, ECG requested.")
    assert found.flag == CRITICAL and "critical high" in found.why
    assert result_flag("Repeat potassium 6.7 mmol/L, ECG requested.") == CRITICAL


def test_chinese_panel_lines_with_arrows_and_words() -> None:
    line = "血常规：白细胞 13.8×10⁹/L ↑，血红蛋白 96 g/L 偏低，血小板 188×10⁹/L"
    found = {f.mention.analyte: (f.flag, f.why) for f in flagged_results(line)}
    assert found["white blood cell count"] == (ABNORMAL, "flagged ↑")
    assert found["hemoglobin"] == (ABNORMAL, "flagged 偏低")
    assert found["platelet count"][0] == NORMAL
    assert result_flag(line) == ABNORMAL


def test_a_chinese_panel_without_separators_is_read_whole() -> None:
    """"×1" (a dose given once) once matched inside "×10^9/L" and turned the results before it into doses."""
    line = "白细胞 6.1×10^9/L 血红蛋白 131 g/L 血小板 205×10⁹/L"
    assert [m.analyte for m in result_mentions(line)] == ["white blood cell count", "hemoglobin", "platelet count"]
    assert result_flag(line) == NORMAL


def test_a_letter_before_a_number_is_the_next_analyte_not_a_flag() -> None:
    """In "WBC 14.2×10^9/L N 81%", N is neutrophils: the count stays above its interval."""
    assert flags_of("WBC 14.2×10^9/L N 81%") == {"white blood cell count": ABNORMAL}


def test_sexes_differ_so_the_interval_is_their_intersection() -> None:
    """Calling a result normal sets it aside; a value abnormal for either sex stays in view."""
    assert flags_of("Hb 121 g/L") == {"hemoglobin": ABNORMAL}, "low for a man"
    assert flags_of("Hb 170 g/L") == {"hemoglobin": ABNORMAL}, "high for a woman"
    assert flags_of("Hb 140 g/L") == {"hemoglobin": NORMAL}


def test_a_value_without_an_interval_or_a_flag_is_unknown() -> None:
    (found,) = flagged_results("Troponin T 9 ng/L")
    assert found.flag == "" and "no adult reference interval" in found.why
    assert result_flag("Troponin T 9 ng/L") == ""


def test_a_flag_that_opens_a_remark_covers_the_remark() -> None:
    text = "Creatinine 2.6 mg/dL (high; 1.0 mg/dL last month), Na 138"
    reading = result_readings(text)[0]
    assert reading.result.why == "flagged high" and reading.written
    assert text[reading.result.mention.start:reading.end].endswith("last month)")


# ------------------------------------------------------------------------------------------------ per text
@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("No abnormality detected.", NORMAL),
        ("CT head: no acute intracranial abnormality.", NORMAL),
        ("Urine drug screen negative.", NORMAL),
        ("Liver enzymes are not elevated.", NORMAL),
        ("肝功能未见异常。", NORMAL),
        ("尿常规正常，大便隐血阴性。", NORMAL),
        ("Electrolytes within normal limits.", NORMAL),
        ("Na 140, K 4.0, all within normal limits today.", NORMAL),
        ("Haemoglobin low, ferritin pending.", ABNORMAL),
        ("血钾偏低，已口服补钾。", ABNORMAL),
        ("Blood cultures positive for gram-negative rods.", ABNORMAL),
        ("无机磷降低。", ABNORMAL),  # 无 inside the analyte's name negates nothing
    ],
)
def test_statements_in_words(text: str, flag: str) -> None:
    assert result_flag(text) == flag


@pytest.mark.parametrize(
    "text",
    [
        "No abnormal findings, but a new cough since last night.",
        "Labs unremarkable. Started ceftriaxone for suspected pneumonia.",
        "K 4.2 mmol/L, then furosemide was held.",
        "血常规正常，患者诉胸闷。",
        "Seen on the ward round, comfortable and eating.",
        "Started low-dose aspirin and high-flow oxygen.",  # direction words without an analyte are not judgements
        "Na 139 mmol/L, RBC 4.1 x10^12/L",  # a value not read is not known to be normal
        "",
    ],
)
def test_a_text_that_says_something_else_is_not_normal(text: str) -> None:
    assert result_flag(text) == ""


def test_critical_outranks_abnormal_and_normal_in_one_text() -> None:
    text = "Na 126 mmol/L L, glucose 2.2 mmol/L, CRP unremarkable."
    assert result_flag(text) == CRITICAL


# ------------------------------------------------------------------------------------------------ the tables
def _copy_rules(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return folder


@pytest.mark.parametrize(("interval", "error"), [
    ("[3.5, 53.0]", r"potassium.*plausible range"),  # outside what a potassium can be
    ("[3.5, 6.5]", r"\[potassium\].*inside the reference interval"),  # holds the critical limit 6.0
])
def test_a_reference_interval_that_contradicts_the_tables_is_refused(tmp_path: Path, interval: str,
                                                                      error: str) -> None:
    analytes = tmp_path / "analytes.toml"
    analytes.write_text(DEFAULT_ANALYTES_PATH.read_text(encoding="utf-8").replace(
        "reference = [3.5, 5.0]", f"reference = {interval}"), encoding="utf-8")
    with pytest.raises(ConfigError, match=error):
        read_result_tables(analytes, DEFAULT_CRITICAL_PATH)


def test_a_normal_code_unknown_to_hl7_is_refused(tmp_path: Path) -> None:
    folder = _copy_rules(tmp_path)
    path = folder / "evidence" / "result_flags.toml"
    path.write_text(path.read_text(encoding="utf-8").replace('normal_codes = ["N"]', 'normal_codes = ["OK"]'),
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="normal_codes"):
        flag_grammar(RuleBook(folder))


def test_the_bundled_rules_build() -> None:
    grammar = flag_grammar()
    assert grammar.flag_class["HH"] == CRITICAL and grammar.flag_class["H"] == ABNORMAL
    assert grammar.flag_class["N"] == NORMAL and grammar.flag_class["critically high"] == CRITICAL


def test_a_direction_word_about_no_analyte_is_neither_abnormal_nor_normal() -> None:
    assert result_flag("Oxygen flow high.") == ""
    assert result_flag("Potassium high.") == ABNORMAL
    assert result_flag("K 4.0 mmol/L, not low.") == NORMAL
