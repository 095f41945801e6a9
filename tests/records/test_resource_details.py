"""The clinical elements of allergies, problems, procedures, immunizations, care plans, goals and family histories
reach their fragment's text (records/fhir/resources.py), and a document's medication list keeps its statuses on the
face sheet (records/fhir/medications.py, facts.medication_summary)."""

from __future__ import annotations

from typing import Any

import pytest

from ebmrag.records.fhir.bundle import record_from_fhir_bundle

SNOMED = "http://snomed.info/sct"
ME = {"reference": "Patient/p1"}
PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1958-09-30"}


def texts(*resources: dict[str, Any], kind: str = "collection") -> dict[str, str]:
    bundle = {"resourceType": "Bundle", "type": kind,
              "entry": [{"fullUrl": f"urn:uuid:{r['resourceType']}-{r.get('id', n)}", "resource": r}
                        for n, r in enumerate((PATIENT, *resources))]}
    return {f.id: f.text for f in record_from_fhir_bundle(bundle, "test").fragments}


def note(words: str) -> list[dict[str, str]]:
    return [{"text": words}]


def test_an_allergy_says_its_notes_reactions_and_criticality() -> None:
    entry = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "category": ["medication"],
             "criticality": "low", "code": {"text": "Trimethoprim"}, "onsetDateTime": "2011-04",
             "note": note("Tolerated nitrofurantoin since"),
             "reaction": [{"manifestation": [{"coding": [{"system": SNOMED, "code": "271807003",
                                                          "display": "emr.allergy.ManifestationImpl"}],
                                              "text": "Generalised rash"}],
                           "description": "Blotchy rash over trunk on day 3 of the course",
                           "substance": {"text": "Co-trimoxazole"}, "severity": "moderate",
                           "onset": "2011-04-19", "note": note("Seen by GP, settled with antihistamine")}]}
    line = texts(entry)["AllergyIntolerance/a1"]
    for said in ("Generalised rash", "Blotchy rash over trunk on day 3 of the course", "to Co-trimoxazole",
                 "moderate reaction", "onset 2011-04-19", "Seen by GP, settled with antihistamine",
                 "note: Tolerated nitrofurantoin since", "criticality low", "since 2011-04"):
        assert said in line, (said, line)
    assert "ManifestationImpl" not in line


def test_an_allergy_reaction_with_only_a_description_says_it() -> None:
    entry = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "criticality": "high",
             "code": {"text": "Peanut"}, "reaction": [{"description": "Lip swelling within minutes"}]}
    assert texts(entry)["AllergyIntolerance/a1"] == ("Allergy to Peanut (high criticality); reaction: Lip swelling "
                                                     "within minutes.")


def test_a_condition_says_its_stage_severity_site_evidence_and_notes() -> None:
    egfr = {"resourceType": "Observation", "id": "o1", "subject": ME, "status": "final",
            "code": {"text": "eGFR"}, "valueQuantity": {"value": 38, "unit": "mL/min/1.73m2"},
            "effectiveDateTime": "2024-02-01"}
    ckd = {"resourceType": "Condition", "id": "c1", "subject": ME, "clinicalStatus": {"coding": [{"code": "active"}]},
           "code": {"text": "Chronic kidney disease"}, "onsetDateTime": "2019",
           "severity": {"text": "Moderate"}, "bodySite": [{"text": "Both kidneys"}],
           "stage": [{"summary": {"text": "G3b"}, "type": {"text": "KDIGO GFR category"}}],
           "evidence": [{"code": [{"text": "Proteinuria"}], "detail": [{"reference": "Observation/o1"}]}],
           "note": note("Nephrology review yearly")}
    found = texts(egfr, ckd)
    name = "Chronic kidney disease, site Both kidneys, stage G3b (KDIGO GFR category), severity Moderate"
    assert found["Condition/c1"] == f"Active problem: {name} (since 2019)."
    assert found["Condition/c1#note"] == (f"Active problem {name}; evidence: Proteinuria, eGFR 38 mL/min/1.73m2; "
                                          "note: Nephrology review yearly.")
    assert found["summary/active-problems"] == f"Active problems (1): {name}."  # one name per problem


