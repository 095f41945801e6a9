"""The second reading (evidence.second_reading): which texts the recogniser reads, and how its answer is merged.

The merge is tested with `Recognition` values written here (what the model would say), so the policy is checked
apart from the model's weights; tests/evidence/test_recogniser.py runs the shipped model itself."""

from __future__ import annotations

import pytest

from ebmrag.errors import ConfigError
from ebmrag.evidence.recogniser import EntitySpan, Recognition
from ebmrag.evidence.second_reading import SecondReading
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier, TierDecision

NURSING = TierDecision(Tier.T4, "section.workflow")


@pytest.fixture(scope="module")
def reading() -> SecondReading:
    return TierClassifier().second_reading


def said(kind: str, p: float = 0.97, *spans: EntitySpan) -> Recognition:
    return Recognition({kind: p}, (kind,), spans)


@pytest.mark.parametrize(("text", "shape"), [
    ("Came out in hives the morning after her first dose of cefalexin.", "drug_event"),
    ("Carrier of a pathogenic PALB2 c.3113G>A variant.", "gene"),
    ("Resection: adenocarcinoma, moderately differentiated, pT3 N1b.", "stage_grade"),
    ("右肺腺癌ⅢA期", "stage_grade"),
    ("Cr 2.9 mg/dL this morning.", "analyte_value"),
    ("Said she is allergic to sulfa.", "allergy_word"),
    ("Patient ambulated to the bathroom with assistance.", ""),
    ("Plan discussed with family at the bedside.", ""),
])
def test_the_shapes_that_send_a_text_to_the_model(reading: SecondReading, text: str, shape: str) -> None:
    assert reading.shape(text) == shape


def test_a_kind_the_model_confirms_is_decided_as_the_rule_file_says(reading: SecondReading) -> None:
    text = "Came out in hives the morning after her first dose of cefalexin."
    drug = EntitySpan("DRUG", 54, 63, "cefalexin")
    decision = reading.merge(text, NURSING, "drug_event", said("adr", 0.93, drug))
    rule = next(r for r in TierClassifier().rules if r.id == "text.adr")
    assert (decision.tier, decision.must_keep, decision.standing) == (rule.tier, rule.must_keep, rule.standing)
    assert decision.rule_id == "model:recogniser:adr p=0.93"
    assert decision.finding == "DRUG=cefalexin"


def test_a_taken_back_allergy_is_never_confirmed_by_the_model(reading: SecondReading) -> None:
    for text in ("Penicillin allergy label removed after a negative oral challenge.", "否认青霉素过敏史"):
        decision = reading.merge(text, NURSING, "allergy_word", said("allergy"))
        assert decision == NURSING, text


def test_the_model_never_takes_a_more_protective_decision_back(reading: SecondReading) -> None:
    critical = TierDecision(Tier.T2, "text.result.critical", critical=True)
    assert reading.merge("K 6.9", critical, "analyte_value", said("critical_result")) == critical
    allergy = TierDecision(Tier.T1, "text.allergy.reaction", standing=True, must_keep=True, always="allergy")
    assert reading.merge("hives with cefalexin", allergy, "drug_event", said("pathology")) == allergy


def test_a_shape_nobody_confirms_is_a_possible_critical_fact_above_the_utility_pool(reading: SecondReading) -> None:
    text = "Resection: adenocarcinoma, moderately differentiated, pT3 N1b."
    unconfirmed = Recognition({"pathology": 0.2}, ())
    decision = reading.merge(text, NURSING, "stage_grade", unconfirmed)
    assert (decision.tier, decision.standing, decision.rule_id) == (Tier.T2, True, "possible_critical.stage_grade")
    assert reading.merge(text, NURSING, "stage_grade", None).rule_id == "possible_critical.stage_grade"
    # an allergy word alone is not a fact, and a T2 finding is not made less by being unsure
    assert reading.merge("allergy band on", NURSING, "allergy_word", unconfirmed) == NURSING
    routine = reading.merge("Cr 1.0 mg/dL", NURSING, "analyte_value", unconfirmed)
    assert (routine.tier, routine.standing) == (Tier.T2, False), "a value is not filler, nor a lasting fact"
    lab = TierDecision(Tier.T2, "text.result")
    assert reading.merge("Cr 1.0 mg/dL", lab, "analyte_value", unconfirmed) == lab


@pytest.mark.parametrize(("table", "complaint"), [
    ({"allergy": "no.such.rule"}, "allergy must name a rule"),
    ({"possible_tier": "T9"}, "possible_tier"),
    ({"stage_grade": ["(unclosed"]}, "stage_grade"),
])
def test_a_bad_recogniser_table_is_refused_naming_the_key(table: dict[str, object], complaint: str) -> None:
    rules = {r.id: r.decision() for r in TierClassifier().rules}
    base = {"allergy": "text.allergy.reaction", "adr": "text.adr", "pathology": "text.pathology.result",
            "genetic": "text.genetic.result", "critical_result": "text.result.critical"}
    with pytest.raises(ConfigError, match=complaint):
        SecondReading.parse(base | table, rules, "tiers.toml")


def test_pack_json_reports_what_possible_critical_facts_cost_the_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A stage nobody confirms is held above the utility pool; `pack --json` says how many such facts were packed,
    their tokens and how many were left out, and marks each with its rule."""
    import json

    from typer.testing import CliRunner

    from ebmrag.cli import app

    chart = tmp_path / "chart.json"
    chart.write_text(json.dumps({"patient_id": "possible-1", "fragments": [
        {"id": "stage", "text": "Restaging scan reviewed: stage IIIB per the oncology letter.",
         "section": "Nursing note"},
        {"id": "walk", "text": "Walked to the day room with a frame.", "section": "Nursing note"},
    ]}))
    rules_only = tmp_path / "rules_only.toml"  # the report, not the model's reading, is under test
    rules_only.write_text('[models]\nrecogniser = ""\n')
    out = CliRunner().invoke(app, ["pack", str(chart), "--query", "What is her cancer stage?", "--window", "256",
                                   "--json", "--config", str(rules_only)])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    packed = {p["fragment_id"]: p for p in result["packed"]}
    assert packed["stage"]["rule"] == "possible_critical.stage_grade", packed["stage"]
    assert result["possible_critical"] == {"packed": 1, "tokens": packed["stage"]["tokens"], "left_out": 0}
