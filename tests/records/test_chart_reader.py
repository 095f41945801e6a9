"""Issue 29: the lenient chart reader on small, hand-built charts — one habit of real exports per test."""

from __future__ import annotations

import base64
import gzip
import json
import re
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from ebmrag.errors import RecordError
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.dates import as_written, partial_timestamp
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.loaders import load_record, load_records
from ebmrag.records.params import ChartParams
from tests.conftest import make_pdf

PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1980-05-01",
           "name": [{"family": "Rivera", "given": ["Ana"]}]}
ME = {"reference": "Patient/p1"}


def _write(tmp_path: Path, data: Any, name: str = "chart.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _bundle(*resources: dict[str, Any], kind: str = "collection") -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": kind, "entry": [{"resource": r} for r in resources]}


def _texts(path: Path, params: ChartParams | None = None) -> dict[str, str]:
    return {f.id: f.text for f in load_record(path, params=params).fragments}


def _medication(rid: str, drug: str, status: str | None, when: str, **extra: Any) -> dict[str, Any]:
    resource = {"resourceType": "MedicationRequest", "id": rid, "intent": "order", "subject": ME,
                "authoredOn": when, "medicationCodeableConcept": {"text": drug}, **extra}
    return {**resource, "status": status} if status else resource


def test_partial_dates_keep_their_precision() -> None:
    assert as_written("2016-03") == "2016-03" and as_written("1971") == "1971"
    assert partial_timestamp("2016-03") is not None and partial_timestamp("2016-03").month == 3  # type: ignore[union-attr]
    assert partial_timestamp("2016-13") is None and partial_timestamp("soon") is None and partial_timestamp(5) is None
    assert partial_timestamp("0001-01") is None, "a placeholder year is no date"
    assert partial_timestamp("2014-09-17T10:30:00Z") is not None


def test_a_bad_date_costs_the_date_not_the_resource(tmp_path: Path) -> None:
    condition = {"resourceType": "Condition", "id": "c1", "subject": ME, "code": {"text": "Gout"},
                 "clinicalStatus": {"coding": [{"code": "active"}]}, "onsetDateTime": "last spring"}
    record = load_record(_write(tmp_path, _bundle(PATIENT, condition)))
    assert "Active problem: Gout." in [f.text for f in record.fragments]
    assert "Condition/c1: a date that is not a date ('last spring'); read undated" in record.skipped


@pytest.mark.parametrize("kind", ["document", "collection", "batch", "transaction", "searchset", "history"])
def test_every_bundle_type_is_read(tmp_path: Path, kind: str) -> None:
    allergy = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "code": {"text": "Penicillin"}}
    assert "Allergy to Penicillin." in _texts(_write(tmp_path, _bundle(PATIENT, allergy, kind=kind))).values()


def test_a_message_bundle_is_opened_and_a_delete_request_is_not_a_resource(tmp_path: Path) -> None:
    inner = _bundle(PATIENT, {"resourceType": "Condition", "id": "c1", "subject": ME, "code": {"text": "Asthma"}},
                    kind="document")
    message = {"resourceType": "Bundle", "type": "message", "entry": [
        {"resource": {"resourceType": "MessageHeader", "id": "m"}}, {"resource": inner},
        {"request": {"method": "DELETE", "url": "Observation/old"}}]}
    record = load_record(_write(tmp_path, message))
    assert any("Asthma" in f.text for f in record.fragments)
    assert not any("entry[2]" in line for line in record.skipped), "a DELETE carries no resource by design"


def test_references_in_every_style_resolve(tmp_path: Path) -> None:
    """urn:uuid fullUrl, an absolute server URL, a versioned reference and a contained Medication."""
    encounter = {"resourceType": "Encounter", "id": "e1", "subject": ME, "reasonCode": [{"text": "Cough"}]}
    contained = _medication("m1", "", "active", "2026-01-01")
    del contained["medicationCodeableConcept"]
    contained |= {"contained": [{"resourceType": "Medication", "id": "amox", "code": {"text": "Amoxicillin 500 mg"}}],
                  "medicationReference": {"reference": "#amox"},
                  "encounter": {"reference": "https://ehr.example/fhir/Encounter/e1/_history/3"}}
    entries = [{"fullUrl": "urn:uuid:6f1b0000-0000-4000-8000-000000000001", "resource": PATIENT},
               {"fullUrl": "https://ehr.example/fhir/Encounter/e1", "resource": encounter},
               {"resource": {**contained, "subject": {"reference": "urn:uuid:6f1b0000-0000-4000-8000-000000000001"}}},
               {"resource": {"resourceType": "Observation", "id": "o1", "status": "final", "subject": ME,
                             "code": {"text": "Heart rate"}, "valueQuantity": {"value": 80, "unit": "/min"},
                             "hasMember": [{"reference": "Observation/missing"}]}}]
    record = load_record(_write(tmp_path, {"resourceType": "Bundle", "type": "collection", "entry": entries}))
    by_id = {f.id: f for f in record.fragments}
    assert by_id["MedicationRequest/m1"].text.startswith("Medication order: Amoxicillin 500 mg (active, order)")
    assert by_id["MedicationRequest/m1"].encounter == "Encounter/e1"
    assert "references x1: point outside the chart (Observation 1); those links not followed" in record.skipped


