"""Dates after the present (issue 43): a mistyped year ("2062" for "2026") is shown flagged and never outranks
today's facts, in FHIR charts and C-CDA documents alike (records.dates, records.fhir, records.ccda)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ebmrag.config import load_settings
from ebmrag.records.ccda import bundle_from_ccda
from ebmrag.records.dates import Today, future_flag
from ebmrag.records.fhir.bulk import records_from_ndjson_text
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.records.loaders import load_record
from ebmrag.records.params import ChartParams

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TODAY = Today(NOW)
ME = {"reference": "Patient/p1"}
PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1980-05-01"}
LOINC, SNOMED = "http://loinc.org", "http://snomed.info/sct"


def _bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


def _read(*resources: dict[str, Any], today: Today = TODAY) -> PatientRecord:
    return record_from_fhir_bundle(_bundle(PATIENT, *resources), "chart.json", today=today)


def _texts(record: PatientRecord) -> dict[str, str]:
    return {f.id: f.text for f in record.fragments}


def creatinine(rid: str, value: float, when: str, flag: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"resourceType": "Observation", "id": rid, "status": "final", "subject": ME,
                             "code": {"coding": [{"system": LOINC, "code": "2160-0", "display": "Creatinine"}]},
                             "effectiveDateTime": when, "valueQuantity": {"value": value, "unit": "mg/dL"}}
    if flag:
        found["interpretation"] = [{"coding": [{"code": flag}]}]
    return found


def pregnancy_status(rid: str, pregnant: bool, when: str) -> dict[str, Any]:
    answer = ("77386006", "Pregnant") if pregnant else ("60001007", "Not pregnant")
    return {"resourceType": "Observation", "id": rid, "status": "final", "subject": ME, "effectiveDateTime": when,
            "code": {"coding": [{"system": LOINC, "code": "82810-3"}]},
            "valueCodeableConcept": {"coding": [{"system": SNOMED, "code": answer[0], "display": answer[1]}]}}


def test_the_present_is_the_clock_with_a_skew_never_the_charts_newest_date() -> None:
    assert not TODAY.is_future(NOW + timedelta(hours=23)) and TODAY.is_future(NOW + timedelta(hours=25))
    assert not TODAY.is_future(None), "an undated fact is not in the future"
    assert Today(NOW, timedelta(0)).is_future(NOW + timedelta(seconds=1))
    stamps = [NOW - timedelta(days=3), datetime(2062, 3, 1, tzinfo=UTC), NOW]
    assert TODAY.newest(stamps) == NOW and max(stamps, key=TODAY.rank) == NOW
    assert TODAY.newest([datetime(2062, 3, 1, tzinfo=UTC)]) is None
    assert future_flag("2062-03-01") == "date in the future: 2062-03-01"
    with pytest.raises(ValueError, match="timezone-aware"):
        Today(datetime(2026, 3, 2))
    with pytest.raises(ValueError, match="skew"):
        Today(NOW, timedelta(hours=-1))


def test_todays_abnormal_creatinine_is_the_face_sheets_and_the_one_decades_ahead_is_flagged() -> None:
    record = _read(creatinine("today", 2.4, "2026-03-02T08:00:00Z", "H"), creatinine("typo", 0.9, "2062-03-01"))
    texts = _texts(record)
    assert texts["summary/drug-facts"] == ("Drug decision facts: Renal: creatinine 2.4 mg/dL (2026-03-02), "
                                           "creatinine 0.9 mg/dL (date in the future: 2062-03-01).")
    by_id = {f.id: f for f in record.fragments}
    assert by_id["Observation/typo"].date_in_future and not by_id["Observation/today"].date_in_future
    assert record.latest_timestamp == datetime(2026, 3, 2, 8, tzinfo=UTC), "the typo is not the newest fragment"
    assert by_id["summary/drug-facts"].timestamp == record.latest_timestamp
    assert ("Observation/typo: dated 2062-03-01, after the time of reading (2026-03-02): shown flagged, never taken "
            "as the newest") in record.skipped


def test_a_result_only_dated_in_the_future_is_shown_flagged() -> None:
    texts = _texts(_read(creatinine("typo", 0.9, "2062-03-01")))
    assert texts["summary/drug-facts"] == "Drug decision facts: Renal (date in the future: 2062-03-01): creatinine " \
                                          "0.9 mg/dL."


def test_other_latest_results_put_todays_first() -> None:
    sodium = {**creatinine("na", 139, "2026-03-01"), "code": {"coding": [{"system": LOINC, "code": "2951-2"}]}}
    sodium["valueQuantity"] = {"value": 139, "unit": "mmol/L"}
    typo = {**sodium, "id": "na-typo", "effectiveDateTime": "2062-01-01", "valueQuantity": {"value": 120,
                                                                                             "unit": "mmol/L"}}
    texts = _texts(_read(typo, sodium))
    assert texts["summary/latest-results"] == ("Latest results: sodium 139 mmol/L (2026-03-01); sodium 120 mmol/L "
                                               "(date in the future: 2062-01-01).")


def test_a_future_not_pregnant_never_takes_back_todays_pregnancy() -> None:
    texts = _texts(_read(pregnancy_status("now", True, "2026-02-20"), pregnancy_status("typo", False, "2062-02-20")))
    assert texts["Patient/p1"].endswith("; pregnancy status pregnant (2026-02-20), pregnancy status not pregnant "
                                        "(date in the future: 2062-02-20).")


def test_the_age_is_todays_not_at_the_charts_newest_date() -> None:
    typo = creatinine("typo", 0.9, "2062-03-01")
    assert _texts(_read(typo))["Patient/p1"] == "Patient: 45-year-old female (born 1980-05-01)."
    later = Today(datetime(2031, 6, 1, tzinfo=UTC))
    assert _texts(_read(typo, today=later))["Patient/p1"] == "Patient: 51-year-old female (born 1980-05-01)."
    deceased = {**PATIENT, "deceasedDateTime": "2020-05-02"}
    record = record_from_fhir_bundle(_bundle(deceased), "chart.json", today=TODAY)
    assert _texts(record)["Patient/p1"] == "Patient: 40-year-old female (born 1980-05-01, died 2020-05-02)."
    typo_death = record_from_fhir_bundle(_bundle({**PATIENT, "deceasedDateTime": "2062-05-02"}), "chart.json",
                                         today=TODAY)
    assert _texts(typo_death)["Patient/p1"] == ("Patient: 45-year-old female (born 1980-05-01, died (date in the "
                                                "future: 2062-05-02)).")


def test_a_birth_date_in_the_future_is_a_reported_chart_defect_not_an_age() -> None:
    unborn = {**PATIENT, "birthDate": "2062-05-01"}
    record = record_from_fhir_bundle(_bundle(unborn, creatinine("cr", 1.0, "2026-03-01")), "chart.json",
                                     today=TODAY)
    assert _texts(record)["Patient/p1"] == ("Patient: female (born 2062-05-01, a date in the future: no age "
                                            "computed).")
    assert "Patient/p1: birth date 2062-05-01 lies after the time of reading (2026-03-02): no age computed" \
           in record.skipped


def test_a_stop_or_a_reconciled_list_dated_in_the_future_leaves_todays_orders_current() -> None:
    def order(rid: str, status: str, when: str) -> dict[str, Any]:
        return {"resourceType": "MedicationRequest", "id": rid, "intent": "order", "subject": ME, "status": status,
                "authoredOn": when, "medicationCodeableConcept": {"text": "Metformin 500 MG Oral Tablet"}}
    stopped = order("typo", "stopped", "2062-01-01")
    listed = {"resourceType": "List", "id": "l1", "status": "current", "mode": "snapshot", "subject": ME,
              "code": {"coding": [{"system": LOINC, "code": "10160-0"}]}, "date": "2062-01-01", "entry": []}
    texts = _texts(_read(order("m1", "active", "2026-02-01"), stopped, listed))
    assert texts["summary/active-medications"] == "Active medications (1): Metformin."


def test_a_version_updated_in_the_future_is_not_the_current_one() -> None:
    def version(vid: str, updated: str, text: str) -> dict[str, Any]:
        return {"resourceType": "Condition", "id": "c1", "subject": ME, "code": {"text": text},
                "clinicalStatus": {"coding": [{"code": "active"}]}, "recordedDate": "2026-01-01",
                "meta": {"versionId": vid, "lastUpdated": updated}}
    history = {"resourceType": "Bundle", "type": "history", "entry": [
        {"resource": PATIENT}, {"resource": version("2", "2062-01-01T00:00:00Z", "Asthma")},
        {"resource": version("1", "2026-02-01T00:00:00Z", "Gout")}]}
    record = record_from_fhir_bundle(history, "history.json", today=TODAY)
    assert _texts(record)["Condition/c1"] == "Active problem: Gout (since 2026-01-01)."


def test_a_planned_visit_ahead_is_flagged_but_is_no_defect() -> None:
    planned = {"resourceType": "Encounter", "id": "e1", "status": "planned", "subject": ME,
               "type": [{"text": "Follow-up"}], "reasonCode": [{"text": "diabetes review"}],
               "period": {"start": "2026-04-01"}}
    record = _read(planned)
    assert next(f for f in record.fragments if f.id == "Encounter/e1").date_in_future
    assert not any(line.startswith("Encounter/e1") for line in record.skipped)


def test_bulk_data_ndjson_reads_against_the_given_present() -> None:
    lines = [json.dumps(PATIENT), json.dumps(creatinine("typo", 0.9, "2062-03-01"))]
    (record,) = records_from_ndjson_text("\n".join(lines), "export.ndjson", today=TODAY)
    assert next(f for f in record.fragments if f.id == "Observation/typo").date_in_future


def test_an_ebmrag_json_record_is_flagged_when_loaded(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"patient_id": "p", "fragments": [
        {"id": "today", "text": "Creatinine 2.4 mg/dL.", "timestamp": datetime.now(UTC).isoformat()},
        {"id": "typo", "text": "Creatinine 0.9 mg/dL.", "timestamp": "2062-03-01T00:00:00Z"}]}), encoding="utf-8")
    record = load_record(path)
    assert [f.date_in_future for f in record.fragments] == [False, True]
    assert record.latest_timestamp == record.fragments[0].timestamp


def test_a_fragment_keeps_its_flag_once_set_and_a_record_unchanged_is_itself() -> None:
    fragment = Fragment("f", "p", "x", timestamp=datetime(2062, 1, 1, tzinfo=UTC))
    flagged = fragment.flagged_at(TODAY)
    assert flagged.date_in_future and flagged.flagged_at(Today(datetime(2070, 1, 1, tzinfo=UTC))).date_in_future
    record = PatientRecord("p", (Fragment("g", "p", "y", timestamp=NOW),))
    assert record.flagged_at(TODAY) is record


def test_the_skew_is_a_chart_setting(tmp_path: Path) -> None:
    assert ChartParams().future_skew == timedelta(days=1)
    assert ChartParams(future_skew_hours=0).today().skew == timedelta(0)
    for bad in (-1.0, 24 * 31, float("nan")):
        with pytest.raises(ValueError, match="future_skew_hours"):
            ChartParams(future_skew_hours=bad)
    config = tmp_path / "ebmrag.toml"
    config.write_text("[chart]\nfuture_skew_hours = 2\n", encoding="utf-8")
    assert load_settings(config).chart.future_skew == timedelta(hours=2)


# ---------------------------------------------------------------------------------------------- C-CDA
CCDA = """<?xml version="1.0"?>
<ClinicalDocument xmlns="urn:hl7-org:v3" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <code code="34133-9" codeSystem="2.16.840.1.113883.6.1"/><effectiveTime value="20260302"/>
  <recordTarget><patientRole><id root="1.2.3" extension="p1"/><patient><name><given>Ann</given><family>Lee</family>
  </name><administrativeGenderCode code="F"/><birthTime value="{born}"/></patient></patientRole></recordTarget>
  <component><structuredBody><component><section><code code="30954-2" codeSystem="2.16.840.1.113883.6.1"/>
  <title>Results</title>{entries}</section></component></structuredBody></component>
