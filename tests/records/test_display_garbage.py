"""Garbage where a concept's name belongs is told by its shape (records/fhir/coding.py, rules/records/display.toml):
software identifiers, code-system names and URIs, placeholders that only repeat the record's own type, null
flavours. Each falls back to the concept's text, its original text, another coding's display, then the code named
with its system; a record made of placeholders only is an absence, skipped with its reason."""

from __future__ import annotations

from typing import Any

import pytest

from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fhir.coding import is_garbage, is_placeholder, names_nothing, text_of
from ebmrag.records.fragment import PatientRecord

SNOMED, RXNORM = "http://snomed.info/sct", "http://www.nlm.nih.gov/research/umls/rxnorm"
ME = {"reference": "Patient/p1"}
PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "male", "birthDate": "1961-02-03"}
ACTIVE = {"coding": [{"code": "active"}]}
ORIGINAL_TEXT = "http://hl7.org/fhir/StructureDefinition/originalText"


def read(*resources: dict[str, Any]) -> PatientRecord:
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in (PATIENT, *resources)]}
    return record_from_fhir_bundle(bundle, "test")


def texts(record: PatientRecord) -> dict[str, str]:
    return {f.id: f.text for f in record.fragments}


def condition(rid: str, code: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Condition", "id": rid, "subject": ME, "clinicalStatus": ACTIVE, "code": code, **extra}


# ------------------------------------------------------------------------------------------------ shapes
@pytest.mark.parametrize("words", [
    "com.acme.emr.model.ReactionEntity",  # a Java class
    "ManifestationValueObject",  # CamelCase, three humps
    "SymptomDTO",  # a name ending in a software word
    "reactionCodeText",  # lowerCamel
    "REACTION_TYPE_CD", "sub_stance_name",  # identifiers with underscores
    "Observation.valueCodeableConcept",  # a FHIR element path
    "6f0e5c1a-7d2b-4c1e-9a3f-2b8d9e0c1f44", "{6F0E5C1A-7D2B-4C1E-9A3F-2B8D9E0C1F44}",  # GUIDs
    "1.2.840.10008.5.1.4", "urn:oid:2.16.840.1.113883.6.88",  # OIDs
    "https://terminology.example.org/cs/reactions", "www.example.org/allergies",  # URLs
    "ICD-10-CM", "RxNorm", "CPT-4", "MedDRA",  # code-system names
    "undefined", "[object Object]", "${manifestation.display}", "ReactionImpl@4e25154f",  # a program's leftovers
])
def test_software_identifiers_and_code_system_names_are_garbage(words: str) -> None:
    assert is_garbage(words)


@pytest.mark.parametrize("words", [
    "Gout", "Asthma", "Hives", "EpiPen", "OxyContin", "NovoRapid", "cTnI", "eGFR", "IgE", "HbA1c",  # brands, labs
    "p.Gly12Asp", "NM_000546.5", "c.35G>A",  # HGVS and a RefSeq accession
    "Akt.Lymphoz.rel.mi.", "Vit.D", "E.coli", "Tab.Paracetamol",  # abbreviations written with dots
    "1+", "+++", "Na", "K", "Problem",  # values, and a word that is a placeholder only for its own record
])
def test_clinical_words_brands_abbreviations_and_values_are_not_garbage(words: str) -> None:
    assert not is_garbage(words)


@pytest.mark.parametrize(("words", "kind"), [
    ("Diagnosis", "Condition"), ("Health concern", "Condition"), ("Clinical finding", "Condition"),
    ("Intolerance", "AllergyIntolerance"), ("Adverse reaction", "AllergyIntolerance"),
    ("Manifestation", "AllergyIntolerance.reaction.manifestation"), ("Vaccine", "Immunization.vaccineCode"),
    ("Drug", "MedicationStatement.medicationCodeableConcept"), ("Procedure", "Procedure"), ("Goal", "Goal"),
    ("Family history", "FamilyMemberHistory.condition"), ("asked but unknown", "Condition"), ("NASK", "Condition"),
    ("-", "Condition"), ("Diagnoses", "Condition"),
])
def test_a_display_that_only_names_its_own_record_is_a_placeholder(words: str, kind: str) -> None:
    assert is_placeholder(words, kind)


@pytest.mark.parametrize(("words", "kind"), [
    ("Gout", "Condition"), ("Heart disease", "Condition"), ("Drug allergy", "AllergyIntolerance"),
    ("Lactose intolerance", "AllergyIntolerance"), ("Influenza vaccine", "Immunization.vaccineCode"),
    ("No current problems", "Condition"), ("Diagnosis", "Observation"), ("Vaccine", "Condition"),
])
def test_a_clinical_name_or_another_records_word_is_no_placeholder(words: str, kind: str) -> None:
    assert not is_placeholder(words, kind)


# ------------------------------------------------------------------------------------------------ fallbacks
def test_garbage_text_falls_back_to_the_original_text() -> None:
    concept = {"text": "AdverseEventManifestationBean",
               "extension": [{"url": ORIGINAL_TEXT, "valueString": "Swollen tongue"}],
               "coding": [{"system": SNOMED, "code": "271771009", "display": "SNOMED-CT"}]}
    assert text_of(concept) == "Swollen tongue"


def test_a_garbage_display_falls_back_to_the_next_display_then_the_code_with_its_system() -> None:
    two = {"coding": [{"system": SNOMED, "code": "271807003", "display": "ehr_rash_cd"},
                      {"system": "urn:oid:1.2.3.4", "code": "R21", "display": "Eruption of skin"}]}
    assert text_of(two) == "Eruption of skin"
    one = {"coding": [{"system": RXNORM, "code": "7052", "display": "https://vendor.example/meds/7052"}]}
    assert text_of(one) == "7052 (RxNorm)"
    repeated = {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10", "code": "M10.9", "display": "M10.9"}]}
    assert text_of(repeated) == "M10.9 (ICD-10)"


def test_a_placeholder_coding_means_its_code_too() -> None:
    """"Diagnosis" (SNOMED CT 282291009) names no condition: its code is no fallback, and the concept names nothing."""
    concept = {"coding": [{"system": SNOMED, "code": "282291009", "display": "Diagnosis interpretation"}]}
    assert text_of(concept, "Condition") == "" and names_nothing(concept, "Condition") == "Diagnosis interpretation"
    assert text_of(concept) == "Diagnosis interpretation"  # without its record, a display is shown as written
    assert names_nothing({"text": "Tophaceous gout"}, "Condition") == ""
    assert names_nothing({}, "Condition") == ""  # an empty concept is no placeholder: nothing was written


def test_a_reaction_shown_as_a_software_class_is_read_from_its_original_text() -> None:
    entry = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "category": ["medication"],
             "code": {"coding": [{"system": RXNORM, "code": "2670", "display": "Codeine"}]},
             "reaction": [{"manifestation": [{
                 "coding": [{"system": SNOMED, "code": "4386001", "display": "com.acme.emr.model.ReactionEntity"}],
                 "extension": [{"url": ORIGINAL_TEXT, "valueString": "Wheezing after two doses"}]}]}]}
    line = texts(read(entry))["AllergyIntolerance/a1"]
    assert line == "Drug allergy to Codeine (Wheezing after two doses)."
    assert "ReactionEntity" not in line


def test_a_reaction_whose_every_word_is_garbage_is_named_by_its_code() -> None:
    entry = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "code": {"text": "Latex"},
             "reaction": [{"manifestation": [{"coding": [{"system": SNOMED, "code": "126485001",
                                                          "display": "AllergyReactionManifestationImpl"}]}]}]}
    assert texts(read(entry))["AllergyIntolerance/a1"] == "Allergy to Latex (126485001 (SNOMED CT))."