def test_a_cancer_stage_is_said_with_a_resolved_condition_too() -> None:
    cancer = {"resourceType": "Condition", "id": "c1", "subject": ME,
              "clinicalStatus": {"coding": [{"code": "remission"}]}, "code": {"text": "Carcinoma of colon"},
              "abatementDateTime": "2021-06", "stage": [{"summary": {"text": "T3 N1 M0"}, "type": {"text": "TNM"}}]}
    assert texts(cancer)["Condition/c1"] == ("Resolved problem: Carcinoma of colon, stage T3 N1 M0 (TNM) "
                                             "(resolved 2021-06).")


def test_a_procedure_says_where_why_and_what_came_of_it() -> None:
    entry = {"resourceType": "Procedure", "id": "p1", "subject": ME, "status": "completed",
             "code": {"text": "Total knee replacement"}, "performedDateTime": "2023-03-14",
             "bodySite": [{"text": "Right knee"}], "reasonCode": [{"text": "Osteoarthritis of knee"}],
             "outcome": {"text": "Good range of movement"}, "complication": [{"text": "Superficial wound infection"}],
             "followUp": [{"text": "Physiotherapy for six weeks"}], "note": note("Cemented prosthesis")}
    line = texts(entry)["Procedure/p1"]
    for said in ("Total knee replacement (2023-03-14)", "site: Right knee", "reason: Osteoarthritis of knee",
                 "outcome: Good range of movement", "complications: Superficial wound infection",
                 "follow-up: Physiotherapy for six weeks", "note: Cemented prosthesis"):
        assert said in line, (said, line)


def test_an_immunization_says_its_dose_reaction_and_notes_and_one_not_given_says_why() -> None:
    fever = {"resourceType": "Observation", "id": "o1", "subject": ME, "status": "final", "code": {"text": "Fever"},
             "valueQuantity": {"value": 39.1, "unit": "Cel"}}
    given = {"resourceType": "Immunization", "id": "i1", "patient": ME, "status": "completed",
             "vaccineCode": {"text": "Hepatitis B vaccine"}, "occurrenceDateTime": "2022-05-02",
             "protocolApplied": [{"doseNumberPositiveInt": 2, "seriesDosesPositiveInt": 3, "series": "adult schedule"}],
             "reaction": [{"date": "2022-05-03", "detail": {"reference": "Observation/o1"}}],
             "note": note("Given in left deltoid")}
    withheld = {"resourceType": "Immunization", "id": "i2", "patient": ME, "status": "not-done",
                "vaccineCode": {"text": "Measles, mumps and rubella vaccine"}, "occurrenceDateTime": "2023-01-10",
                "statusReason": {"text": "Immunosuppressed (on azathioprine)"}}
    found = texts(fever, given, withheld)
    for said in ("dose: 2 of 3 (adult schedule)", "reaction: Fever 39.1 Cel (2022-05-03)",
                 "note: Given in left deltoid"):
        assert said in found["Immunization/i1"], (said, found["Immunization/i1"])
    assert found["Immunization/i2"] == ("Immunization not given: Measles, mumps and rubella vaccine (2023-01-10); "
                                        "reason not given: Immunosuppressed (on azathioprine).")


def test_a_care_plan_says_its_activities_goals_description_and_notes() -> None:
    goal = {"resourceType": "Goal", "id": "g1", "subject": ME, "lifecycleStatus": "active",
            "description": {"text": "Walk 5000 steps a day"}}
    referral = {"resourceType": "ServiceRequest", "id": "s1", "subject": ME, "status": "active", "intent": "order",
                "code": {"text": "Referral to cardiac rehabilitation"}}
    plan = {"resourceType": "CarePlan", "id": "cp1", "subject": ME, "status": "active", "intent": "plan",
            "category": [{"text": "Cardiac care plan"}], "description": "After myocardial infarction",
            "goal": [{"reference": "Goal/g1"}], "note": note("Patient keen to return to cycling"),
            "activity": [{"detail": {"code": {"text": "Smoking cessation counselling"}, "status": "in-progress",
                                     "description": "Weekly sessions with the practice nurse"}},
                         {"reference": {"reference": "ServiceRequest/s1"}}]}
    line = texts(goal, referral, plan)["CarePlan/cp1"]
    for said in ("Care plan: Cardiac care plan (active)", "After myocardial infarction", "goals: Walk 5000 steps a day",
                 "Smoking cessation counselling (in-progress; Weekly sessions with the practice nurse)",
                 "Referral to cardiac rehabilitation", "note: Patient keen to return to cycling"):
        assert said in line, (said, line)