def test_resources_without_ids_or_full_urls_are_all_read(tmp_path: Path) -> None:
    conditions = [{"resourceType": "Condition", "subject": ME, "code": {"text": name}} for name in ("Gout", "Asthma")]
    texts = load_record(_write(tmp_path, _bundle(PATIENT, *conditions))).fragments
    assert sum(f.text.startswith("Active problem:") for f in texts) == 2


def test_no_patient_and_two_patients_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="holds no patient"):
        load_record(_write(tmp_path, _bundle({"resourceType": "Organization", "id": "o"})))
    with pytest.raises(RecordError, match="2 Patient resources"):
        load_record(_write(tmp_path, _bundle(PATIENT, {**PATIENT, "id": "p2"})))


def test_bulk_ndjson_gives_one_record_per_patient_and_guesses_nobody(tmp_path: Path) -> None:
    folder = tmp_path / "export"
    folder.mkdir()
    other = {**PATIENT, "id": "p2", "name": [{"family": "Okafor"}]}
    (folder / "Patient.ndjson").write_text("\n".join(json.dumps(p) for p in (PATIENT, other)) + "\n")
    lines = [{"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "code": {"text": "Penicillin"}},
             {"resourceType": "AllergyIntolerance", "id": "a2", "patient": {"reference": "Patient/p2"},
              "code": {"text": "Latex"}},
             {"resourceType": "AllergyIntolerance", "id": "a3", "code": {"text": "Shellfish"}}]
    (folder / "AllergyIntolerance.ndjson").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    records = {r.patient_id: r for r in load_records(folder)}
    assert set(records) == {"Patient/p1", "Patient/p2"}
    first, second = (" ".join(f.text for f in records[p].fragments) for p in ("Patient/p1", "Patient/p2"))
    assert "Penicillin" in first and "Latex" not in first and "Latex" in second and "Penicillin" not in second
    assert "Shellfish" not in first + second, "a resource naming nobody in a many-patient export is nobody's"
    assert any("names no patient of this export" in line for line in records["Patient/p1"].skipped)
    assert any("invalid JSON" in line for line in records["Patient/p1"].skipped)


def test_statements_of_absence_set_a_status_and_are_never_an_allergy_drug_or_problem(tmp_path: Path) -> None:
    ips = "http://hl7.org/fhir/uv/ips/CodeSystem/absent-unknown-uv-ips"
    resources = [
        {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME,
         "code": {"coding": [{"system": ips, "code": "no-known-allergies", "display": "No known allergies"}]}},
        {"resourceType": "MedicationStatement", "id": "m1", "status": "active", "subject": ME,
         "medicationCodeableConcept": {"coding": [{"system": "http://snomed.info/sct", "code": "787481004"}]}},
        {"resourceType": "Condition", "id": "c1", "subject": ME, "clinicalStatus": {"coding": [{"code": "active"}]},
         "code": {"text": "No current problems or disability"}}]
    texts = _texts(_write(tmp_path, _bundle(PATIENT, *resources)))
    assert texts["summary/allergies"] == "Allergy status: No known allergies (stated in the chart)."
    assert not any(t.startswith(("Allergy to", "Active problem:")) for t in texts.values())
    assert texts["summary/active-medications"].startswith("Active medications: none")


def test_an_allergen_in_reaction_substance_is_named_and_a_drug_class_allergy_is_t1(tmp_path: Path) -> None:
    unnamed = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME,
               "reaction": [{"substance": {"text": "Codeine"}, "manifestation": [{"text": "Wheezing"}]}]}
    ace = {"resourceType": "AllergyIntolerance", "id": "a2", "patient": ME, "criticality": "high",
           "code": {"text": "ACE inhibitors"}, "reaction": [{"manifestation": [{"text": "Angio-oedema of lips"}]}]}
    record = TierClassifier().run(load_record(_write(tmp_path, _bundle(PATIENT, unnamed, ace))))
    by_id = {f.id: f for f in record.fragments}
    assert by_id["AllergyIntolerance/a1"].text == "Allergy to Codeine (Wheezing)."
    assert by_id["AllergyIntolerance/a2"].tier.value == "T1" and by_id["AllergyIntolerance/a2"].decision.must_keep
    assert by_id["AllergyIntolerance/a1"].tier.value == "T1", "codeine is a drug: a drug allergy is T1"


