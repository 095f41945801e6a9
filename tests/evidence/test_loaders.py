from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ebmrag.errors import RecordError
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.loaders import load_record, load_records


def _write(tmp_path: Path, data: Any, name: str = "record.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def test_native_json(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "patient_id": "p1",
            "fragments": [
                {"id": "a", "text": "Penicillin anaphylaxis.", "section": "Allergy", "timestamp": "2014-03-02"},
                {"id": "b", "text": "Cough for two days."},
            ],
        },
    )
    record = load_record(path)
    assert record.patient_id == "p1" and [f.id for f in record.fragments] == ["a", "b"]
    assert record.fragments[0].timestamp is not None and record.fragments[0].timestamp.tzinfo is not None
    assert record.fragments[1].section is None and record.fragments[1].timestamp is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"fragments": [{"id": "a", "text": "x"}]}, r"record\.json\.patient_id: is missing"),
        ({"patient_id": "p", "fragments": []}, r"fragments: is empty"),
        ({"patient_id": "p", "fragments": [{"id": "a"}]}, r"fragments\[0\]\.text: is missing"),
        (
            {"patient_id": "p", "fragments": [{"id": "a", "text": "x", "timestamp": "2021-13-01"}]},
            r"fragments\[0\]\.timestamp: not an ISO-8601",
        ),
        ({"patient_id": "p", "fragments": [{"id": "a", "text": "x", "section": 3}]}, r"fragments\[0\]\.section"),
        ({"patient_id": "p", "fragments": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, "duplicate"),
        ({"patient_id": "p", "fragments": [{"id": "a", "text": "x", "patient_id": "q"}]}, "differs"),
        ({"something": "else"}, "unrecognised record"),
        ("{not json", "invalid JSON at line 1"),
    ],
)
def test_malformed_json_names_the_field(tmp_path: Path, data: Any, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        load_record(_write(tmp_path, data))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="file not found"):
        load_record(tmp_path / "nope.json")


def test_plain_text_split_into_sentences(tmp_path: Path) -> None:
    text = "Dr. Lee saw him at 9 a.m. Creatinine 2.8 mg/dL. Biopsy showed adenocarcinoma.\n\n病理示腺癌。未见转移。"
    record = load_record(_write(tmp_path, text, "note.txt"))
    assert [f.text for f in record.fragments] == [
        "Dr. Lee saw him at 9 a.m.",
        "Creatinine 2.8 mg/dL.",
        "Biopsy showed adenocarcinoma.",
        "病理示腺癌。",
        "未见转移。",
    ]
    assert record.patient_id == "note"


def test_agentclinic_cases_never_leak_the_diagnosis(shared_data: Path) -> None:
    records = load_records(shared_data / "agentclinic" / "agentclinic_medqa_extended_shared.jsonl")
    assert len(records) > 100
    assert len({r.patient_id for r in records}) == len(records)
    first = records[0]
    assert all("correct_diagnosis" not in f.id and "objective" not in f.id for f in first.fragments)
    classified = TierClassifier().run(first)
    tiers = {f.section: f.tier.value for f in classified.fragments}
    assert tiers["Test_Results > Biopsy"] == "T1"
    assert tiers["Patient_Actor > History"] == "T4"


def test_multi_record_file_needs_a_patient_choice(tmp_path: Path) -> None:
    rows = [{"patient_id": p, "fragments": [{"id": "a", "text": "x"}]} for p in ("p1", "p2")]
    path = _write(tmp_path, "\n".join(json.dumps(r) for r in rows), "many.jsonl")
    with pytest.raises(RecordError, match="holds 2 patient records"):
        load_record(path)
    assert load_record(path, "p2").patient_id == "p2"


def _bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


PATIENT = {"resourceType": "Patient", "id": "p1"}
ALLERGY = {
    "resourceType": "AllergyIntolerance",
    "id": "a1",
    "patient": {"reference": "Patient/p1"},
    "code": {"text": "Penicillin"},
    "criticality": "high",
    "recordedDate": "2014-03-02",
    "reaction": [{"manifestation": [{"text": "anaphylaxis"}], "severity": "severe"}],
}
CREATININE = {
    "resourceType": "Observation",
    "id": "o1",
    "status": "final",
    "subject": {"reference": "Patient/p1"},
    "category": [{"coding": [{"code": "laboratory"}]}],
    "code": {"text": "Creatinine"},
    "valueQuantity": {"value": 2.8, "unit": "mg/dL"},
    "effectiveDateTime": "2026-01-02T10:00:00Z",
    "interpretation": [{"text": "High"}],
}
BIOPSY = {
    "resourceType": "DiagnosticReport",
    "id": "r1",
    "status": "final",
    "subject": {"reference": "Patient/p1"},
    "category": [{"coding": [{"code": "PAT"}]}],
    "code": {"text": "Colon biopsy"},
    "conclusion": "Moderately differentiated adenocarcinoma.",
    "issued": "2026-01-05T12:00:00Z",
}


def test_fhir_bundle(tmp_path: Path) -> None:
    record = load_record(_write(tmp_path, _bundle(PATIENT, ALLERGY, CREATININE, BIOPSY)))
    assert record.patient_id == "Patient/p1"
    texts = {f.id: f.text for f in TierClassifier().run(record).fragments}
    assert "Penicillin" in texts["AllergyIntolerance/a1"] and "anaphylaxis" in texts["AllergyIntolerance/a1"]
    assert "2.8 mg/dL" in texts["Observation/o1"]
    tiers = {f.id: f.tier.value for f in TierClassifier().run(record).fragments}
    assert tiers == {"AllergyIntolerance/a1": "T1", "Observation/o1": "T2", "DiagnosticReport/r1": "T1",
                     "summary/allergies": "T1", "summary/drug-facts": "T2"}
    assert texts["summary/drug-facts"] == "Drug decision facts: Renal (2026-01-02): creatinine 2.8 mg/dL."


