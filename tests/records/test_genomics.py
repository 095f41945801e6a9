"""Issue 47: genomic results, Observation.component and recommendations are read, not reduced to "Present".

The three genomic reports in ../shared/data/fhir_charts/genomics/ (SOURCE.md's "Genomics" section states their
facts) must yield the gene, the variant, the genotype, the implications with their drugs and the Task's advice,
each as a T1 fragment. Small charts written here cover a component-only vital sign, a recommendation that names a
drug, a detected issue, a risk assessment and a withdrawn Task.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fragment import Fragment, PatientRecord, Tier

GENOMICS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fhir_charts" / "genomics"


@pytest.fixture(scope="module")
def classifier() -> TierClassifier:
    return TierClassifier()


def _chart(name: str) -> PatientRecord:
    path = GENOMICS_DIR / name
    if not path.is_file():
        pytest.skip(f"shared genomic chart {path} not present beside the checkout")
    return record_from_fhir_bundle(json.loads(path.read_text(encoding="utf-8")), name)


def _line(record: PatientRecord, *patterns: str) -> Fragment:
    """The one fragment whose text matches every pattern (case-insensitive)."""
    found = [f for f in record.fragments if all(re.search(p, f.text, re.IGNORECASE) for p in patterns)]
    assert found, f"no fragment says {patterns}: {[f.text for f in record.fragments]}"
    return found[0]


def _tiered(record: PatientRecord, classifier: TierClassifier) -> PatientRecord:
    return classifier.run(record)


# ---------------------------------------------------------------- the shared genomic reports

PGX = "genomics_pgx_cyp2c9_transaction.json"
GERMLINE = "genomics_germline_acad9_cyp2d6_collection.json"
ONCOLOGY = "genomics_oncology_jak2_transaction.json"

FACTS: dict[str, list[tuple[str, ...]]] = {
    PGX: [
        (r"^Genotype: CYP2C9 \*4/\*35B",),
        (r"Haplotype: CYP2C9 \*4\b",), (r"Haplotype: CYP2C9 \*35B",),
        (r"Genetic variant", r"CYP2C9", r"rs12345", r"T>G"), (r"Genetic variant", r"CYP2C9", r"rs233455", r"T>G"),
        (r"Pharmacogenomic implication: CYP2C9 \*4/\*35B", r"rapid metabolizer for mercaptopurine"),
        (r"^Genomic recommendation for mercaptopurine", r"Recommendation Text", r"rapid metabolizer"),
    ],
    GERMLINE: [
        (r"Genetic variant", r"ACAD9", r"c\.1249C>T", r"p\.Arg417Cys", r"heterozygous", r"germline"),
        (r"Genomic diagnostic implication", r"ACAD9", r"pathogenic for acyl-CoA dehydrogenase"),
        (r"Genetic variant", r"CYP2D6", r"c\.886C>T", r"p\.Arg296Cys"),
        (r"Genetic variant", r"CYP2D6", r"c\.1457G>C", r"p\.Ser486Thr"),
        (r"Genomic diagnostic implication", r"c\.886C>T", r"c\.1457G>C", r"pathogenic for debrisoquine"),
        (r"Genotype: CYP2C9 \*2/\*5", r"VKORC1"),
        (r"Pharmacogenomic implication", r"CYP2C9 \*2/\*5", r"rapid metabolizer for warfarin"),
        (r"Pharmacogenomic implication", r"resistant for warfarin"),
        (r"Pharmacogenomic implication", r"low risk for warfarin"),
        (r"^Genomic recommendation for warfarin", r"may need higher dosage than usual"),
    ],
    ONCOLOGY: [
        (r"tumou?r mutational burden\D{0,20}25",), (r"MSI status\W+high",),
        (r"Genetic variant", r"JAK2", r"9:g\.5073770G>T", r"p\.Val617Phe"),
        (r"Genetic variant", r"KDR", r"p\.Gln472His"),
        (r"Genetic variant", r"ERBB4", r"2:g\.212578380del"),
        *[(r"Pharmacogenomic implication", r"JAK2", rf"responsive for {drug}", r"polycythemia vera",
           r"AMP guidelines") for drug in ("ruxolitinib", "AT9283", "SNX-5422", "TG02")],
    ],
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_a_genomic_report_says_its_genes_variants_and_drugs(name: str) -> None:
    record = _chart(name)
    for patterns in FACTS[name]:
        _line(record, *patterns)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_present_alone_no_longer_stands_for_a_variant(name: str) -> None:
    record = _chart(name)
    texts = [f.text for f in record.fragments]
    assert not any(re.search(r"variant assessment:? present\b", t, re.IGNORECASE) for t in texts), texts
    variants = [t for t in texts if t.startswith("Genetic variant")]
    assert variants and all(re.search(r"[cgp]\.\w|rs\d+|>", t) for t in variants), variants
    assert not any("resource type not used for packing" in s and s.startswith("Task") for s in record.skipped)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_genomic_findings_and_recommendations_are_t1(name: str, classifier: TierClassifier) -> None:
    record = _tiered(_chart(name), classifier)
    genomic = [f for f in record.fragments if f.section.startswith("Genomic")]
    assert len(genomic) >= 5
    wrong = [(f.section, f.text, f.decision.rule_id if f.decision else None) for f in genomic if f.tier != Tier.T1]
    assert not wrong


def test_an_implication_names_the_variant_it_derives_from() -> None:
    record = _chart(GERMLINE)
    implication = _line(record, r"^Genomic diagnostic implication", r"acyl-CoA")
    assert implication.text.index("ACAD9") < implication.text.index("Pathogenic"), implication.text


def test_a_recommendation_names_its_drug_from_the_contained_medication() -> None:
    """The germline Task names warfarin only through `focus: #med` (a contained MedicationStatement) and through
    the implication it gives as its reason."""
    task = _line(_chart(GERMLINE), r"^Genomic recommendation")
    assert task.id == "Task/usage" and task.section == "Genomic recommendation"
    assert "based on CYP2C9 *2/*5" in task.text and "status requested" in task.text


# ---------------------------------------------------------------- small charts of our own

def _bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    patient = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1970-04-02"}
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"resource": r} for r in (patient, *resources)]}


SUBJECT = {"reference": "Patient/p1"}


def _read(*resources: dict[str, Any]) -> PatientRecord:
    return record_from_fhir_bundle(_bundle(*resources), "inline")


def _loinc(code: str, display: str = "") -> dict[str, Any]:
    coding = {"system": "http://loinc.org", "code": code}
    return {"coding": [{**coding, "display": display} if display else coding]}


def test_a_vital_sign_given_only_in_components_keeps_every_component() -> None:
    pressure = {"resourceType": "Observation", "id": "bp", "status": "final", "subject": SUBJECT,
                "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                          "code": "vital-signs"}]}],
                "code": _loinc("85354-9", "Blood pressure panel"), "effectiveDateTime": "2024-02-01",
                "component": [
                    {"code": _loinc("8480-6", "Systolic blood pressure"),
                     "valueQuantity": {"value": 168, "unit": "mmHg"},
                     "interpretation": [{"coding": [{"code": "H"}]}]},
                    {"code": _loinc("8462-4", "Diastolic blood pressure"),
                     "valueQuantity": {"value": 94, "unit": "mmHg"}},
                    {"code": {"text": "Cuff size"}, "valueString": "large adult"},
                    {"code": {"text": "Position"},
                     "dataAbsentReason": {"coding": [{"code": "not-asked"}], "text": "not asked"}}]}
    line = _line(_read(pressure), r"^Blood pressure panel")
    assert line.section == "Vital signs"
    for said in ("Systolic blood pressure: 168 mmHg (flag high)", "Diastolic blood pressure: 94 mmHg",
                 "Cuff size: large adult", "Position: not recorded (not asked)"):
        assert said in line.text, line.text


def test_an_observation_without_components_reads_as_before() -> None:
    potassium = {"resourceType": "Observation", "id": "k", "status": "final", "subject": SUBJECT,
                 "code": _loinc("2823-3", "Potassium"), "valueQuantity": {"value": 4.2, "unit": "mmol/L"}}
    assert _line(_read(potassium), r"Potassium").text == "Potassium: 4.2 mmol/L."


def test_a_value_and_its_components_are_both_kept() -> None:
    reading = {"resourceType": "Observation", "id": "o", "status": "final", "subject": SUBJECT,
               "code": {"text": "Peak flow"}, "valueQuantity": {"value": 320, "unit": "L/min"},
               "component": [{"code": {"text": "Best of three"}, "valueBoolean": True}]}
    assert _line(_read(reading), r"Peak flow").text == "Peak flow: 320 L/min; Best of three: True."


RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"


def _implication(oid: str, drug: str, effect: str, source: str) -> dict[str, Any]:
    return {"resourceType": "Observation", "id": oid, "status": "final", "subject": SUBJECT,
            "code": {"coding": [{"system": "http://hl7.org/fhir/uv/genomics-reporting/CodeSystem/tbd-codes-cs",
                                 "code": "therapeutic-implication"}]},
            "derivedFrom": [{"reference": f"Observation/{source}"}],
            "component": [{"code": _loinc("51963-7"), "valueCodeableConcept": {"coding": [
                               {"system": RXNORM, "code": "1", "display": drug}]}},
                          {"code": _loinc("53040-2"), "valueCodeableConcept": {"text": effect}}]}


GENOTYPE = {"resourceType": "Observation", "id": "gt", "status": "final", "subject": SUBJECT,
            "code": _loinc("84413-4"), "valueCodeableConcept": {"text": "CYP2C19 *2/*2"},
            "component": [{"code": _loinc("48018-6"), "valueCodeableConcept": {"coding": [
                {"system": "http://www.genenames.org", "code": "HGNC:2621", "display": "CYP2C19"}]}}]}


def test_a_task_recommendation_names_the_drug_it_affects(classifier: TierClassifier) -> None:
    implication = _implication("imp", "clopidogrel", "Poor metabolizer", "gt")
    advice = {"resourceType": "Task", "id": "t1", "status": "requested", "intent": "proposal", "for": SUBJECT,
              "code": {"text": "Consider an alternative antiplatelet agent"},
              "reasonReference": {"reference": "Observation/imp"},
              "input": [{"type": {"text": "Suggested alternative"}, "valueCodeableConcept": {"coding": [
                  {"system": RXNORM, "code": "2", "display": "prasugrel"}]}}]}
    record = _tiered(_read(GENOTYPE, implication, advice), classifier)
    task = _line(record, r"^Genomic recommendation")
    assert task.id == "Task/t1" and task.section == "Genomic recommendation"
    assert task.text.startswith("Genomic recommendation for clopidogrel, prasugrel: Consider an alternative"), \
        task.text
    assert "based on CYP2C19 *2/*2 — Poor metabolizer for clopidogrel" in task.text
    assert task.tier == Tier.T1
    assert _line(record, r"^Pharmacogenomic implication: CYP2C19 \*2/\*2 — Poor metabolizer for clopidogrel").tier \
        == Tier.T1


def test_a_request_that_names_only_a_genomic_profile_is_still_a_genomic_recommendation() -> None:
    advice = {"resourceType": "Task", "id": "t2", "status": "requested", "for": SUBJECT,
              "meta": {"profile": ["http://hl7.org/fhir/uv/genomics-reporting/StructureDefinition/"
                                   "medication-recommendation"]},
              "description": "Avoid codeine and tramadol", "focus": {"display": "codeine"}}
    task = _line(_read(advice), r"Avoid codeine")
    assert task.section == "Genomic recommendation" and task.text.startswith("Genomic recommendation for codeine:")


def test_a_withdrawn_task_is_skipped_with_its_reason() -> None:
    wrong = {"resourceType": "Task", "id": "t3", "status": "entered-in-error", "for": SUBJECT,
             "description": "Stop warfarin"}
    gone = {"resourceType": "ServiceRequest", "id": "s1", "status": "revoked", "intent": "order", "subject": SUBJECT,
            "code": {"text": "Echocardiogram"}}
    record = _read(wrong, gone)
    assert not any("warfarin" in f.text.lower() or "echocardiogram" in f.text.lower() for f in record.fragments)
    assert any(s.startswith("Task x1: entered-in-error") for s in record.skipped), record.skipped
    assert any(s.startswith("ServiceRequest x1: revoked") for s in record.skipped), record.skipped


def test_an_order_for_a_test_is_an_order_line_with_its_status() -> None:
    order = {"resourceType": "ServiceRequest", "id": "s2", "status": "active", "intent": "order",
             "subject": SUBJECT, "code": {"text": "HbA1c"}, "authoredOn": "2024-03-01",
             "reasonCode": [{"text": "type 2 diabetes"}]}
    line = _line(_read(order), r"^Order: HbA1c")
    assert line.section == "Order" and "reason: type 2 diabetes" in line.text and "status active" in line.text
    assert line.timestamp is not None and line.timestamp.year == 2024


def test_a_detected_issue_names_its_severity_and_the_drugs_implicated() -> None:
    warfarin = {"resourceType": "MedicationRequest", "id": "m1", "status": "active", "intent": "order",
                "subject": SUBJECT, "medicationCodeableConcept": {"text": "warfarin 5 mg"}}
    aspirin = {"resourceType": "MedicationRequest", "id": "m2", "status": "active", "intent": "order",
               "subject": SUBJECT, "medicationCodeableConcept": {"text": "aspirin 300 mg"}}
    issue = {"resourceType": "DetectedIssue", "id": "d1", "status": "final", "patient": SUBJECT,
             "code": {"text": "Drug interaction"}, "severity": "high", "identifiedDateTime": "2024-05-02",
             "detail": "Bleeding risk: warfarin with high-dose aspirin",
             "implicated": [{"reference": "MedicationRequest/m1"}, {"reference": "MedicationRequest/m2"}],
             "mitigation": [{"action": {"text": "Stop aspirin"}}]}
    line = _line(_read(warfarin, aspirin, issue), r"^Detected issue")
    assert line.text.startswith("Detected issue: Drug interaction severity high: Bleeding risk"), line.text
    assert "implicated: warfarin 5 mg, aspirin 300 mg" in line.text and "mitigation: Stop aspirin" in line.text
    assert line.section == "Detected issue > high"


def test_a_risk_assessment_gives_outcome_probability_and_basis() -> None:
    history = {"resourceType": "Observation", "id": "fh", "status": "final", "subject": SUBJECT,
               "code": {"text": "Family history of breast cancer"}, "valueString": "mother, age 42"}
    risk = {"resourceType": "RiskAssessment", "id": "r1", "status": "final", "subject": SUBJECT,
            "method": {"text": "Gail model"}, "occurrenceDateTime": "2023-11-20",
            "basis": [{"reference": "Observation/fh"}],
            "prediction": [{"outcome": {"text": "Invasive breast cancer"}, "probabilityDecimal": 0.034,
                            "qualitativeRisk": {"text": "moderate"}, "whenRange": {"high": {"value": 5,
                                                                                           "unit": "years"}}}]}
    line = _line(_read(history, risk), r"^Risk assessment")
    assert line.text.startswith("Risk assessment (Gail model): Invasive breast cancer probability 0.034 (moderate)")
    assert "within 5 years" in line.text and "basis: Family history of breast cancer mother, age 42" in line.text
    assert line.section == "Risk assessment"


def test_a_standalone_variant_reads_its_components_by_role() -> None:
    """A variant outside any report, its codes sent without displays: the LOINC names and roles come from
    rules/records/genomics.toml, the HGVS and gene as the chart wrote them."""
    variant = {"resourceType": "Observation", "id": "v1", "status": "final", "subject": SUBJECT,
               "meta": {"profile": ["http://hl7.org/fhir/uv/genomics-reporting/StructureDefinition/variant"]},
               "code": {"text": "Variant"}, "valueCodeableConcept": {"coding": [{"system": "http://loinc.org",
                                                                                  "code": "LA9633-4"}]},
               "component": [
                   {"code": _loinc("48018-6"), "valueCodeableConcept": {"coding": [
                       {"system": "http://www.genenames.org", "code": "HGNC:1100", "display": "BRCA1"}]}},
                   {"code": _loinc("51958-7"), "valueCodeableConcept": {"coding": [
                       {"system": "http://www.ncbi.nlm.nih.gov/refseq", "code": "NM_007294.4"}]}},
                   {"code": _loinc("48004-6"), "valueCodeableConcept": {"coding": [
                       {"system": "http://varnomen.hgvs.org", "code": "c.68_69del", "display": "c.68_69del"}]}},
                   {"code": _loinc("53034-5"), "valueCodeableConcept": {"coding": [
                       {"system": "http://loinc.org", "code": "LA6706-1"}]}},
                   {"code": _loinc("53037-8"), "valueCodeableConcept": {"coding": [
                       {"system": "http://loinc.org", "code": "LA6668-3"}]}},
                   {"code": _loinc("82121-5"), "valueQuantity": {"value": 180}}]}
    line = _line(_read(variant), r"BRCA1")
    assert line.text == ("Genetic variant (Present): BRCA1 NM_007294.4:c.68_69del; Heterozygous, clinical "
                         "significance Pathogenic; Allelic read depth: 180."), line.text
    assert line.section == "Genomic result > variant" and line.id == "Observation/v1"