def test_the_newest_reconciled_list_wins_and_stopped_orders_are_never_active(tmp_path: Path) -> None:
    orders = [_medication("m1", "metFORMIN 500 MG Oral Tablet", "active", "2015-02-01"),
              _medication("m2", "Atorvastatin 40 MG Oral Tablet", "active", "2016-03-01"),
              _medication("m3", "Lisinopril 10 MG Oral Tablet", "active", "2016-03-01"),
              _medication("m4", "Warfarin 5 MG Oral Tablet", "stopped", "2016-03-01"),
              _medication("m5", "Insulin glargine", "active", "2024-06-01")]
    older = {"resourceType": "List", "id": "l0", "status": "current", "mode": "snapshot", "date": "2016-04-01",
             "code": {"coding": [{"system": "http://loinc.org", "code": "10160-0"}]}, "subject": ME,
             "entry": [{"item": {"reference": f"MedicationRequest/m{i}"}} for i in (1, 2, 3)]}
    newest = {**older, "id": "l1", "date": "2024-05-01",
              "entry": [{"item": {"reference": "MedicationRequest/m1"}, "deleted": True},
                        {"item": {"reference": "MedicationRequest/m2"}, "flag": {"text": "Discontinued"}},
                        {"item": {"reference": "MedicationRequest/m3"}}]}
    texts = _texts(_write(tmp_path, _bundle(PATIENT, *orders, older, newest)))
    assert texts["summary/active-medications"].startswith("Active medications (2")
    assert "Lisinopril" in texts["summary/active-medications"] and "Insulin glargine" in texts[
        "summary/active-medications"]
    for stopped in ("metFORMIN", "Atorvastatin", "Warfarin"):
        assert stopped not in texts["summary/active-medications"]
    assert texts["MedicationRequest/m2"].endswith("stopped at the medication reconciliation of 2024-05-01.")


def test_an_order_replaced_or_ended_by_a_newer_record_is_not_active(tmp_path: Path) -> None:
    first = _medication("m1", "Amlodipine 5 MG Oral Tablet", "active", "2020-01-01")
    replaced = _medication("m2", "Amlodipine 10 MG Oral Tablet", "active", "2021-01-01",
                           priorPrescription={"reference": "MedicationRequest/m1"})
    old_active = _medication("m3", "Naproxen 250 MG Oral Tablet", "active", "2020-01-01")
    newer_stop = _medication("m4", "Naproxen 500 MG Oral Tablet", "stopped", "2021-06-01")
    texts = _texts(_write(tmp_path, _bundle(PATIENT, first, replaced, old_active, newer_stop)))
    assert texts["summary/active-medications"] == "Active medications (1): Amlodipine."
    assert "replaced by a newer order of 2021-01-01" in texts["MedicationRequest/m1"]
    assert "stopped per a newer record of 2021-06-01" in texts["MedicationRequest/m3"]


def test_a_brand_order_is_ended_by_a_newer_record_of_its_generic(tmp_path: Path) -> None:
    """"Lipitor" and "atorvastatin" are one drug to the drug vocabulary (vocab.drugs): the newer stopped record of
    the generic ends the old active order of the brand, as it would an old order written with the generic."""
    brand = _medication("m1", "Lipitor 20 mg", "active", "2015-01-01")
    generic = _medication("m2", "atorvastatin 20 MG Oral Tablet", "stopped", "2023-06-01")
    other = _medication("m3", "Lisinopril 10 MG Oral Tablet", "active", "2015-01-01")
    texts = _texts(_write(tmp_path, _bundle(PATIENT, brand, generic, other)))
    assert "Lipitor" not in texts["summary/active-medications"]
    assert "stopped per a newer record of 2023-06-01" in texts["MedicationRequest/m1"]
    assert "Lisinopril" in texts["summary/active-medications"]


