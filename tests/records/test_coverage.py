"""Issue 47, the coverage invariant: every populated element of a chart's resources is said in a fragment or is a
documented non-clinical kind (rules/records/coverage.toml); a type no renderer reads is said generically; exact
duplicate lines collapse.

The charts are the shared ones (../shared/data/fhir_charts, FHIR and C-CDA); the inline bundles are written here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ebmrag.packing.types import PackResult
from ebmrag.records.fhir import bundle as fhir_bundle
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fhir.coverage import coverage_rules, elements
from ebmrag.records.fragment import Coverage, PatientRecord
from ebmrag.records.loaders import load_record
from tests.bench_scripts import load_script

CHART_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fhir_charts"
CHARTS = sorted(str(p.relative_to(CHART_DIR)) for p in [*CHART_DIR.glob("*.json"), *CHART_DIR.glob("*.xml"),
                                                         *CHART_DIR.glob("genomics/*.json")])
PATIENT = {"resourceType": "Patient", "id": "p", "birthDate": "1970-01-01", "gender": "female"}


def _bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"fullUrl": f"urn:uuid:{r['resourceType']}-{r.get('id', n)}", "resource": r}
                      for n, r in enumerate([PATIENT, *resources])]}


def _texts(record: PatientRecord, prefix: str) -> list[str]:
    return [f.text for f in record.fragments if f.id.startswith(prefix)]


@pytest.mark.skipif(not CHARTS, reason="the shared charts are not checked out beside the repository")
@pytest.mark.parametrize("chart", CHARTS)
def test_no_clinical_element_of_a_shared_chart_is_left_unsaid(chart: str) -> None:
    record = load_record(CHART_DIR / chart)
    coverage = record.coverage
    assert coverage.elements > 0, "the chart was audited"
    assert coverage.unrendered == (), f"{chart}: clinical elements no fragment says: {coverage.unrendered}"
    assert coverage.rendered + sum(n for _, n in coverage.documented) + sum(n for _, n in coverage.generic) \
        == coverage.elements, "every element is rendered, documented or said generically"


def test_a_type_no_renderer_reads_is_said_with_its_codes_dates_and_notes() -> None:
    diet = {"resourceType": "NutritionOrder", "id": "n1", "status": "active", "intent": "order",
            "patient": {"reference": "Patient/p"}, "dateTime": "2024-03-02",
            "oralDiet": {"type": [{"coding": [{"system": "http://snomed.info/sct", "code": "160670007",
                                               "display": "Diabetic diet"}]}],
                         "texture": [{"modifier": {"text": "Pureed"}}]},
            "note": [{"text": "Thickened fluids only after the stroke."}]}
    event = {"resourceType": "AdverseEvent", "id": "a1", "actuality": "actual", "subject": {"reference": "Patient/p"},
             "date": "2023-11-20", "event": {"coding": [{"code": "X1", "display": "Angioedema of the lips"}]},
             "seriousness": {"text": "Serious"},
             "suspectEntity": [{"instance": {"reference": "Medication/m1"}}]}
    drug = {"resourceType": "Medication", "id": "m1", "code": {"text": "Lisinopril 10 mg tablet"}}
    record = record_from_fhir_bundle(_bundle(diet, event, drug), "inline")
    nutrition = next(f for f in record.fragments if f.id == "NutritionOrder/n1")
    assert nutrition.section == "Nutrition order" and nutrition.timestamp is not None
    assert nutrition.timestamp.date().isoformat() == "2024-03-02"
    for said in ("(active)", "Diabetic diet", "Pureed", "Thickened fluids only after the stroke"):
        assert said in nutrition.text
    adverse = next(f for f in record.fragments if f.id == "AdverseEvent/a1")
    assert adverse.section == "Adverse event"
    for said in ("Angioedema of the lips", "Serious", "Lisinopril 10 mg tablet", "2023-11-20"):
        assert said in adverse.text
    assert not any("resource type not used for packing" in s for s in record.skipped)
    assert record.coverage.unrendered == ()


def test_an_observation_element_no_renderer_reads_reaches_a_fragment() -> None:
    position = {"url": "http://example.org/fhir/StructureDefinition/body-position",
                "valueCodeableConcept": {"text": "Sitting upright"}}
    pressure = {"resourceType": "Observation", "id": "bp", "status": "final", "subject": {"reference": "Patient/p"},
                "code": {"text": "Blood pressure"}, "effectiveDateTime": "2024-05-01",
                "valueQuantity": {"value": 150, "unit": "mmHg"}, "extension": [position],
                "bodySite": {"coding": [{"system": "http://snomed.info/sct", "code": "368208006",
                                         "display": "Left upper arm"}]},
                "method": {"text": "Automated cuff"},
                "note": [{"text": "Taken after climbing stairs."}]}
    record = record_from_fhir_bundle(_bundle(pressure), "inline")
    main = next(f for f in record.fragments if f.id == "Observation/bp")
    more = next(f for f in record.fragments if f.id == "Observation/bp#more")
    assert "150" in main.text and more.section == f"Also recorded > {main.section}" and more.timestamp == main.timestamp
    for said in ("Left upper arm", "Automated cuff", "Taken after climbing stairs."):  # the result's own line says
        assert said in main.text and said not in more.text
    assert more.text.startswith("Observation Blood pressure (also recorded): ") and "Sitting upright" in more.text
    assert [path for path, _ in record.coverage.generic] == ["Observation.extension:body-position.valueCodeableConcept"]
    assert record.coverage.unrendered == ()


def test_the_allergy_banner_lists_each_allergy_once_not_its_extra_line() -> None:
    allergy = {"resourceType": "AllergyIntolerance", "id": "a", "patient": {"reference": "Patient/p"},
               "category": ["environment"], "code": {"text": "Birch pollen"},
               "extension": [{"url": "http://example.org/fhir/StructureDefinition/allergy-trigger",
                              "valueString": "after garden work"}]}
    record = record_from_fhir_bundle(_bundle(allergy), "inline")
    more = next(f for f in record.fragments if f.id == "AllergyIntolerance/a#more")
    assert "allergy trigger: after garden work" in more.text
    banner = next(f for f in record.fragments if f.id == "summary/allergies")
    assert banner.text.startswith("Allergies (1): ") and "also recorded" not in banner.text


def test_a_panel_members_comment_is_said_in_the_panels_line() -> None:
    member = {"resourceType": "Observation", "id": "k", "status": "final", "subject": {"reference": "Patient/p"},
              "code": {"text": "Potassium"}, "valueQuantity": {"value": 6.1, "unit": "mmol/L"},
              "note": [{"text": "Sample haemolysed; repeat requested."}]}
    report = {"resourceType": "DiagnosticReport", "id": "r", "status": "final", "subject": {"reference": "Patient/p"},
              "code": {"text": "Electrolytes"}, "effectiveDateTime": "2024-06-01",
              "result": [{"reference": "Observation/k"}]}
    record = record_from_fhir_bundle(_bundle(member, report), "inline")
    panel = next(f for f in record.fragments if f.id == "DiagnosticReport/r")
    assert "6.1" in panel.text and "Sample haemolysed; repeat requested." in panel.text  # a member's comment
    assert record.coverage.unrendered == ()


def test_a_line_dates_itself_when_its_renderer_left_it_undated() -> None:
    smoking = {"resourceType": "Observation", "id": "s", "status": "final", "subject": {"reference": "Patient/p"},
               "code": {"text": "Tobacco use"}, "valueCodeableConcept": {"text": "Former smoker"},
               "effectivePeriod": {"start": "2019-02-03", "end": "2021-07-08"}}
    record = record_from_fhir_bundle(_bundle(smoking), "inline")
    more = next(f for f in record.fragments if f.id == "Observation/s#more")
    assert "2019-02-03 to 2021-07-08" in more.text


def test_exact_duplicate_lines_collapse_into_one() -> None:
    def allergy(rid: str) -> dict[str, Any]:
        return {"resourceType": "AllergyIntolerance", "id": rid, "patient": {"reference": "Patient/p"},
                "category": ["medication"], "code": {"text": "Sulfamethoxazole"},
                "reaction": [{"manifestation": [{"text": "Rash"}]}]}
    record = record_from_fhir_bundle(_bundle(allergy("a1"), allergy("a2")), "inline")
    lines = [f for f in record.fragments if f.id.startswith("AllergyIntolerance/")]
    assert len(lines) == 1 and lines[0].id == "AllergyIntolerance/a1"
    assert any(s.startswith("AllergyIntolerance x1: the same line") for s in record.skipped)


def test_the_same_result_on_two_days_keeps_its_newest_line() -> None:
    def weight(rid: str, day: str) -> dict[str, Any]:
        return {"resourceType": "Observation", "id": rid, "status": "final", "subject": {"reference": "Patient/p"},
                "code": {"text": "Body weight"}, "effectiveDateTime": day,
                "valueQuantity": {"value": 70, "unit": "kg"}}
    record = record_from_fhir_bundle(_bundle(weight("w1", "2020-01-01"), weight("w2", "2024-01-01")), "inline")
    lines = [f for f in record.fragments if f.id.startswith("Observation/")]
    assert [f.id for f in lines] == ["Observation/w2"], "one line, dated by its newest recording"


def test_a_billing_resource_is_counted_documented_and_never_packed() -> None:
    claim = {"resourceType": "Claim", "id": "c", "status": "active", "patient": {"reference": "Patient/p"},
             "type": {"text": "Institutional"}, "total": {"value": 1200, "currency": "USD"},
             "item": [{"sequence": 1, "productOrService": {"text": "Office visit"}}]}
    problem = {"resourceType": "Condition", "id": "d", "subject": {"reference": "Patient/p"},
               "clinicalStatus": {"coding": [{"code": "active"}]}, "code": {"text": "Asthma"}}
    record = record_from_fhir_bundle(_bundle(claim, problem), "inline")
    assert not any(f.id.startswith("Claim/") for f in record.fragments)
    documented = dict(record.coverage.documented)
    assert documented.get("billing and record-keeping", 0) >= 5  # type, total, item's sequence and product, status
    assert record.coverage.unrendered == () and record.coverage.generic == ()


def test_a_resource_taken_back_is_not_said() -> None:
    wrong = {"resourceType": "NutritionOrder", "id": "n", "status": "entered-in-error", "intent": "order",
             "patient": {"reference": "Patient/p"}, "oralDiet": {"type": [{"text": "Clear liquids"}]}}
    record = record_from_fhir_bundle(_bundle(wrong), "inline")
    assert not any("Clear liquids" in f.text for f in record.fragments)
    assert any(s.startswith("NutritionOrder x1: entered in error") for s in record.skipped)


def test_an_authoring_system_no_record_names_is_not_a_line() -> None:
    system = {"resourceType": "Device", "id": "ehr", "type": {"text": "Electronic health record system"},
              "version": [{"value": "9.1"}]}
    implant = {"resourceType": "Device", "id": "pm", "patient": {"reference": "Patient/p"},
               "type": {"text": "Cardiac pacemaker"}, "status": "active"}
    record = record_from_fhir_bundle(_bundle(system, implant), "inline")
    assert not any(f.id.startswith("Device/ehr") for f in record.fragments)
    assert any("Cardiac pacemaker" in f.text for f in record.fragments if f.id.startswith("Device/pm"))


def test_elements_are_named_by_path_without_positions() -> None:
    resource = {"resourceType": "Observation", "id": "o", "status": "final", "code": {"text": "Variant"},
                "component": [{"code": {"text": "Gene studied"}, "valueCodeableConcept": {"text": "BRCA2"}},
                              {"code": {"text": "Zygosity"}, "valueString": "heterozygous"}],
                "extension": [{"url": "http://example.org/fhir/StructureDefinition/lab-comment",
                               "valueString": "Confirmed"}],
                "contained": [{"resourceType": "Specimen", "id": "s", "type": {"text": "Blood"}}]}
    found = {e.path: e for e in elements(resource)}
    assert {"Observation.component.valueCodeableConcept", "Observation.component.valueString",
            "Observation.extension:lab-comment.valueString", "Specimen.type", "Observation.code"} <= set(found)
    assert found["Observation.component.valueCodeableConcept"].about == "Gene studied"
    assert found["Observation.component.valueCodeableConcept"].shape == "concept"


def test_every_billing_and_party_type_the_reader_skips_is_documented_whole() -> None:
    rules = coverage_rules()
    for kind in sorted(fhir_bundle._BILLING):
        probe = elements({"resourceType": kind, "status": "active", "note": [{"text": "x"}]})
        assert all(rules.documented_as(e) for e in probe), f"{kind} is skipped by the reader but not documented"
    assert all(rule.why.strip() for rule in rules.documented)


def test_pack_json_reports_the_coverage_per_path() -> None:
    coverage = Coverage(10, 6, (("identity and bookkeeping", 2),), (("Observation.note", 2),), ())
    data = PackResult("ebm-exact", 100, (), (), record_coverage=coverage).to_json()
    assert data["coverage"] == {"elements": 10, "rendered": 6, "documented": {"identity and bookkeeping": 2},
                                "generic": {"Observation.note": 2}, "unrendered": {}}
    assert "coverage" not in PackResult("ebm-exact", 100, (), ()).to_json(), "a record that was not audited"


def test_the_coverage_stays_with_the_record_through_its_steps() -> None:
    record = record_from_fhir_bundle(_bundle({"resourceType": "Condition", "id": "d",
                                              "subject": {"reference": "Patient/p"}, "code": {"text": "Gout"}}),
                                     "inline")
    assert record.coverage.elements > 0
    assert record.replace_fragments(record.fragments[:1]).coverage == record.coverage


def test_a_resource_its_renderer_cannot_read_is_still_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(resource: Any, index: Any) -> Any:
        raise KeyError("a shape nothing foresaw")
    monkeypatch.setitem(fhir_bundle._RENDERERS, "Procedure", (broken, ()))
    procedure = {"resourceType": "Procedure", "id": "x", "status": "completed", "subject": {"reference": "Patient/p"},
                 "performedDateTime": "2022-08-09", "bodySite": [{"text": "Right knee"}]}
    record = record_from_fhir_bundle(_bundle(procedure), "inline")
    line = next(f for f in record.fragments if f.id == "Procedure/x")
    assert "Right knee" in line.text and "2022-08-09" in line.text
    assert any("could not be read as a whole" in s for s in record.skipped)


def test_a_modifier_stated_with_its_default_adds_no_line_and_otherwise_does() -> None:
    def order(rid: str, as_needed: bool) -> dict[str, Any]:
        return {"resourceType": "MedicationRequest", "id": rid, "status": "active", "intent": "order",
                "subject": {"reference": "Patient/p"}, "medicationCodeableConcept": {"text": f"Drug {rid}"},
                "dosageInstruction": [{"asNeededBoolean": as_needed}]}
    record = record_from_fhir_bundle(_bundle(order("scheduled", False), order("prn", True)), "inline")
    ids = {f.id for f in record.fragments}
    assert "MedicationRequest/scheduled#more" not in ids
    prn = " ".join(f.text for f in record.fragments if f.id.startswith("MedicationRequest/prn"))
    assert "as needed: yes" in prn or "as needed" in prn.lower()
    assert dict(record.coverage.documented).get("stated default") == 1


def test_the_coverage_command_reads_a_folder_and_lists_what_it_refused(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    pressure = {"resourceType": "Observation", "id": "bp", "status": "final", "subject": {"reference": "Patient/p"},
                "code": {"text": "Blood pressure"}, "valueQuantity": {"value": 150, "unit": "mmHg"},
                "extension": [{"url": "http://example.org/x/cuff-size", "valueString": "large adult"}]}
    (tmp_path / "chart.json").write_text(json.dumps(_bundle(pressure)), encoding="utf-8")
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="chart_coverage"):
        assert load_script("chart_coverage").folder_coverage(tmp_path, top=5) is True
    said = caplog.text
    assert "1 charts read, 1 refused, 0 crashed" in said and "unrendered: 0" in said
    assert "generic Observation.extension:cuff-size.valueString: 1" in said and "broken.json" in said