def test_a_goal_says_its_target_due_date_and_statuses() -> None:
    goal = {"resourceType": "Goal", "id": "g1", "subject": ME, "lifecycleStatus": "active",
            "achievementStatus": {"coding": [{"code": "improving", "display": "Improving"}]},
            "description": {"text": "Better glycaemic control"}, "startDate": "2024-01-15",
            "target": [{"measure": {"text": "HbA1c"}, "detailQuantity": {"value": 53, "comparator": "<",
                                                                        "unit": "mmol/mol"},
                        "dueDate": "2024-12-31"}]}
    assert texts(goal)["Goal/g1"] == ("Goal: Better glycaemic control (active, improving); since 2024-01-15; "
                                      "target: HbA1c <53 mmol/mol by 2024-12-31.")


def test_a_family_history_says_outcomes_deaths_and_notes() -> None:
    entry = {"resourceType": "FamilyMemberHistory", "id": "f1", "patient": ME, "status": "completed",
             "relationship": {"text": "Brother"}, "deceasedAge": {"value": 52, "unit": "a"},
             "note": note("Genetic testing offered to siblings"),
             "condition": [{"code": {"text": "Hypertrophic cardiomyopathy"},
                            "outcome": {"text": "Sudden cardiac death"}, "contributedToDeath": True,
                            "onsetAge": {"value": 30, "unit": "a"}}]}
    assert texts(entry)["FamilyMemberHistory/f1"] == (
        "Family history: Brother (deceased at age 52 a): Hypertrophic cardiomyopathy (onset age 30 a; outcome: "
        "Sudden cardiac death; contributed to death); note: Genetic testing offered to siblings.")


# ------------------------------------------------------------------------------------------------ medication lists
def _statement(rid: str, drug: str, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "MedicationStatement", "id": rid, "subject": ME, "status": "completed",
            "medicationCodeableConcept": {"text": drug}, "effectiveDateTime": "2025-11-02", **extra}


def _referral(*statements: dict[str, Any]) -> list[dict[str, Any]]:
    composition = {"resourceType": "Composition", "id": "doc", "status": "final", "subject": ME, "date": "2025-11-03",
                   "type": {"text": "Referral summary"}, "title": "Referral",
                   "section": [{"title": "Current medication", "entry": [{"reference": f"urn:uuid:MedicationStatement-"
                                                                                       f"{s['id']}"}
                                                                         for s in statements]}]}
    return [composition, *statements]


def test_a_referral_summary_that_marks_its_drugs_completed_lists_them_with_that_status() -> None:
    found = texts(*_referral(_statement("m1", "Apixaban 5 mg tablet"), _statement("m2", "Bisoprolol 2.5 mg tablet")),
                  kind="document")
    sheet = found["summary/active-medications"]
    assert sheet == ("Medications listed in the chart's document (2): Apixaban (status completed); "
                     "Bisoprolol (status completed).")
    assert "none" not in sheet
    assert "listed by the chart's document with status completed" in found["MedicationStatement/m1"]


@pytest.mark.parametrize("why", ["not listed by a document", "ended for a stated reason"])
def test_completed_records_no_document_lists_or_that_say_why_they_ended_are_ended(why: str) -> None:
    stopped = _statement("m1", "Amoxicillin 500 mg capsule")
    if why == "not listed by a document":
        found = texts(stopped)
    else:
        stopped["statusReason"] = [{"text": "Course finished"}]
        found = texts(*_referral(stopped), kind="document")
    assert found["summary/active-medications"] == "Active medications: none marked active (1 earlier medication " \
                                                  "records)."