def test_old_active_orders_are_marked_and_the_age_is_a_setting(tmp_path: Path) -> None:
    old = _medication("m1", "Nizatidine 15 MG/ML Oral Solution", "active", "2008-04-05")
    recent = _medication("m2", "Ondansetron 4 MG Oral Tablet", "active", "2024-01-01")
    unknown = _medication("m3", "Acenocoumarol 1 MG Oral Tablet", None, "2023-12-01")
    path = _write(tmp_path, _bundle(PATIENT, old, recent, unknown))
    texts = _texts(path)
    assert texts["summary/active-medications"] == ("Active medications (2; * = not recently confirmed): Nizatidine*; "
                                                   "Ondansetron. Medications whose status is not recorded (1): "
                                                   "Acenocoumarol.")
    assert "not recently confirmed (last recorded 2008-04-05)" in texts["MedicationRequest/m1"]
    relaxed = _texts(path, ChartParams(stale_order_days=365 * 20))
    assert relaxed["summary/active-medications"].startswith("Active medications (2): Nizatidine; Ondansetron.")
    with pytest.raises(ValueError, match="stale_order_days"):
        ChartParams(stale_order_days=0)


def test_drug_decision_facts_are_found_by_loinc_with_units_and_pregnancy_joins_the_patient_line(
        tmp_path: Path) -> None:
    def result(rid: str, loinc: str, display: str, value: float, unit: str, when: str) -> dict[str, Any]:
        return {"resourceType": "Observation", "id": rid, "status": "final", "subject": ME,
                "effectiveDateTime": when, "valueQuantity": {"value": value, "unit": unit},
                "code": {"coding": [{"system": "http://loinc.org", "code": loinc, "display": display}]}}
    pregnancy = {"resourceType": "Observation", "id": "preg", "status": "final", "subject": ME,
                 "effectiveDateTime": "2026-02-01",
                 "code": {"coding": [{"system": "http://loinc.org", "code": "82810-3"}]},
                 "valueCodeableConcept": {"coding": [{"system": "http://snomed.info/sct", "code": "77386006",
                                                       "display": "Pregnant"}]}}
    expected = (date.today() + timedelta(days=60)).isoformat()  # ahead of today: the pregnancy is current
    due = {"resourceType": "Observation", "id": "edd", "status": "final", "subject": ME,
           "effectiveDateTime": "2026-02-01", "valueDateTime": expected,
           "code": {"coding": [{"system": "http://loinc.org", "code": "11778-8"}]}}
    intent = {**pregnancy, "id": "intent", "code": {"coding": [{"system": "http://loinc.org", "code": "86645-9"}],
                                                    "text": "Pregnancy intent"}}
    labs = [result("cr", "14682-9", "Kreatinin", 88, "umol/L", "2026-01-10"),
            result("cr-old", "2160-0", "Creatinine", 1.9, "mg/dL", "2019-01-10"),
            result("gfr", "62238-1", "eGFR CKD-EPI", 78, "mL/min/1.73m2", "2026-01-10"),
            result("k", "6298-4", "Kalium", 4.7, "mmol/L", "2026-01-10"),
            result("w", "29463-7", "Body weight", 61.5, "kg", "2026-02-01")]
    texts = _texts(_write(tmp_path, _bundle(PATIENT, pregnancy, due, intent, *labs)))
    assert texts["Patient/p1"].endswith(f"pregnancy status pregnant (2026-02-01), estimated due date {expected}.")
    assert texts["summary/drug-facts"] == ("Drug decision facts: Renal (2026-01-10): creatinine 88 umol/L, "
                                           "eGFR 78 mL/min/1.73m2, potassium 4.7 mmol/L; Body (2026-02-01): "
                                           "weight 61.5 kg.")


