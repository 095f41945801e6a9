"""Issue 47: readings where a chart's own structure carries the meaning: an order not to give a drug, whose a Task
is, how severe a detected issue is, and a section whose whole text is "none"."""

from __future__ import annotations

from typing import Any

import pytest

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fragment import PatientRecord, Tier
from ebmrag.records.notes import note_sections

PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "male", "birthDate": "1961-02-03"}
ME = {"reference": "Patient/p1"}


def _read(*resources: dict[str, Any]) -> PatientRecord:
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": r} for r in (PATIENT, *resources)]}
    return record_from_fhir_bundle(bundle, "test")


def _order(rid: str, drug: str, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "MedicationRequest", "id": rid, "status": "active", "intent": "order", "subject": ME,
            "authoredOn": "2025-03-01", "medicationCodeableConcept": {"text": drug}, **extra}


def test_an_order_not_to_give_a_drug_says_so_and_is_never_a_current_drug() -> None:
    record = _read(_order("m1", "Enoxaparin 40 mg injection", doNotPerform=True), _order("m2", "Metoprolol 25 mg"))
    line = next(f for f in record.fragments if f.id == "MedicationRequest/m1")
    assert "do not give Enoxaparin" in line.text
    assert "not active" in line.section
    sheet = " ".join(f.text for f in record.fragments if f.id.startswith("summary/"))
    assert "Metoprolol" in sheet and "Enoxaparin" not in sheet
    assert not record.coverage.unrendered
    assert not [path for path, _ in record.coverage.generic if "doNotPerform" in path]  # said by "do not give"


def test_a_task_for_another_patient_is_not_read_as_this_ones() -> None:
    theirs = {"resourceType": "Task", "id": "t2", "status": "requested", "intent": "order", "for": {
        "reference": "Patient/other"}, "description": "Recheck the other person's potassium tomorrow"}
    ours = {"resourceType": "Task", "id": "t1", "status": "requested", "intent": "order", "for": ME,
            "description": "Book a follow-up spirometry"}
    record = _read(ours, theirs)
    text = " ".join(f.text for f in record.fragments)
    assert "spirometry" in text and "potassium" not in text
    assert any("different patient" in note for note in record.skipped)


@pytest.mark.parametrize(("severity", "tier"), [("high", Tier.T1), ("moderate", Tier.T3)])
def test_a_detected_issue_is_ranked_by_its_severity(severity: str, tier: Tier) -> None:
    issue = {"resourceType": "DetectedIssue", "id": "d1", "status": "final", "patient": ME, "severity": severity,
             "code": {"text": "Drug-drug interaction"}, "detail": "Clarithromycin raises simvastatin exposure",
             "identifiedDateTime": "2025-03-02"}
    record = TierClassifier().run(_read(issue))
    line = next(f for f in record.fragments if f.id == "DetectedIssue/d1")
    assert "simvastatin" in line.text
    assert line.decision is not None and line.decision.tier is tier


def test_a_section_that_says_nothing_keeps_its_title() -> None:
    composition = {"resourceType": "Composition", "id": "c1", "status": "final", "subject": ME,
                   "date": "2025-03-02", "title": "Referral", "type": {"text": "Referral note"}, "section": [
                       {"title": "Past surgical history", "text": {"status": "generated",
                                                                    "div": "<div>None</div>"}},
                       {"title": "Family history", "text": {"status": "generated", "div": "<div>Non-contributory."
                                                                                          "</div>"}},
                       {"title": "Plan", "text": {"status": "generated", "div": "<div>To be populated</div>"}}]}
    texts = [f.text for f in _read(composition).fragments]
    assert "Past surgical history: None." in texts
    assert "Family history: Non-contributory." in texts
    assert not any("populated" in t for t in texts)


def test_a_note_heading_over_nothing_stays_with_it_and_a_finding_stands_alone() -> None:
    sections = note_sections("# Medications\nNil known\n# Exam\nHeart sounds regular, no murmur.\n")
    assert [s.text for s in sections] == ["Medications: Nil known", "Heart sounds regular, no murmur."]


def test_a_resource_that_names_another_patient_elsewhere_than_its_subject_is_not_read() -> None:
    theirs = {"resourceType": "Appointment", "id": "a2", "status": "booked",
              "description": "Chemotherapy cycle 3 for someone else",
              "participant": [{"actor": {"reference": "Patient/other"}, "status": "accepted"}]}
    ours = {"resourceType": "Appointment", "id": "a1", "status": "booked", "description": "Spirometry review",
            "participant": [{"actor": ME, "status": "accepted"}]}
    record = _read(ours, theirs)
    text = " ".join(f.text for f in record.fragments)
    assert "Spirometry review" in text and "Chemotherapy" not in text
    assert any("Appointment" in note and "different patient" in note for note in record.skipped)


def test_records_named_only_by_a_placeholder_still_say_what_else_they_record() -> None:
    allergy = {"resourceType": "AllergyIntolerance", "id": "al", "patient": ME, "code": {"text": "Allergy"},
               "category": ["medication"], "criticality": "high", "reaction": [{"severity": "severe"}]}
    drug = _order("rx", "Medication", dosageInstruction=[{"text": "Warfarin 5 mg once daily"}])
    report = {"resourceType": "DiagnosticReport", "id": "bc", "status": "final", "subject": ME,
              "code": {"text": "Blood culture"}, "effectiveDateTime": "2025-03-02",
              "note": [{"text": "Gram-negative rods in both bottles; ward informed by phone."}]}
    order = {"resourceType": "ServiceRequest", "id": "sr", "status": "active", "intent": "order", "subject": ME,
             "doNotPerform": True, "code": {"text": "MRI of the brain"}}
    texts = {f.id: f.text for f in _read(allergy, drug, report, order).fragments}
    assert "high" in texts["AllergyIntolerance/al"] and "Warfarin 5 mg" in texts["MedicationRequest/rx"]
    assert "Gram-negative rods" in texts["DiagnosticReport/bc"]
    assert "do not perform MRI of the brain" in texts["ServiceRequest/sr"]


@pytest.mark.parametrize("word", ["ICD", "SCT", "KRAS_G12C", "FoundationOne", "Nil"])
def test_clinical_words_shaped_like_codes_or_brands_are_kept(word: str) -> None:
    procedure = {"resourceType": "Procedure", "id": "x", "status": "completed", "subject": ME,
                 "code": {"text": word}, "performedDateTime": "2024-02-02"}
    assert any(word in f.text for f in _read(procedure).fragments if f.id == "Procedure/x")


def test_a_chart_the_coverage_audit_cannot_walk_keeps_what_its_renderers_say(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ebmrag.records.fhir import coverage

    def broken(self: object, reads: object) -> None:
        raise ValueError("an element of a shape nobody foresaw")
    monkeypatch.setattr(coverage.Audit, "leftovers", broken)
    record = _read(_order("m2", "Metoprolol 25 mg"))
    assert any("Metoprolol" in f.text for f in record.fragments)
    assert any("could not be audited (ValueError)" in note for note in record.skipped)
