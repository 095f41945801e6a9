"""Issue 44: the CDS cards and the face sheet of one chart say the same thing, because both read one `ChartFacts`
(records.fhir.chart_facts): the allergies that stand, the newest renal results, and whether a pregnancy is current.

Checked on every shared FHIR Bundle whose Patient has an id (../shared/data/fhir_charts; a CDS hook always names
its patient by id) and on the charts where the two readers used to disagree: a result timed by `effectiveInstant`,
a refuted pregnancy Condition, a pregnancy recorded long ago, an allergy whose status is written as text, an allergy
entry that takes itself back.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ebmrag.cds.facts import Chart, allergy_facts, pregnancy_fact, renal_facts
from ebmrag.records.fragment import PatientRecord
from ebmrag.vocab.drugs import vocabulary

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data" / "fhir_charts"
NOW = datetime.now(UTC)
# "pregnancy status pregnant (2024-03-01)" or "pregnant (Pregnancy, recorded 2024-03-01)": said as current
CURRENT_PREGNANCY = re.compile(r"(?<!not )\bpregnant \((?![^)]*not current)[^)]*\)")


def resources_of(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """(the patient id, the chart's resources) of a FHIR Bundle file, as a FHIR server would give them to a hook:
    a reference to another entry's `fullUrl` ("urn:uuid:...") becomes "Type/id"."""
    bundle = json.loads(path.read_text(encoding="utf-8"))
    entries = [e for e in bundle.get("entry", []) if isinstance(e.get("resource"), dict)]
    server = {e["fullUrl"]: f"{e['resource'].get('resourceType')}/{e['resource']['id']}" for e in entries
              if isinstance(e.get("fullUrl"), str) and isinstance(e["resource"].get("id"), str)}
    resources = [as_served(e["resource"], server) for e in entries]
    patient = next((r["id"] for r in resources if r.get("resourceType") == "Patient" and r.get("id")), "")
    return patient, resources


def as_served(value: Any, server: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: server.get(v, v) if k == "reference" and isinstance(v, str) else as_served(v, server)
                for k, v in value.items()}
    return [as_served(v, server) for v in value] if isinstance(value, list) else value


CHARTS = [p for p in sorted(SHARED.glob("*.json")) if resources_of(p)[0]]


def face_sheet(record: PatientRecord | None, fragment_id: str) -> str:
    assert record is not None
    return next((f.text for f in record.fragments if f.id == fragment_id), "")


def patient_line(record: PatientRecord | None) -> str:
    assert record is not None
    return next((f.text for f in record.fragments if f.section == "Patient summary" and f.id.startswith("Patient/")),
                "")


def check_agreement(chart: Chart) -> None:
    record = chart.record
    assert record is not None
    # a current pregnancy on a card <=> the context says pregnant, not qualified as past
    card = pregnancy_fact(chart, NOW)
    said = patient_line(record)
    assert bool(card) == bool(CURRENT_PREGNANCY.search(said)), (card, said)
    # every renal value a card cites is the one on the face sheet, with its date
    drug_line = face_sheet(record, "summary/drug-facts")
    for fact in renal_facts(chart, NOW):
        assert f"{fact.result.name} {fact.result.value}" in drug_line, (fact, drug_line)
        assert fact.cited.shown_date in drug_line
    # the allergies a card compares are the ones the context lists, and no other
    banner = face_sheet(record, "summary/allergies")
    cited = {fact.cited.fragment for fact in allergy_facts(chart, vocabulary(), NOW)}
    listed = {f.id for f in record.fragments if (f.section or "").startswith("Allergy")
              and f.section != "Allergy status" and not f.id.startswith("summary/")}
    assert cited == listed, (cited, listed)
    for fragment in record.fragments:
        if fragment.id in listed:
            assert fragment.text.rstrip(".") in banner


@pytest.mark.parametrize("path", CHARTS, ids=[p.name for p in CHARTS])
def test_cards_and_face_sheet_agree_on_every_shared_chart(path: Path) -> None:
    chart = Chart(*resources_of(path))
    assert chart.record is not None, f"{path.name}: no record read"
    check_agreement(chart)


def test_shared_charts_are_read_by_the_cards() -> None:
    """The agreement above is not vacuous: the charts give the cards allergies, renal results and a pregnancy."""
    allergies = renal = pregnant = 0
    for path in CHARTS:
        chart = Chart(*resources_of(path))
        allergies += len(allergy_facts(chart, vocabulary(), NOW))
        renal += len(renal_facts(chart, NOW))
        pregnant += pregnancy_fact(chart, NOW) is not None
    assert len(CHARTS) >= 12 and allergies >= 10 and renal >= 5, (len(CHARTS), allergies, renal)


PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1990-01-01"}


def when(days_ago: int) -> str:
    return (NOW - timedelta(days=days_ago)).date().isoformat()


def observation(rid: str, loinc: str, display: str, **value: Any) -> dict[str, Any]:
    return {"resourceType": "Observation", "id": rid, "status": "final", "subject": {"reference": "Patient/p1"},
            "code": {"coding": [{"system": "http://loinc.org", "code": loinc, "display": display}]}, **value}


PREGNANT = {"valueCodeableConcept": {"coding": [{"system": "http://loinc.org", "code": "LA15173-0",
                                                 "display": "Pregnant"}]}}


def condition(rid: str, verification: str, recorded: str) -> dict[str, Any]:
    return {"resourceType": "Condition", "id": rid, "subject": {"reference": "Patient/p1"},
            "clinicalStatus": {"coding": [{"code": "active"}]},
            "verificationStatus": {"coding": [{"code": verification}]},
            "code": {"coding": [{"system": "http://snomed.info/sct", "code": "77386006", "display": "Pregnancy"}]},
            "recordedDate": recorded}


def allergy(rid: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "AllergyIntolerance", "id": rid, "patient": {"reference": "Patient/p1"},
            "code": {"text": text}, **extra}


CASES = {
    "creatinine timed by effectiveInstant": [observation(
        "cr", "2160-0", "Creatinine", effectiveInstant=f"{when(3)}T08:00:00Z",
        valueQuantity={"value": 2.4, "unit": "mg/dL"})],
    "refuted pregnancy condition": [condition("c1", "refuted", when(20))],
    "confirmed pregnancy condition": [condition("c2", "confirmed", when(20))],
    "pregnancy recorded three years ago": [observation("ps", "82810-3", "Pregnancy status",
                                                       effectiveDateTime=when(3 * 365), **PREGNANT)],
    "recent pregnancy status": [observation("ps", "82810-3", "Pregnancy status", effectiveDateTime=when(30),
                                            **PREGNANT)],
    "allergy entered in error, written as text": [
        allergy("a1", "Penicillin", verificationStatus={"text": "Entered in Error"}),
        allergy("a2", "Sulfamethoxazole")],
    "allergy taken back in its own words": [allergy("a3", "Not allergic to penicillin"),
                                            allergy("a4", "Codeine")],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cards_and_face_sheet_agree_where_the_readers_used_to_differ(name: str) -> None:
    chart = Chart("p1", [PATIENT, *CASES[name]])
    check_agreement(chart)


def test_the_agreement_is_the_safe_reading() -> None:
    """What the shared reading decides in each case (not only that the two agree)."""
    def chart(name: str) -> Chart:
        return Chart("p1", [PATIENT, *CASES[name]])

    assert [f.result.value for f in renal_facts(chart("creatinine timed by effectiveInstant"), NOW)] == ["2.4 mg/dL"]
    assert pregnancy_fact(chart("refuted pregnancy condition"), NOW) is None
    assert pregnancy_fact(chart("confirmed pregnancy condition"), NOW) is not None
    old = chart("pregnancy recorded three years ago")
    assert pregnancy_fact(old, NOW) is None
    assert "not current" in patient_line(old.record)
    assert pregnancy_fact(chart("recent pregnancy status"), NOW) is not None
    assert [f.entry.substance for f in allergy_facts(chart("allergy entered in error, written as text"), vocabulary(),
                                               NOW)] == ["Sulfamethoxazole"]
    taken_back = chart("allergy taken back in its own words")
    assert [f.entry.substance for f in allergy_facts(taken_back, vocabulary(), NOW)] == ["Codeine"]
    banner = face_sheet(taken_back.record, "summary/allergies")
    assert banner.startswith("Allergies (1): ") and "Codeine" in banner, banner
    assert "Not allergic to penicillin" in banner  # still said, as what the chart states, not as an allergy