def test_a_susceptibility_panel_keeps_organism_drug_and_interpretation(tmp_path: Path) -> None:
    organism = {"resourceType": "Observation", "id": "org", "status": "final", "subject": ME,
                "code": {"text": "Organism identified"}, "valueCodeableConcept": {"text": "Escherichia coli"}}
    interpretation = "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation"
    drugs = [{"resourceType": "Observation", "id": f"s{i}", "status": "final", "subject": ME,
              "code": {"text": drug}, "interpretation": [{"coding": [{"system": interpretation, "code": code}]}]}
             for i, (drug, code) in enumerate((("Amp/Amoxycillin", "R"), ("Nitrofurantoin", "S")))]
    culture = {"resourceType": "DiagnosticReport", "id": "r1", "status": "final", "subject": ME,
               "code": {"text": "Urine culture"}, "result": [{"reference": f"Observation/{o['id']}"}
                                                             for o in (organism, *drugs)]}
    texts = _texts(_write(tmp_path, _bundle(PATIENT, culture, organism, *drugs)))
    assert texts["DiagnosticReport/r1"] == ("Urine culture: Organism identified Escherichia coli; "
                                            "Amp/Amoxycillin resistant; Nitrofurantoin susceptible.")


def test_non_english_displays_stay_and_a_bare_code_names_its_system(tmp_path: Path) -> None:
    active = {"coding": [{"code": "active"}]}
    condition = {"resourceType": "Condition", "id": "c1", "subject": ME, "clinicalStatus": active,
                 "code": {"coding": [{"system": "http://snomed.info/sct", "code": "36653000", "display": "Röteln"}]}}
    bare = {"resourceType": "Condition", "id": "c2", "subject": ME, "clinicalStatus": active,
            "code": {"coding": [{"system": "http://snomed.info/sct", "code": "38341003"}]}}
    texts = _texts(_write(tmp_path, _bundle(PATIENT, condition, bare)))
    assert texts["Condition/c1"] == "Active problem: Röteln."
    assert texts["Condition/c2"] == "Active problem: 38341003 (SNOMED CT)."


def test_composition_narratives_are_read_unless_placeholder_or_repeating(tmp_path: Path) -> None:
    condition = {"resourceType": "Condition", "id": "c1", "subject": ME, "code": {"text": "Gout"},
                 "clinicalStatus": {"coding": [{"code": "active"}]}}
    div = '<div xmlns="http://www.w3.org/1999/xhtml">{}</div>'
    composition = {"resourceType": "Composition", "id": "doc", "status": "final", "subject": ME, "date": "2026-01-05",
                   "section": [
                       {"title": "Problems", "entry": [{"reference": "Condition/c1"}],
                        "text": {"div": div.format("<table><tr><th>Problem</th></tr><tr><td>Gout</td></tr></table>")}},
                       {"title": "Plan", "text": {"div": div.format("To be populated at a future time")}},
                       {"title": "History", "text": {"div": div.format(
                           "Appendicectomy as a child; the hip fracture of 2019 has healed and is resolved.")}}]}
    record = load_record(_write(tmp_path, _bundle(PATIENT, condition, composition, kind="document")))
    notes = {f.section: f.text for f in record.fragments if f.id.startswith("Composition/")}
    assert notes == {"Clinical note > History": "Appendicectomy as a child; the hip fracture of 2019 has healed and "
                                                "is resolved."}
    assert "Composition x1: section narrative that repeats its entries" in record.skipped
    assert "Composition x1: section narrative that is a placeholder" in record.skipped


def test_attachments_are_read_by_their_bytes_once_each(tmp_path: Path) -> None:
    note = "Assessment: cellulitis of the left leg, improving on oral antibiotics."
    gz = base64.b64encode(gzip.compress(note.encode())).decode()
    pdf = base64.b64encode(make_pdf("Discharge letter: stable, home tomorrow.")).decode()
    documents = [{"resourceType": "DocumentReference", "id": f"d{i}", "status": "current", "subject": ME,
                  "content": [{"attachment": attachment}]}
                 for i, attachment in enumerate(({"contentType": "text/plain", "data": gz},
                                                 {"contentType": "text/plain", "data": gz},
                                                 {"contentType": "application/pdf", "data": pdf},
                                                 {"contentType": "application/pdf", "url": "https://x.example/a.pdf"}))]
    record = load_record(_write(tmp_path, _bundle(PATIENT, *documents)))
    texts = [f.text for f in record.fragments]
    assert texts.count(note) == 1, "a gzip labelled text/plain is opened, and the same note is read once"
    assert any("Discharge letter: stable" in t for t in texts)
    assert "DocumentReference x1: attachment without inline data (a url only, not fetched)" in record.skipped


