"""The reader's canonical resource order (records/fhir/order.py): periods are times, and of several versions of one
resource the newest keeps its plain id, whatever order the package delivered them in."""

from __future__ import annotations

import random
from typing import Any

from ebmrag.records.fhir.bundle import record_from_fhir_bundle

ME = {"reference": "Patient/p1"}
PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1980-05-01"}


def _bundle(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


def _condition(rid: str, text: str, onset: str) -> dict[str, Any]:
    return {"resourceType": "Condition", "id": rid, "subject": ME, "code": {"text": text}, "onsetDateTime": onset,
            "clinicalStatus": {"coding": [{"code": "active"}]}}


def _ids(bundle: dict[str, Any]) -> list[str]:
    return [f.id for f in record_from_fhir_bundle(bundle, "chart").fragments if not f.id.startswith("summary/")]


def test_a_resource_dated_only_by_its_period_takes_its_place_in_time() -> None:
    procedure = {"resourceType": "Procedure", "id": "pr1", "subject": ME, "status": "completed",
                 "code": {"text": "Appendectomy"}, "performedPeriod": {"start": "2015-06-01", "end": "2015-06-01"}}
    older, newer = _condition("c-old", "Asthma", "2001-02-03"), _condition("c-new", "Gout", "2020-01-01")
    for order in ([procedure, older, newer], [newer, procedure, older], [older, newer, procedure]):
        ids = _ids(_bundle(PATIENT, *order))
        assert ids.index("Condition/c-old") < ids.index("Procedure/pr1") < ids.index("Condition/c-new"), ids


def test_the_newest_version_of_a_resource_keeps_its_plain_id_in_any_delivery_order() -> None:
    def version(status: str, number: str, updated: str) -> dict[str, Any]:
        return {"resourceType": "MedicationRequest", "id": "m1", "intent": "order", "subject": ME, "status": status,
                "authoredOn": "2024-01-01", "medicationCodeableConcept": {"text": "Metformin 500 mg tablet"},
                "meta": {"versionId": number, "lastUpdated": updated}}

    first, current = version("active", "1", "2024-01-01T08:00:00Z"), version("stopped", "2", "2024-03-01T08:00:00Z")
    for order in ([first, current], [current, first]):
        record = record_from_fhir_bundle(_bundle(PATIENT, *order), "chart")
        plain = next(f for f in record.fragments if f.id == "MedicationRequest/m1")
        assert "stopped" in plain.text.lower(), plain.text


def test_fragment_order_does_not_depend_on_the_delivery_order() -> None:
    resources = [_condition(f"c{n}", name, f"20{10 + n}-01-01") for n, name in
                 enumerate(["Asthma", "Gout", "Migraine", "Eczema", "Anaemia"])]
    resources += [{"resourceType": "Encounter", "id": f"e{n}", "subject": ME, "status": "finished",
                   "class": {"code": "AMB"}, "period": {"start": f"20{11 + n}-05-05"}} for n in range(3)]
    expected = _ids(_bundle(PATIENT, *resources))
    shuffled = list(resources)
    for seed in range(5):
        random.Random(seed).shuffle(shuffled)
        assert _ids(_bundle(PATIENT, *shuffled)) == expected
