"""Issue 47: the drug-decision facts from every source (records.fhir.chart_facts -> the face sheet's "Drug decision
facts" line): kidney and liver conditions beside the results, pregnancy and lactation from conditions and
observations, a weight checked against the same period's height and BMI, drug levels judged against their
therapeutic range when the laboratory sent no flag (rules/records/conditions.toml, drug_levels.toml, units.toml)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ebmrag.records.dates import Today
from ebmrag.records.fhir.bundle import read_fhir_bundle
from ebmrag.records.fhir.chart_facts import ChartFacts
from ebmrag.records.fhir.measures import converted, drug_level_flag, parse_unit
from ebmrag.records.fragment import PatientRecord
from ebmrag.records.loaders import load_record

NOW = datetime(2024, 6, 1, 9, 0, tzinfo=UTC)
TODAY = Today(NOW)
ME = {"reference": "Patient/p1"}
PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1988-02-10"}
LOINC, SNOMED = "http://loinc.org", "http://snomed.info/sct"
ICD10 = "http://hl7.org/fhir/sid/icd-10-cm"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fhir_charts"


def read(*resources: dict[str, Any]) -> tuple[PatientRecord, ChartFacts]:
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": r} for r in (PATIENT, *resources)]}
    return read_fhir_bundle(bundle, "chart.json", today=TODAY)


def line(record: PatientRecord, fragment_id: str) -> str:
    return next((f.text for f in record.fragments if f.id == fragment_id), "")


def patient_line(record: PatientRecord) -> str:
    return line(record, "Patient/p1")


def condition(rid: str, system: str, code: str, display: str, *, status: str = "active",
              verification: str = "confirmed", **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Condition", "id": rid, "subject": ME,
            "clinicalStatus": {"coding": [{"code": status}]},
            "verificationStatus": {"coding": [{"code": verification}]},
            "code": {"coding": [{"system": system, "code": code, "display": display}]}, **extra}


def worded(rid: str, words: str, **extra: Any) -> dict[str, Any]:
    """A Condition known only by the chart's own words (a local code without a display)."""
    return {"resourceType": "Condition", "id": rid, "subject": ME, "clinicalStatus": {"coding": [{"code": "active"}]},
            "code": {"coding": [{"system": "urn:oid:1.2.3.4", "code": "X1"}], "text": words}, **extra}


def measured(rid: str, loinc: str, value: float, unit: str, when: str, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Observation", "id": rid, "status": "final", "subject": ME, "effectiveDateTime": when,
            "code": {"coding": [{"system": LOINC, "code": loinc}]},
            "valueQuantity": {"value": value, "unit": unit, "system": "http://unitsofmeasure.org", "code": unit},
            **extra}


# ------------------------------------------------------------------------------------------------ kidney
def test_a_ckd_stage_condition_alone_gives_the_renal_fact() -> None:
    record, facts = read(condition("ckd", SNOMED, "431857002", "Chronic kidney disease stage 4 (disorder)",
                                   onsetDateTime="2023-05-02"))
    assert line(record, "summary/drug-facts") == "Drug decision facts: Renal: CKD stage 4 (Condition, 2023-05-02)."
    assert [(c.name, c.shown, c.by_code) for c in facts.conditions] == [("CKD", "CKD stage 4", True)]


def test_the_stage_comes_from_an_icd10_code_and_from_words_in_roman_numerals() -> None:
    _, by_icd = read(condition("c1", ICD10, "N18.31", "Chronic kidney disease, stage 3a"))
    _, by_words = read(worded("c2", "Chronische Niereninsuffizienz Stadium IV"))
    assert [c.shown for c in by_icd.conditions] == ["CKD stage 3a"]
    assert [c.shown for c in by_words.conditions] == ["CKD stage 4"]
    assert not by_words.conditions[0].by_code


def test_the_renal_condition_leads_and_the_results_follow_with_their_date() -> None:
    record, _ = read(condition("esrd", ICD10, "N18.6", "End stage renal disease", onsetDateTime="2022-01-10"),
                     measured("gfr", "62238-1", 12, "mL/min/{1.73_m2}", "2024-05-20"))
    assert line(record, "summary/drug-facts") == ("Drug decision facts: Renal: CKD stage 5, end-stage (Condition, "
                                                  "2022-01-10); results (2024-05-20): eGFR 12 mL/min/{1.73_m2}.")