def test_a_ccda_attached_to_another_patients_chart_is_not_read(tmp_path: Path, shared_data: Path) -> None:
    ccda = (shared_data / "fhir_charts" / "ccda_progress_note_adam_everyman.xml").read_bytes()
    document = {"resourceType": "DocumentReference", "id": "d1", "status": "current", "subject": ME,
                "content": [{"attachment": {"contentType": "application/xml",
                                            "data": base64.b64encode(ccda).decode()}}]}
    record = load_record(_write(tmp_path, _bundle(PATIENT, document)))
    assert not any("Everyman" in f.text or "atenolol" in f.text.lower() for f in record.fragments)
    assert any("C-CDA document about another patient" in line for line in record.skipped)


def test_sex_from_an_extension_when_gender_is_absent(tmp_path: Path) -> None:
    patient = {key: value for key, value in PATIENT.items() if key != "gender"} | {"extension": [
        {"url": "http://hl7.org/fhir/us/core/StructureDefinition/us-core-individual-sex",
         "valueCoding": {"system": "http://snomed.info/sct", "code": "248152002", "display": "Female (finding)"}}]}
    condition = {"resourceType": "Condition", "id": "c1", "subject": ME, "code": {"text": "Gout"},
                 "recordedDate": "2026-01-01"}
    texts = _texts(_write(tmp_path, _bundle(patient, condition)))
    assert re.fullmatch(r"Patient: \d+-year-old female \(born 1980-05-01\)\.", texts["Patient/p1"])  # age: today


def test_older_fhir_shapes_are_read(tmp_path: Path) -> None:
    """DSTU2/STU3 exports: statuses as strings, `substance` for the allergen, MedicationOrder; an attachment
    kept as a Binary in the chart is read through its url."""
    allergy = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "substance": {"text": "Sulfa"},
               "status": "confirmed", "clinicalStatus": "resolved"}
    order = {"resourceType": "MedicationOrder", "id": "m1", "status": "active", "patient": ME,
             "dateWritten": "2026-01-02", "medicationCodeableConcept": {"text": "Digoxin 125 MCG Oral Tablet"}}
    binary = {"resourceType": "Binary", "id": "b1", "contentType": "text/plain",
              "data": base64.b64encode(b"Echo: ejection fraction 35 percent.").decode()}
    document = {"resourceType": "DocumentReference", "id": "d1", "status": "current", "subject": ME,
                "content": [{"attachment": {"contentType": "text/plain", "url": "Binary/b1"}}]}
    texts = _texts(_write(tmp_path, _bundle(PATIENT, allergy, order, binary, document)))
    assert texts["AllergyIntolerance/a1"] == "Allergy to Sulfa (resolved)."
    assert texts["summary/active-medications"] == "Active medications (1): Digoxin."
    assert "Echo: ejection fraction 35 percent." in texts.values()


def test_fhir_xml_is_read_like_fhir_json(tmp_path: Path) -> None:
    xml = """<?xml version="1.0" encoding="UTF-8"?>
<Bundle xmlns="http://hl7.org/fhir">
  <type value="collection"/>
  <entry><resource><Patient><id value="p1"/><gender value="male"/><birthDate value="1960-02-03"/>
    <name><family value="Nakamura"/><given value="Ken"/></name></Patient></resource></entry>
  <entry><resource><AllergyIntolerance><id value="a1"/><category value="medication"/><criticality value="high"/>
    <code><coding><system value="http://snomed.info/sct"/><code value="764146007"/><display value="Penicillin"/>
    </coding></code><patient><reference value="Patient/p1"/></patient>
    <reaction><manifestation><text value="Anaphylaxis"/></manifestation></reaction>
  </AllergyIntolerance></resource></entry>
  <entry><resource><MedicationRequest><id value="m1"/><status value="active"/><intent value="order"/>
    <contained><Medication><id value="med"/><code><text value="Apixaban 5 MG Oral Tablet"/></code></Medication>
    </contained><medicationReference><reference value="#med"/></medicationReference>
    <subject><reference value="Patient/p1"/></subject><authoredOn value="2026-01-04"/></MedicationRequest>
  </resource></entry>
</Bundle>"""
    path = tmp_path / "chart.xml"
    path.write_text(xml, encoding="utf-8")
    record = TierClassifier().run(load_record(path))
    by_id = {f.id: f for f in record.fragments}
    assert by_id["AllergyIntolerance/a1"].text == "Drug allergy to Penicillin (high criticality: Anaphylaxis)."
    assert by_id["AllergyIntolerance/a1"].tier.value == "T1"
    assert by_id["summary/active-medications"].text == "Active medications (1): Apixaban."
    assert ("name", "Nakamura") in record.identifiers
    with pytest.raises(RecordError, match="neither a C-CDA document"):
        (tmp_path / "other.xml").write_text("<note>hello</note>", encoding="utf-8")
        load_record(tmp_path / "other.xml")