# ------------------------------------------------------------------------------------------------ absences
def test_a_condition_made_only_of_placeholders_is_no_active_problem() -> None:
    record = read(condition("c1", {"coding": [{"system": SNOMED, "code": "282291009", "display": "Diagnosis"}]}),
                  condition("c2", {"text": "Health concern"}),
                  condition("c3", {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-NullFlavor",
                                               "code": "NASK", "display": "not asked"}]}),
                  condition("c4", {"text": "Asthma"}), condition("c5", {"text": "Gout"}))
    found = texts(record)
    assert not {"Condition/c1", "Condition/c2", "Condition/c3"} & set(found)
    assert found["Condition/c4"] == "Active problem: Asthma." and found["Condition/c5"] == "Active problem: Gout."
    assert found["summary/active-problems"] == "Active problems (2): Asthma; Gout."
    assert sorted(line for line in record.skipped if "placeholder only" in line) == [
        "Condition x1: placeholder only: Diagnosis", "Condition x1: placeholder only: Health concern",
        "Condition x1: placeholder only: not asked"]


def test_a_placeholder_condition_with_a_note_keeps_the_note() -> None:
    found = texts(read(condition("c1", {"text": "Diagnosis"}, note=[{"text": "Recurrent knee effusions, query CPPD"}])))
    assert found["Condition/c1"] == "Active problem: unnamed condition."
    assert found["Condition/c1#note"] == "Active problem unnamed condition; note: Recurrent knee effusions, query CPPD."


def test_placeholder_allergies_vaccines_procedures_drugs_and_goals_are_absences() -> None:
    record = read(
        {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "code": {"text": "Intolerance"}},
        {"resourceType": "Immunization", "id": "i1", "patient": ME, "status": "completed",
         "vaccineCode": {"text": "Vaccine"}, "occurrenceDateTime": "2020-01-01"},
        {"resourceType": "Procedure", "id": "p1", "subject": ME, "status": "completed", "code": {"text": "Procedure"}},
        {"resourceType": "MedicationStatement", "id": "m1", "subject": ME, "status": "active",
         "medicationCodeableConcept": {"text": "Drug"}},
        {"resourceType": "MedicationStatement", "id": "m2", "subject": ME, "status": "active",
         "medicationCodeableConcept": {"text": "Allopurinol 100 MG Oral Tablet"}},
        {"resourceType": "Goal", "id": "g1", "subject": ME, "lifecycleStatus": "active",
         "description": {"text": "Goal"}})
    found = texts(record)
    assert not {"AllergyIntolerance/a1", "Immunization/i1", "Procedure/p1", "MedicationStatement/m1", "Goal/g1"} \
        & set(found)
    assert found["summary/active-medications"] == "Active medications (1): Allopurinol."
    assert sum("placeholder only" in line for line in record.skipped) == 5


def test_a_placeholder_allergen_with_a_reaction_is_still_an_allergy() -> None:
    entry = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ME, "code": {"text": "Adverse reaction"},
             "reaction": [{"manifestation": [{"text": "Urticaria"}]}]}
    assert texts(read(entry))["AllergyIntolerance/a1"] == "Allergy to unspecified substance (Urticaria)."