def test_a_kidney_transplant_status_is_a_renal_fact() -> None:
    record, _ = read(condition("tx", ICD10, "Z94.0", "Kidney transplant status", recordedDate="2019-03-04"))
    assert "Renal: kidney transplant (Condition, 2019-03-04)" in line(record, "summary/drug-facts")
    by_oid, _ = read(condition("tx", "urn:oid:2.16.840.1.113883.6.96", "737295003", "Transplanted kidney present"))
    assert "Renal: kidney transplant (Condition)" in line(by_oid, "summary/drug-facts")
    _, rejected = read(worded("tx2", "Nierentransplantat, chronische Abstoßung"))
    assert [c.shown for c in rejected.conditions] == ["kidney transplant, rejection"]


def test_dialysis_by_code_by_words_and_by_a_recent_procedure() -> None:
    _, coded = read(condition("d1", ICD10, "Z99.2", "Dependence on renal dialysis"))
    _, words = read(worded("d2", "Peritoneal dialysis patient"))
    session = {"resourceType": "Procedure", "id": "p", "status": "completed", "subject": ME,
               "code": {"coding": [{"system": SNOMED, "code": "302497006", "display": "Hemodialysis"}]}}
    _, recent = read({**session, "performedDateTime": "2024-05-28"})
    _, old = read({**session, "performedDateTime": "2019-05-28"})
    assert [c.shown for c in coded.conditions] == ["dialysis"]
    assert [c.shown for c in words.conditions] == ["peritoneal dialysis"]
    assert [(c.shown, c.source.kind) for c in recent.conditions] == [("haemodialysis", "Procedure")]
    assert old.conditions == (), "a dialysis session five years ago does not say the patient is on dialysis"


@pytest.mark.parametrize("resource", [
    condition("r1", SNOMED, "431857002", "Chronic kidney disease stage 4", status="resolved"),
    condition("r2", SNOMED, "431857002", "Chronic kidney disease stage 4", status="inactive"),
    condition("r3", SNOMED, "431857002", "Chronic kidney disease stage 4", verification="refuted"),
    condition("r4", SNOMED, "431857002", "Chronic kidney disease stage 4", verification="entered-in-error"),
    condition("r5", SNOMED, "431857002", "Chronic kidney disease stage 4", abatementDateTime="2023-01-01"),
    worded("r6", "No chronic kidney disease"),
    worded("r7", "Family history of chronic kidney disease"),
    worded("r8", "Living kidney donor, renal transplant evaluation"),
], ids=["resolved", "inactive", "refuted", "entered-in-error", "abated", "negated", "family-history", "donor"])
def test_a_condition_that_does_not_stand_or_is_not_the_patients_is_no_fact(resource: dict[str, Any]) -> None:
    record, facts = read(resource)
    assert facts.conditions == ()
    assert line(record, "summary/drug-facts") == ""


# ------------------------------------------------------------------------------------------------ liver
def test_liver_cirrhosis_with_its_child_pugh_class_and_a_liver_disease_only_when_nothing_more_specific() -> None:
    record, facts = read(condition("cir", SNOMED, "19943007", "Cirrhosis of liver", onsetDateTime="2021-07-01"),
                         condition("fat", ICD10, "K76.0", "Fatty (change of) liver, not elsewhere classified"),
                         measured("alt", "1742-6", 64, "U/L", "2024-05-20"))
    assert line(record, "summary/drug-facts") == ("Drug decision facts: Hepatic: cirrhosis (Condition, 2021-07-01); "
                                                  "results (2024-05-20): ALT 64 U/L.")
    _, staged = read(worded("c", "Alcoholic cirrhosis, Child-Pugh class b"))
    assert [c.shown for c in staged.conditions] == ["cirrhosis, Child-Pugh B"]
    _, fatty = read(condition("fat", ICD10, "K76.0", "Fatty liver"))
    assert [(c.name, c.shown) for c in fatty.conditions] == [("liver disease", "Fatty liver")]
    assert [c.group for c in facts.conditions] == ["hepatic"]


# ------------------------------------------------------------------------------------------------ pregnancy
def test_a_recent_pregnancy_condition_is_current_and_one_whose_due_date_passed_is_past() -> None:
    current, facts = read(condition("preg", ICD10, "Z34.01", "Encounter for supervision of normal first pregnancy",
                                    onsetDateTime="2024-02-01"))
    assert facts.pregnancy.current
    assert "pregnant (Encounter for supervision of normal first pregnancy, recorded 2024-02-01)" in \
        patient_line(current)
    due = {"resourceType": "Observation", "id": "edd", "status": "final", "subject": ME,
           "effectiveDateTime": "2022-11-01", "valueDateTime": "2023-05-20",
           "code": {"coding": [{"system": LOINC, "code": "11778-8"}]}}
    past, old = read(condition("preg", SNOMED, "77386006", "Pregnant", onsetDateTime="2022-10-01"), due)
    assert not old.pregnancy.current
    said = patient_line(past)
    assert "pregnant (" not in said and "not current: past pregnancy" in said, said