def test_a_patient_without_id_or_full_url_is_the_one_every_resource_names(tmp_path: Path) -> None:
    patient = {key: value for key, value in PATIENT.items() if key != "id"}
    allergy = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": {"reference": "Patient/xyz"},
               "code": {"text": "Latex"}}
    record = load_record(_write(tmp_path, _bundle(patient, allergy)))
    assert any(f.text.startswith("Allergy to Latex") for f in record.fragments)


def test_billing_alone_is_not_a_chart_but_a_new_patient_is(tmp_path: Path) -> None:
    claim = {"resourceType": "Claim", "id": "c1", "patient": ME}
    with pytest.raises(RecordError, match="neither a Patient nor a clinical resource"):
        load_record(_write(tmp_path, _bundle(claim)))
    texts = _texts(_write(tmp_path, _bundle(PATIENT)))
    assert texts["summary/allergies"] == "Allergy status: no allergy or allergy statement is recorded in this chart."


def test_a_patient_repeated_by_a_search_is_one_patient(tmp_path: Path) -> None:
    again = {**PATIENT, "meta": {"lastUpdated": "2026-02-01T00:00:00Z"}}
    allergy = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "code": {"text": "Latex"},
               "reaction": [{"manifestation": [{"concept": {"text": "Urticaria"}}]}]}  # R5 CodeableReference
    record = load_record(_write(tmp_path, _bundle(PATIENT, allergy, again, kind="searchset")))
    assert "Allergy to Latex (Urticaria)." in [f.text for f in record.fragments]


def test_a_chart_whose_every_order_has_ended_says_none_are_active(tmp_path: Path) -> None:
    orders = [_medication("m1", "Torsemide 20 MG Oral Tablet", "cancelled", "2020-01-01"),
              _medication("m2", "Ceftriaxone 1 G Injection", "completed", "2020-02-01")]
    texts = _texts(_write(tmp_path, _bundle(PATIENT, *orders)))
    assert texts["summary/active-medications"] == ("Active medications: none marked active (2 earlier medication "
                                                   "records).")


def test_a_panel_that_lists_itself_is_read_once(tmp_path: Path) -> None:
    """A real export (an Austrian IPS) has Observation panels whose members list the panel again."""
    panel = {"resourceType": "Observation", "id": "p", "status": "final", "subject": ME, "code": {"text": "Panel"},
             "hasMember": [{"reference": "Observation/m"}]}
    member = {"resourceType": "Observation", "id": "m", "status": "final", "subject": ME, "code": {"text": "Sodium"},
              "valueQuantity": {"value": 139, "unit": "mmol/L"}, "hasMember": [{"reference": "Observation/p"}]}
    texts = _texts(_write(tmp_path, _bundle(PATIENT, panel, member)))
    assert "Panel: Sodium 139 mmol/L." in texts.values()


def test_an_empty_allergy_or_medication_section_states_why(tmp_path: Path) -> None:
    """IPS and C-CDA documents say "no known allergies" with an empty section and its emptyReason."""
    def section(code: str, reason: str, div: str) -> dict[str, Any]:
        return {"title": code, "code": {"coding": [{"system": "http://loinc.org", "code": code}]},
                "emptyReason": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/list-empty-reason",
                                            "code": reason}]},
                "text": {"div": f'<div xmlns="http://www.w3.org/1999/xhtml">{div}</div>'}}
    composition = {"resourceType": "Composition", "id": "doc", "status": "final", "subject": ME, "date": "2026-01-05",
                   "section": [section("48765-2", "nilknown", "No known allergies."),
                               section("10160-0", "notasked", "Not on file.")]}
    texts = _texts(_write(tmp_path, _bundle(PATIENT, composition, kind="document")))
    assert texts["summary/allergies"] == "Allergy status: Nil known; No known allergies (stated in the chart)."
    assert texts["summary/active-medications"] == "Active medications: none listed; the chart states: Not asked; " \
                                                  "Not on file."


def test_a_byte_order_mark_is_not_an_error(tmp_path: Path) -> None:
    """Exports written on Windows often begin with a UTF-8 byte order mark."""
    path = tmp_path / "chart.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_bundle(PATIENT)).encode())
    assert load_record(path).patient_id == "Patient/p1"
    ndjson = tmp_path / "Patient.ndjson"
    ndjson.write_bytes(b"\xef\xbb\xbf" + json.dumps(PATIENT).encode() + b"\n")
    assert [r.patient_id for r in load_records(ndjson)] == ["Patient/p1"]