</ClinicalDocument>"""
CCDA_RESULT = """<entry><observation classCode="OBS" moodCode="EVN"><code code="2160-0"
codeSystem="2.16.840.1.113883.6.1" displayName="Creatinine"/><statusCode code="completed"/>
<effectiveTime value="{when}"/><value xsi:type="PQ" value="{value}" unit="mg/dL"/></observation></entry>"""


def _ccda(born: str) -> PatientRecord:
    entries = CCDA_RESULT.format(when="20260302", value="2.4") + CCDA_RESULT.format(when="20620301", value="0.9")
    return record_from_fhir_bundle(bundle_from_ccda(CCDA.format(born=born, entries=entries), "doc.xml"), "doc.xml",
                                   today=TODAY)


def test_a_ccda_result_dated_in_the_future_is_flagged_and_todays_leads_the_face_sheet() -> None:
    record = _ccda("19800501")
    texts = _texts(record)
    assert texts["summary/drug-facts"] == ("Drug decision facts: Renal: creatinine 2.4 mg/dL (2026-03-02), "
                                           "creatinine 0.9 mg/dL (date in the future: 2062-03-01).")
    assert texts["Patient/1.2.3-p1"] == "Patient: 45-year-old female (born 1980-05-01)."
    assert [f.id for f in record.fragments if f.date_in_future] == ["Observation/ccda-observation-2"]


def test_a_ccda_birth_time_in_the_future_is_a_reported_defect() -> None:
    record = _ccda("20620501")
    assert _texts(record)["Patient/1.2.3-p1"].startswith("Patient: female (born 2062-05-01, a date in the future")
    assert any(line.startswith("Patient/1.2.3-p1: birth date 2062-05-01 lies after") for line in record.skipped)