def test_a_pregnancy_known_by_its_words_alone_and_a_pregnancy_test_that_is_none() -> None:
    _, high_risk = read(worded("p", "High risk pregnancy, 24 weeks", onsetDateTime="2024-01-15"))
    _, test = read(worded("t", "Pregnancy test negative", onsetDateTime="2024-05-15"))
    assert high_risk.pregnancy.current
    assert test.pregnancy.newest is None


def test_an_ended_pregnancy_is_shown_as_past_never_as_current() -> None:
    record, facts = read(condition("preg", SNOMED, "72892002", "Normal pregnancy", status="resolved",
                                   onsetDateTime="2023-09-01", abatementDateTime="2024-04-20"))
    assert not facts.pregnancy.current
    assert "pregnancy (Normal pregnancy, recorded 2023-09-01; not current: past pregnancy, ended 2024-04-20)" in \
        patient_line(record)


def test_lactation_from_a_status_observation_and_from_a_condition() -> None:
    status = {"resourceType": "Observation", "id": "bf", "status": "final", "subject": ME,
              "effectiveDateTime": "2024-05-02", "code": {"coding": [{"system": LOINC, "code": "63895-7"}]},
              "valueCodeableConcept": {"text": "Exclusively breastfeeding"}}
    observed, _ = read(status)
    assert "lactation Exclusively breastfeeding (2024-05-02)" in patient_line(observed)
    stated, facts = read(condition("lac", ICD10, "Z39.1", "Encounter for care and examination of lactating mother",
                                   recordedDate="2024-04-11"))
    assert facts.pregnancy.lactation is not None
    assert "lactation Encounter for care and examination of lactating mother (Condition, 2024-04-11)" in \
        patient_line(stated)


# ------------------------------------------------------------------------------------------------ body measures
def test_the_weight_is_shown_with_its_date_and_is_the_dosing_weight() -> None:
    record, facts = read(measured("w", "29463-7", 70, "kg", "2024-01-03"))
    assert line(record, "summary/drug-facts") == "Drug decision facts: Body (2024-01-03): weight 70 kg."
    assert facts.dosing_weight is not None and facts.dosing_weight.value == "70 kg"


def test_a_weight_that_contradicts_height_and_bmi_is_flagged_and_not_the_dosing_weight() -> None:
    record, facts = read(measured("w", "29463-7", 7, "kg", "2024-01-03"),
                         measured("h", "8302-2", 170, "cm", "2024-01-03"),
                         measured("b", "39156-5", 24, "kg/m2", "2024-01-03"))
    assert facts.dosing_weight is None
    assert line(record, "summary/drug-facts") == (
        "Drug decision facts: Body (2024-01-03): weight 7 kg (contradicts height 170 cm and BMI 24 kg/m2 of "
        "2024-01-03: not used for dosing), height 170 cm, BMI 24 kg/m2.")


def test_a_weight_that_agrees_with_height_and_bmi_stands_and_one_in_pounds_is_named() -> None:
    _, agrees = read(measured("w", "29463-7", 69.5, "kg", "2024-01-03"),
                     measured("h", "8302-2", 1.70, "m", "2024-01-02"),
                     measured("b", "39156-5", 24, "kg/m2", "2024-01-03"))
    assert agrees.dosing_weight is not None and not agrees.labs["weight"][0].caution
    _, pounds = read(measured("w", "29463-7", 154, "kg", "2024-01-03"),
                     measured("h", "8302-2", 68, "[in_i]", "2024-01-03"),
                     measured("b", "39156-5", 23.4, "kg/m2", "2024-01-03"))
    assert pounds.dosing_weight is None
    assert "agrees if read in lb" in pounds.labs["weight"][0].caution


def test_a_weight_in_an_implausible_unit_is_flagged() -> None:
    _, grams = read(measured("w", "29463-7", 72000, "kg", "2024-01-03"))
    _, length = read(measured("w", "29463-7", 72, "cm", "2024-01-03"))
    assert grams.labs["weight"][0].caution == "not a plausible weight in kg (perhaps g): not used for dosing"
    assert length.labs["weight"][0].caution == "the unit 'cm' is not a unit of weight: not used for dosing"
    assert grams.dosing_weight is None and length.dosing_weight is None
    _, small = read(measured("w", "29463-7", 70, "g", "2024-01-03"))
    assert small.labs["weight"][0].caution.startswith("not a plausible weight in g (perhaps kg or lb)")
    _, newborn = read(measured("w", "29463-7", 3400, "g", "2024-01-03"))
    assert newborn.dosing_weight is not None