def test_an_unknown_drug_is_unnamed_and_a_renewed_order_listed_once(tmp_path: Path) -> None:
    unknown = _medication("m1", "", "active", "2026-01-01")
    absent = "http://terminology.hl7.org/CodeSystem/data-absent-reason"
    unknown["medicationCodeableConcept"] = {"coding": [{"system": absent, "code": "unknown", "display": "Unknown"}]}
    old = _medication("m2", "Reaptan 5 MG/5 MG Oral Tablet", "active", "2015-01-01")
    renewed = _medication("m3", "Reaptan 5 MG/5 MG Oral Tablet", "active", "2026-01-02")
    texts = _texts(_write(tmp_path, _bundle(PATIENT, unknown, old, renewed)))
    # in the chart's canonical order (records/fhir/order.py: oldest first): Reaptan's first order is from 2015
    assert texts["summary/active-medications"] == "Active medications (2): Reaptan; unnamed medication."


def test_a_binary_of_another_patient_is_not_read(tmp_path: Path) -> None:
    mine = {"resourceType": "Binary", "id": "b1", "contentType": "text/plain", "securityContext": ME,
            "data": base64.b64encode(b"Letter: wound healing well.").decode()}
    theirs = {**mine, "id": "b2", "securityContext": {"reference": "Patient/p2"},
              "data": base64.b64encode(b"Letter: another person's biopsy.").decode()}
    documents = [{"resourceType": "DocumentReference", "id": f"d{n}", "status": "current", "subject": ME,
                  "content": [{"attachment": {"contentType": "text/plain", "url": f"Binary/b{n}"}}]} for n in (1, 2)]
    record = load_record(_write(tmp_path, _bundle(PATIENT, mine, theirs, *documents)))
    texts = " ".join(f.text for f in record.fragments)
    assert "wound healing well" in texts and "biopsy" not in texts
    assert "Binary x1: names a different patient than the chart's; not read" in record.skipped


def test_a_result_in_words_is_no_drug_fact(tmp_path: Path) -> None:
    def alt(rid: str, value: dict[str, Any], when: str) -> dict[str, Any]:
        return {"resourceType": "Observation", "id": rid, "status": "final", "subject": ME,
                "effectiveDateTime": when, "code": {"coding": [{"system": "http://loinc.org", "code": "1742-6"}]},
                **value}
    results = [alt("o1", {"valueQuantity": {"value": 31, "unit": "U/L"}}, "2026-01-01"),
               alt("o2", {"valueString": "Test Not Performed U/L"}, "2026-02-01"),
               alt("o3", {"valueQuantity": {"value": "n/a", "unit": "U/L"}}, "2026-03-01")]
    texts = _texts(_write(tmp_path, _bundle(PATIENT, *results)))
    assert texts["summary/drug-facts"] == "Drug decision facts: Hepatic (2026-01-01): ALT 31 U/L."


def test_panels_that_share_their_members_are_read_a_bounded_number_of_times() -> None:
    """Eight levels of six panels, each listing all six of the next level: 6^7 paths through a bundle of 48
    resources. Each panel is read, and the text stays bounded, instead of growing six-fold per level."""
    fan, depth = 6, 8

    def observation(level: int, k: int) -> dict[str, Any]:
        resource: dict[str, Any] = {"resourceType": "Observation", "id": f"o{level}-{k}", "status": "final",
                                    "code": {"text": f"panel {level}-{k}"}, "subject": {"reference": "Patient/p"}}
        if level + 1 < depth:
            resource["hasMember"] = [{"reference": f"Observation/o{level + 1}-{m}"} for m in range(fan)]
        else:
            resource["valueQuantity"] = {"value": 1.2, "unit": "mg/dL"}
        return resource

    entries = [{"fullUrl": f"Observation/o{level}-{k}", "resource": observation(level, k)}
               for level in range(depth) for k in range(fan)]
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": {"resourceType": "Patient", "id": "p"}}, *entries]}
    record = record_from_fhir_bundle(bundle, "fan-out")
    panels = [f for f in record.fragments if f.section == "Observation"]
    assert len(panels) == fan and all("1.2 mg/dL" in f.text for f in panels), "each top panel reads its values"
    assert max(len(f.text) for f in panels) < 60_000