def test_a_resource_naming_another_patient_is_left_out_unnamed(tmp_path: Path) -> None:
    """Issue 29: a real export (the Danish IPS) holds one resource naming another patient; the chart is read,
    that resource is not, and the other patient is not named in the trace."""
    other = dict(CREATININE, subject={"reference": "Patient/p2"})
    record = load_record(_write(tmp_path, _bundle(PATIENT, ALLERGY, other)))
    assert record.patient_id == "Patient/p1"
    assert not any("2.8" in f.text for f in record.fragments)
    assert "Observation x1: names a different patient than the chart's; not read" in record.skipped
    assert not any("p2" in line for line in record.skipped)


def test_two_patient_resources_are_refused(tmp_path: Path) -> None:
    other = {**PATIENT, "id": "p2"}
    with pytest.raises(RecordError, match="2 Patient resources"):
        load_record(_write(tmp_path, _bundle(PATIENT, other, ALLERGY)))


def test_an_invalid_status_is_read_and_reported(tmp_path: Path) -> None:
    record = load_record(_write(tmp_path, _bundle(PATIENT, dict(CREATININE, status="done"))))
    assert any("2.8 mg/dL" in f.text for f in record.fragments)
    assert "Observation/o1: status 'done' is not a status of Observation; read as recorded" in record.skipped


def test_fhir_encounter_references_are_kept(tmp_path: Path) -> None:
    visit = {**CREATININE, "encounter": {"reference": "Encounter/e7"}}
    record = load_record(_write(tmp_path, _bundle(PATIENT, ALLERGY, visit)))
    encounters = {f.id: f.encounter for f in record.fragments if not f.id.startswith("summary/")}
    assert encounters == {"AllergyIntolerance/a1": None, "Observation/o1": "Encounter/e7"}


@pytest.mark.parametrize("urls", [("http://a.example/fhir/Patient/p1", "http://b.example/fhir/Patient/p1"),
                                  (None, None)])
def test_two_patients_sharing_an_id_are_refused_not_merged(tmp_path: Path, urls: tuple[str | None, str | None]) -> None:
    """Issue 18.1: before, both became Patient/p1 and one person's allergy sat beside the other's creatinine."""
    other = {**PATIENT, "name": [{"family": "Other"}]}
    entries = [{"resource": PATIENT, **({"fullUrl": urls[0]} if urls[0] else {})},
               {"resource": other, **({"fullUrl": urls[1]} if urls[1] else {})},
               {"resource": {**ALLERGY, "patient": {"reference": urls[0] or "Patient/p1"}}},
               {"resource": {**CREATININE, "subject": {"reference": urls[1] or "Patient/p1"}}}]
    path = _write(tmp_path, {"resourceType": "Bundle", "type": "collection", "entry": entries})
    with pytest.raises(RecordError, match=r"entry\[0\].*entry\[1\].*two Patient resources with id 'p1'"):
        load_record(path)


def test_a_reference_to_another_server_is_another_patient(tmp_path: Path) -> None:
    entries = [{"fullUrl": "http://a.example/fhir/Patient/p1", "resource": PATIENT},
               {"resource": {**CREATININE, "subject": {"reference": "http://b.example/fhir/Patient/p1"}}}]
    record = load_record(_write(tmp_path, {"resourceType": "Bundle", "type": "collection", "entry": entries}))
    assert not any("2.8" in f.text for f in record.fragments), "same id, another server: another person"
    assert "Observation x1: names a different patient than the chart's; not read" in record.skipped


def test_medications_become_fragments_and_unused_resources_are_reported(tmp_path: Path) -> None:
    """Issue 18.8: MedicationRequest vanished (only -v logged it); a valueless Observation became "Creatinine: ."."""
    warfarin = {"resourceType": "MedicationRequest", "id": "m1", "status": "active", "intent": "order",
                "subject": {"reference": "Patient/p1"}, "authoredOn": "2026-01-01",
                "medicationCodeableConcept": {"text": "Warfarin 5 mg tablet"},
                "dosageInstruction": [{"text": "5 mg once daily"}]}
    empty = {key: value for key, value in CREATININE.items() if key != "valueQuantity"}
    encounter = {"resourceType": "Encounter", "id": "e1", "status": "finished",
                 "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
                 "subject": {"reference": "Patient/p1"}}
    record = TierClassifier().run(load_record(_write(tmp_path, _bundle(PATIENT, warfarin, {**empty, "id": "o2"},
                                                                        encounter))))
    by_id = {f.id: f for f in record.fragments}
    assert by_id["MedicationRequest/m1"].text == ("Medication order: Warfarin 5 mg tablet (active, order) "
                                                  "since 2026-01-01; 5 mg once daily.")
    assert by_id["MedicationRequest/m1"].decision.standing, "an active order is current whatever its start date"
    assert by_id["MedicationRequest/m1"].tier.value == "T3"
    assert by_id["Observation/o2"].text.startswith("Creatinine: no value recorded")
    assert record.skipped == ("Encounter x1: groups its resources by visit (no reason recorded)",)