# ------------------------------------------------------------------------------------------------ drug levels
def test_units_are_compared_by_ucum_arithmetic_only() -> None:
    assert converted(3.1, "ng/mL", "ug/L") == pytest.approx(3.1)
    assert converted(3.0, "mg/dL", "mg/L") == pytest.approx(30.0)
    assert converted(1.0, "mmol/L", "mg/L") is None, "a molar mass is no unit's to know"
    assert parse_unit("mL/min/1.73m2") is None and parse_unit("µg/mL") == parse_unit("mg/L")


def test_a_digoxin_level_above_its_range_is_flagged_on_its_line_and_on_the_face_sheet() -> None:
    digoxin = measured("dig", "10535-3", 3.1, "ng/mL", "2024-05-30",
                       code={"coding": [{"system": LOINC, "code": "10535-3"}], "text": "Digoxin"})
    record, facts = read(digoxin)
    assert drug_level_flag(digoxin) == "above therapeutic range (0.5–2 ng/mL)"
    assert "Digoxin: 3.1 ng/mL (flag above therapeutic range (0.5–2 ng/mL))." in line(record, "Observation/dig")
    assert facts.drug_levels["digoxin"][0].caution == "above therapeutic range (0.5–2 ng/mL)"
    assert line(record, "summary/drug-facts") == ("Drug decision facts: Drug levels (2024-05-30): digoxin 3.1 ng/mL "
                                                  "(above therapeutic range (0.5–2 ng/mL)).")
    same_in_ug_per_l = measured("dig2", "10535-3", 3.1, "ug/L", "2024-05-30")
    assert drug_level_flag(same_in_ug_per_l) == "above therapeutic range (0.5–2 ng/mL)"


def test_a_lithium_level_in_range_is_not_flagged_and_a_toxic_one_is() -> None:
    lithium = measured("li", "14334-7", 0.8, "mmol/L", "2024-05-30")
    record, facts = read(lithium)
    assert drug_level_flag(lithium) == ""
    assert "flag" not in line(record, "Observation/li")
    assert drug_level_flag(measured("li2", "14334-7", 2.1, "meq/L", "2024-05-30")) == \
        "toxic (at or above 1.5 mmol/L)"
    assert drug_level_flag(measured("li3", "14334-7", 2.1, "mg/L", "2024-05-30")) == "", "no molar mass: not judged"
    assert facts.drug_levels["lithium"][0].caution == ""


def test_a_level_with_its_own_interpretation_is_left_as_the_chart_says() -> None:
    own = measured("dig", "10535-3", 3.1, "ng/mL", "2024-05-30",
                   interpretation=[{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                                                "v3-ObservationInterpretation", "code": "N"}]}])
    record, facts = read(own)
    assert "(flag normal)" in line(record, "Observation/dig") and "therapeutic" not in line(record, "Observation/dig")
    assert facts.drug_levels["digoxin"][0].caution == ""
    assert "digoxin 3.1 ng/mL (flag normal)" in line(record, "summary/drug-facts")


def test_a_trough_with_a_ceiling_and_a_comparator_is_judged_only_where_it_can_be() -> None:
    vanco_low = measured("v", "4092-3", 6, "ug/mL", "2024-05-30")
    gent = measured("g", "3665-7", 2.6, "mg/L", "2024-05-30")
    below_detection = measured("g2", "3665-7", 0.3, "mg/L", "2024-05-30")
    below_detection["valueQuantity"]["comparator"] = "<"
    assert drug_level_flag(vanco_low) == "below therapeutic range (10–20 mg/L)"
    assert drug_level_flag(gent) == "above therapeutic range (up to 2 mg/L)"
    assert drug_level_flag(below_detection) == ""


# ------------------------------------------------------------------------------------------------ shared charts
@pytest.mark.parametrize(("name", "renal"), [
    ("ips_us_meditech_renal_transplant_searchset.json", "kidney transplant"),
    ("synthea_ckd_diabetes_transaction.json", "CKD stage 1"),
])
def test_the_shared_renal_charts_carry_their_renal_condition_on_the_drug_facts_line(name: str, renal: str) -> None:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    record = load_record(path)
    drug_facts = next(f.text for f in record.fragments if f.id == "summary/drug-facts")
    assert drug_facts.startswith("Drug decision facts: Renal: ") and renal in drug_facts, drug_facts
