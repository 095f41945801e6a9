"""The compressed state of a lab panel keeps what is abnormal and counts the rest (issue 46)."""

from __future__ import annotations

import pytest

from ebmrag.evidence.entities import PANEL_RULES, EntityCompressor, EntityExtractor, default_extractor
from ebmrag.evidence.result_flags import flags_fingerprint
from ebmrag.evidence.result_tables import vocabulary_fingerprint
from ebmrag.kvcache import digest
from ebmrag.rules import bundled
from ebmrag.vocab.negation import negation


@pytest.fixture(scope="module")
def compressor() -> EntityCompressor:
    return EntityCompressor(default_extractor())


ENGLISH_PANEL = (
    "Renal and liver panel, drawn 07:40: sodium 136 mmol/L, potassium 4.4 mmol/L, chloride 99 mmol/L, "
    "bicarbonate 23 mmol/L, creatinine 212 µmol/L (H), urea 6.1 mmol/L, ALT 31 U/L, albumin 29 g/L."
)
CHINESE_PANEL = (
    "急诊生化：钠 141 mmol/L，钾 3.1 mmol/L ↓，氯 103 mmol/L，肌酐 64 μmol/L，尿素 4.8 mmol/L，"
    "血糖 5.4 mmol/L，谷丙转氨酶 118 U/L 偏高，白蛋白 41 g/L。"
)


def test_an_english_panel_keeps_its_two_abnormal_values_and_counts_six(compressor: EntityCompressor) -> None:
    state = compressor.compress(ENGLISH_PANEL).text
    assert "Creatinine 212 µmol/L (H)" in state, "kept as written, with its flag"
    assert "albumin 29 g/L↓" in state, "a value the text does not flag gets the arrow of its side"
    assert state.endswith("(6 other results normal)")
    for normal in ("sodium 136", "potassium 4.4", "chloride", "bicarbonate", "urea 6.1", "ALT 31"):
        assert normal not in state, state
    assert len(state) < len(ENGLISH_PANEL) / 2


def test_a_chinese_panel_is_counted_in_chinese(compressor: EntityCompressor) -> None:
    state = compressor.compress(CHINESE_PANEL).text
    assert "钾 3.1 mmol/L ↓" in state and "谷丙转氨酶 118 U/L 偏高" in state
    assert state.endswith("（其余6项正常）")
    assert "钠 141" not in state and "血糖" not in state and "白蛋白" not in state


def test_a_panel_with_every_result_normal_shrinks_to_its_count(compressor: EntityCompressor) -> None:
    text = "CBC: WBC 7.2 x10^9/L, Hb 138 g/L, platelets 260 x10^9/L. Chem: Na 140 mmol/L, K 4.1 mmol/L."
    assert compressor.compress(text).text == "(all 5 results normal)"
    chinese = compressor.compress("血常规：白细胞 5.5×10^9/L，血红蛋白 138 g/L，血小板 199×10^9/L。").text
    assert chinese == "血常规。（3项结果均正常）", "the panel's name is a test entity: it says what was normal"


def test_unjudged_results_are_kept_not_counted(compressor: EntityCompressor) -> None:
    text = "Troponin T 48 ng/L, sodium 139 mmol/L, potassium 4.0 mmol/L, lipase 40 U/L."
    state = compressor.compress(text).text
    assert "Troponin T 48 ng/L" in state and "lipase 40 U/L" in state, "no interval: unknown, so kept"
    assert state.endswith("(2 other results normal)")


def test_a_critical_value_is_marked_critical(compressor: EntityCompressor) -> None:
    state = compressor.compress("Na 138 mmol/L, K 6.9 mmol/L, Cl 101 mmol/L, HCO3 22 mmol/L").text
    assert "K 6.9 mmol/L↑ (critical)" in state and "(3 other results normal)" in state


def test_negation_and_other_clauses_survive_the_cut(compressor: EntityCompressor) -> None:
    text = ("Na 139 mmol/L, K 3.9 mmol/L, Cl 102 mmol/L; no hyperkalaemia on the monitor. Biopsy confirmed "
            "adenocarcinoma. Creatinine 1.9 mg/dL.")
    state = compressor.compress(text).text
    assert "no hyperkalaemia" in state.lower() and "adenocarcinoma" in state and "Creatinine 1.9 mg/dL↑" in state
    assert "(3 other results normal)" in state


def test_fewer_than_three_results_are_compressed_as_before(compressor: EntityCompressor) -> None:
    state = compressor.compress("Sodium 139 mmol/L and potassium 4.2 mmol/L, patient enjoyed lunch.").text
    assert "Sodium 139 mmol/L" in state and "potassium 4.2 mmol/L" in state and "normal" not in state


def test_the_fingerprint_holds_the_flags_and_the_panel_rules() -> None:
    """A stored state B made before the panel rules, or with other flags, is stale."""
    extractor = EntityExtractor()
    source = bundled().source("evidence/entities.toml")
    assert extractor.fingerprint == digest("entities", source, vocabulary_fingerprint(), negation().source,
                                           flags_fingerprint(), PANEL_RULES)
    assert extractor.fingerprint != digest("entities", source, vocabulary_fingerprint(), negation().source)


def test_a_cut_never_widens_a_negation_scope(compressor: EntityCompressor) -> None:
    """A line break ends "no"'s scope; cutting the normal line between must not join "rash" to it."""
    text = "No fever\nsodium 140 mmol/L\nrash on both forearms\npotassium 4.1 mmol/L\nchloride 101 mmol/L"
    state = compressor.compress(text).text
    assert "No fever\nrash" in state, state
    extractor = compressor.extractor
    rash = next(e for e in extractor.extract(state) if e.text == "rash")
    assert not rash.negated


@pytest.mark.parametrize(("text", "state"), [("Urine dipstick: negative", "Urine dipstick: negative."),
                                             ("尿常规：阴性", "尿常规：阴性.")])
def test_a_label_heading_a_kept_conclusion_is_kept(compressor: EntityCompressor, text: str, state: str) -> None:
    """A conclusion without what it concludes about ("Negative.") says nothing; the short label before it does."""
    assert compressor.compress(text).text == state


def test_a_colon_inside_an_hla_allele_does_not_cut_the_allele(compressor: EntityCompressor) -> None:
    text = "His genotype report shows HLA-B*58:01 positive, so allopurinol must not be started, the family asked."
    assert "HLA-B*58:01" in compressor.compress(text).text
