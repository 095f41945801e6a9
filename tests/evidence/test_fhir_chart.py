"""Issue 20: an EHR's FHIR export (the shared Synthea patient) becomes a context a clinician would use."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ebmrag.evidence.questions import QuestionClassifier
from ebmrag.evidence.tiering import Tiering
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import PackResult
from ebmrag.records.loaders import load_record
from ebmrag.records.notes import html_to_text, note_sections


@pytest.fixture(scope="module")
def chart(shared_data: Path) -> Path:
    return shared_data / "synthea" / "synthea_sample_complete_patient.json"


def pack(packer: ContextPacker, tiering: Tiering, chart: Path, question: str, window: int) -> PackResult:
    return packer.run(tiering.run(load_record(chart)), question, window)


def test_the_export_is_read_whole_and_whatever_is_left_out_is_counted(chart: Path) -> None:
    record = TierClassifier().run(load_record(chart))
    texts = [f.text for f in record.fragments]
    assert not any("no conclusion recorded" in t for t in texts)
    assert any(f.section == "Clinical note > Allergies" and f.text == "No Known Allergies." for f in record.fragments)
    assert any(t.startswith("Blood Pressure: Diastolic Blood Pressure") and "mm[Hg]" in t for t in texts)
    panel = next(t for t in texts if t.startswith("Basic Metabolic Panel:"))
    assert "Creatinine 0.88 mg/dL" in panel and "Potassium 5.13 mmol/L" in panel
    viral = next(t for t in texts if t.startswith("Respiratory pathogens"))
    assert "Influenza virus A RNA Negative;" in viral and viral.count("by NAA with probe detection") == 2, \
        "a suffix every result name shares is said once"
    assert not any("(disorder)" in t or "(finding)" in t for t in texts), "SNOMED semantic tags cost tokens"
    assert sum(f.id.startswith("MedicationRequest/") for f in record.fragments) == 12
    assert all(f.encounter and f.encounter.startswith("Encounter/") for f in record.fragments
               if f.id.startswith(("Condition/", "DiagnosticReport/")))
    resolved = [f for f in record.fragments if f.section == "Problem list > resolved"]
    active = [f for f in record.fragments if f.section == "Problem list > active"]
    assert len(active) == 7 and all(f.decision.standing for f in active)
    assert resolved and not any(f.decision.standing for f in resolved) and all(f.tier.value == "T4" for f in resolved)
    notes = [f for f in record.fragments if f.id.startswith("DiagnosticReport/") and f.section.startswith("Clinical")
             and f.section != "Clinical note > Allergies"]  # an allergy status stands, the rest of a note decays
    assert notes and not any(f.decision.standing for f in notes), "'Diagnostic report' is not a diagnosis"
    skipped = dict(line.split(": ", 1) for line in record.skipped)
    assert skipped["Claim x49"] == "billing or administrative, not clinical evidence"
    assert skipped["DocumentReference x37"] == "the same note as another report or section (read once)"
    assert skipped["Observation x22"] == "read as part of their panel (DiagnosticReport or Observation.hasMember)"


@pytest.mark.slow
@pytest.mark.model
def test_active_problems_medications_and_allergies(context_packer: ContextPacker, tiering: Tiering,
        chart: Path) -> None:
    question = "What are this patient's active problems, current medications and allergies?"
    wide = pack(context_packer, tiering, chart, question, 1024)
    assert "Active problems (7):" in wide.context and "History of coronary artery bypass grafting" in wide.context
    assert "Body mass index 30+ - obesity" in wide.context
    assert "Active medications (12" in wide.context and "No Known Allergies" in wide.context
    narrow = pack(context_packer, tiering, chart, question, 256)
    assert "Active problems (7):" in narrow.context and "Active medications (12" in narrow.context
    assert "no conclusion recorded" not in wide.context + narrow.context


@pytest.mark.model
def test_a_drug_question_gets_age_kidney_and_allergy_status_and_no_room_is_wasted(
        context_packer: ContextPacker, tiering: Tiering,
        chart: Path) -> None:
    result = pack(context_packer, tiering, chart, "Which antibiotic would be safe for this patient if he developed "
                                         "pneumonia, and why?", 1024)
    assert result.question_type == "drug_choice"
    assert re.search(r"Patient: \d+-year-old male", result.context)  # the age today (born 1950-10-24)
    assert "creatinine 0.88 mg/dL" in result.context and "eGFR 158.5" in result.context
    assert "Allergy status (clinical note of 2020-03-14): No Known Allergies." in result.context
    room = result.window - result.tokens_used
    for dropped in result.dropped:
        if dropped.reason.value != "duplicate":
            assert f"{room} tokens were left" in dropped.detail


@pytest.mark.model
def test_context_lines_carry_short_numbers_not_resource_ids(context_packer: ContextPacker, tiering: Tiering,
        chart: Path) -> None:
    result = pack(context_packer, tiering, chart, "Any kidney problems?", 512)
    assert "Condition/" not in result.context and "Observation/" not in result.context
    numbers = dict(result.numbers)
    for packed in result.packed:
        assert packed.text.startswith(f"[{numbers[packed.fragment_id]}|")
    assert result.to_json()["packed"][0]["n"] == numbers[result.packed[0].fragment_id]


def _bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


def _note(content_type: str, text: str) -> dict[str, Any]:
    return {"contentType": content_type, "data": base64.b64encode(text.encode()).decode()}


def test_html_notes_refuted_conditions_and_procedure_periods(tmp_path: Path) -> None:
    html = "<h1>Allergies</h1><p>Penicillin: hives.</p><h2>Plan</h2><p>Start <b>doxycycline</b>.</p><script>x</script>"
    resources = [
        {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1980-05-01"},
        {"resourceType": "DocumentReference", "id": "d1", "status": "current", "subject": {"reference": "Patient/p1"},
         "date": "2024-02-01T10:00:00Z", "content": [{"attachment": _note("text/html", html)}]},
        {"resourceType": "Condition", "id": "c1", "subject": {"reference": "Patient/p1"}, "code": {"text": "Asthma"},
         "verificationStatus": {"coding": [{"code": "refuted"}]}, "recordedDate": "2024-01-01"},
        {"resourceType": "Procedure", "id": "x1", "status": "completed", "subject": {"reference": "Patient/p1"},
         "code": {"text": "Appendectomy"}, "performedPeriod": {"start": "2019-03-03T08:00:00Z"}},
    ]
    path = tmp_path / "chart.json"
    path.write_text(json.dumps(_bundle(*resources)), encoding="utf-8")
    record = load_record(path)
    by_id = {f.id: f for f in record.fragments}
    assert by_id["DocumentReference/d1#allergies"].text == "Penicillin: hives."
    assert by_id["DocumentReference/d1#plan"].text == "Start doxycycline."
    assert by_id["Procedure/x1"].timestamp is not None and by_id["Procedure/x1"].timestamp.year == 2019
    assert re.fullmatch(r"Patient: \d+-year-old female \(born 1980-05-01\)\.", by_id["Patient/p1"].text)  # age today
    assert not any("Asthma" in f.text for f in record.fragments)
    assert "Condition x1: refuted or entered in error" in record.skipped
    assert by_id["summary/allergies"].text.startswith("Allergy status (clinical note of 2024-02-01): Penicillin")


def test_note_sections_and_html_text() -> None:
    sections = note_sections("2020-03-14\n\n# Chief Complaint\nNo complaints.\n\n# Allergies\nNo Known\n Allergies.\n")
    assert [(s.heading, s.text) for s in sections] == [("Chief Complaint", "No complaints."),
                                                      ("Allergies", "No Known Allergies.")]
    assert "# Title" in html_to_text("<h1>Title</h1>") and "x" not in html_to_text("<style>x</style>")


@pytest.mark.parametrize(("question", "kind"), [
    ("Which antibiotic would be safe for this patient if he developed pneumonia, and why?", "drug_choice"),
    ("What dose of vancomycin should he get?", "dosing"),
    ("Can I give ibuprofen with his warfarin?", "interaction"),
    ("How should his hypertension be managed?", "treatment"),
    ("What is the most likely diagnosis for this patient?", "diagnosis"),
    ("Tell me about the weather.", "general"),
])
def test_question_types(question: str, kind: str) -> None:
    assert QuestionClassifier().classify(question).id == kind
