"""Issue 32, finding 4: bad input is a 4xx naming the problem, never a 5xx, on SQLite and PostgreSQL alike.

JSON nested 100,000 deep (a RecursionError, and a body nested less deeply still walked recursively later),
malformed FHIR resources in result messages and in Bundles, and control characters in ids (PostgreSQL refuses
NUL in text, SQLite stores it). The server is a real uvicorn over the parametrised `store` fixture; no route
used here needs the engine, so none is built.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from ebmrag.config import Settings
from ebmrag.records.limits import MAX_DEPTH, nesting_depth
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore
from tests.serve.conftest import serving
from tests.serve.test_service import problem

JSON = {"Content-Type": "application/json"}
FHIR = {"Content-Type": "application/fhir+json"}
NDJSON = {"Content-Type": "application/fhir+ndjson"}
MESSAGE = {"tenant": "t", "patient_id": "p1", "kind": "lab", "producer": "lab-7", "produced_at": "2026-03-14T08:00:00Z"}
OBSERVATION: dict[str, Any] = {
    "resourceType": "Observation", "id": "o1", "status": "final", "subject": {"reference": "Patient/p1"},
    "category": [{"coding": [{"code": "laboratory"}]}], "effectiveDateTime": "2026-03-14T08:00:00Z",
    "code": {"coding": [{"system": "http://loinc.org", "code": "2823-3", "display": "Potassium"}], "text": "Potassium"},
    "valueQuantity": {"value": 6.9, "unit": "mmol/L"}, "interpretation": [{"coding": [{"code": "HH"}]}],
    "referenceRange": [{"low": {"value": 3.5}, "high": {"value": 5.1}, "text": "3.5-5.1"}],
    "component": [{"code": {"text": "Systolic"}, "valueQuantity": {"value": 120, "unit": "mmHg"}}]}
REPORT: dict[str, Any] = {
    "resourceType": "DiagnosticReport", "id": "d1", "status": "final", "code": {"text": "Colon biopsy"},
    "category": [{"coding": [{"code": "PAT"}]}], "conclusion": "Adenocarcinoma.",
    "conclusionCode": [{"coding": [{"display": "Adenocarcinoma"}]}],
    "presentedForm": [{"contentType": "text/plain", "data": "QmlvcHN5Lg=="}]}
IMAGING: dict[str, Any] = {
    "resourceType": "ImagingStudy", "id": "i1", "status": "available", "modality": [{"code": "CT"}],
    "description": "CT abdomen", "series": [{"description": "Axial", "modality": {"code": "CT"}}]}
PROCEDURE: dict[str, Any] = {
    "resourceType": "Procedure", "id": "x1", "status": "completed", "code": {"text": "Colonoscopy"},
    "reasonCode": [{"text": "Bleeding"}], "outcome": {"text": "Polyp removed"}, "performedPeriod": {"start": "2026"}}
WRONG: tuple[Any, ...] = ("x", 5, True, [], {}, ["x"], [5])


@pytest.fixture
def http(store: PatientStore) -> Iterator[httpx.Client]:
    """A service key's client of a real server over `store` (SQLite, then PostgreSQL)."""
    key = create_key(store, "t", "service")[0]
    with serving(create_app(store, Settings())) as (url, _), \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        yield client


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def test_json_nested_too_deeply_is_a_400_on_every_route_that_reads_json(http: httpx.Client) -> None:
    """Nested 100,000 deep it was a RecursionError (500) in every handler that parses JSON itself."""
    record = '{{"patient_id": "p1", "fragments": [{{"id": "a", "text": {}}}]}}'

    def message(inner: str) -> str:
        return json.dumps({**MESSAGE, "result_id": "r1"})[:-1] + ', "resource": {"resourceType": "Observation", ' \
                                                                 f'"x": {inner}}}}}'

    for depth in (100_000, 1_000, MAX_DEPTH + 1):
        for body, headers in ((nested(depth), JSON), (record.format(nested(depth)), JSON),
                              ('{"resourceType": "Bundle", "entry": ' + nested(depth, "{}") + "}", FHIR)):
            for method, path in (("PUT", "/v1/patients/p1"), ("POST", "/v1/patients/p1/fragments")):
                said = problem(http.request(method, path, content=body, headers=headers), 400, "malformed-json")
                assert f"nested {nesting_depth(body.encode())} levels deep; at most {MAX_DEPTH}" in said["detail"]
        for body in (nested(depth), message(nested(depth)), f"[{message(nested(depth))}]"):
            problem(http.post("/v1/results", content=body, headers=JSON), 400, "malformed-json")
    problem(http.get("/v1/patients/p1/fragments"), 404, "not-found")  # nothing was stored
    deep_enough = record.format(nested(MAX_DEPTH - 3, '"text"'))  # 64 levels: read, then refused as a record
    problem(http.put("/v1/patients/p1", content=deep_enough, headers=JSON), 422, "invalid-record")


def test_a_deep_line_of_an_ndjson_chart_is_skipped_not_a_crash(http: httpx.Client) -> None:
    lines = [json.dumps({"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1950-01-01"}),
             json.dumps(OBSERVATION), '{"resourceType": "Observation", "x": ' + nested(100_000) + "}"]
    reply = http.put("/v1/patients/p1", content="\n".join(lines), headers=NDJSON)
    assert reply.status_code == 200, reply.text
    skipped = reply.json()["record_skipped"]
    assert any("nested 100001 levels deep" in line and "line skipped" in line for line in skipped), skipped


@pytest.mark.parametrize("route", ["/v1/patients/p1/ask", "/v1/patients/p1/pack", "/v1/search"])
def test_bodies_fastapi_parses_are_never_a_5xx_however_deep(http: httpx.Client, route: str) -> None:
    """Ask, pack and search bodies are pydantic models: FastAPI answers a body its parser cannot take 400, and a
    deep value in a field of the wrong type 422; nothing is walked recursively."""
    field = "question" if route.endswith("ask") else "query"
    for depth in (100_000, 5_000, 900, 100):
        for body in (nested(depth), f'{{"{field}": {nested(depth)}, "window": 512}}',
                     f'{{"{field}": "x", "bogus": {nested(depth)}}}'):
            reply = http.post(route, content=body, headers=JSON)
            assert reply.status_code in (400, 422), (depth, body[:40], reply.status_code, reply.text[:200])


def test_json_that_only_python_accepts_is_a_400(http: httpx.Client) -> None:
    """NaN and Infinity are not JSON, an integer of 5,000 digits cannot be read, an unpaired surrogate cannot be
    stored: each a 400 saying so (they were stored, a 422 from deep inside, or a codec error)."""
    for text, said in (("NaN", "NaN is not a JSON number"), ("-Infinity", "-Infinity is not a JSON number"),
                       ("9" * 5000, "too many digits"), ('"\\udc00 orphan"', "unpaired UTF-16 surrogate (\\udc00)")):
        body = '{"patient_id": "p1", "fragments": [{"id": "a", "text": "K", "section": ' + text + "}]}"
        assert said in problem(http.put("/v1/patients/p1", content=body, headers=JSON), 400, "malformed-json")["detail"]
        message = json.dumps({**MESSAGE, "result_id": "r1", "text": "x"})[:-1] + f', "title": {text}}}'
        problem(http.post("/v1/results", content=message, headers=JSON), 400, "malformed-json")
    pair = '{"patient_id": "p1", "fragments": [{"id": "a", "text": "Smiles \\ud83d\\ude00 and a \\\\udc00 escape."}]}'
    assert http.put("/v1/patients/p1", content=pair, headers=JSON).status_code == 200
    assert http.get("/v1/patients/p1/fragments").json()["fragments"][0]["text"] == "Smiles 😀 and a \\udc00 escape."


def paths(node: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield (*where, key)
        yield from paths(child, (*where, key))


def broken(resource: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The resource with each element (every path) replaced by each JSON type it is not."""
    for at in paths(resource):
        if at == ("resourceType",):
            continue
        for value in WRONG:
            changed = copy.deepcopy(resource)
            parent = changed
            for step in at[:-1]:
                parent = parent[step]
            if type(parent[at[-1]]) is type(value):
                continue
            parent[at[-1]] = value
            yield ".".join(map(str, (resource["resourceType"], *at))) + f"={value!r}", changed


def test_malformed_fhir_results_are_rejected_one_by_one_never_a_500(http: httpx.Client) -> None:
    """Every element of an Observation, a DiagnosticReport, an ImagingStudy and a Procedure given a wrong JSON type:
    each message is stored (what the element's shape allows) or rejected with the element's path; the valid
    messages around them are stored."""
    cases = [case for resource in (OBSERVATION, REPORT, IMAGING, PROCEDURE) for case in broken(resource)]
    messages = [{**MESSAGE, "result_id": f"r{n}", "resource": resource} for n, (_, resource) in enumerate(cases)]
    messages.append({**MESSAGE, "result_id": "valid", "resource": OBSERVATION})
    reply = http.post("/v1/results", json=messages)
    assert reply.status_code == 200, reply.text
    said = reply.json()
    assert said["stored"] + len(said["rejected"]) == len(messages) and said["stored"] >= 1
    reasons = {r["index"]: r["reason"] for r in said["rejected"]}
    assert len(messages) - 1 not in reasons, "the valid message is stored"
    named = {name: reasons.get(n, "") for n, (name, _) in enumerate(cases)}
    for name, expected in (
            ("Observation.valueQuantity='x'", "Observation.valueQuantity must be a Quantity (an object), got a string"),
            ("Observation.component='x'", "Observation.component must be a list of objects, got a string"),
            ("Observation.code=[]", "Observation.code must be a CodeableConcept (an object), got a list"),
            ("Observation.code.coding.0.code=5", "Observation.code.coding[0].code must be a string, got a number"),
            ("Observation.referenceRange.0.low.value=True", "referenceRange[0].low.value must be a number, got true"),
            ("DiagnosticReport.conclusion=5", "DiagnosticReport.conclusion must be a string, got a number"),
            ("DiagnosticReport.presentedForm.0.data=[]", "DiagnosticReport.presentedForm[0].data must be a string"),
            ("ImagingStudy.series=5", "ImagingStudy.series must be a list of objects, got a number"),
            ("ImagingStudy.series.0.description={}", "ImagingStudy.series[0].description must be a string"),
            ("Procedure.performedPeriod='x'", "Procedure.performedPeriod must be a Period (an object)")):
        assert expected in named[name], (name, named[name])
    ids = [f["id"] for f in http.get("/v1/patients/p1/fragments").json()["fragments"]]
    assert "result:lab-7:valid" in ids and len(ids) == said["stored"]


def chart(*resources: dict[str, Any]) -> dict[str, Any]:
    patient = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1950-01-01"}
    allergy = {"resourceType": "AllergyIntolerance", "id": "a1", "patient": {"reference": "Patient/p1"},
               "code": {"text": "Penicillin"}, "criticality": "high"}
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"resource": r} for r in (patient, allergy, *resources)]}


def test_a_malformed_resource_in_a_chart_costs_that_resource_not_the_chart(http: httpx.Client) -> None:
    """The same wrong shapes inside a Bundle are read leniently and reported in record_skipped; a chain of 3,000
    nested panels (a RecursionError, 500) costs only what lies deeper than a reader opens."""
    alone = {key: value for key, value in OBSERVATION.items() if key != "component"}
    bad = [{**alone, "id": "o2", "valueQuantity": "x"}, {**OBSERVATION, "id": "o3", "component": "x"},
           {**IMAGING, "id": "i2", "series": 5}, {**OBSERVATION, "id": "o4", "code": []},
           {**REPORT, "id": "d2", "conclusion": 5}]
    reply = http.put("/v1/patients/p1", json=chart(*bad), headers=FHIR)
    assert reply.status_code == 200, reply.text
    skipped = reply.json()["record_skipped"]
    for line in ("Observation/o2: valueQuantity must be a Quantity (an object), got a string; passed over",
                 "Observation/o3: component must be a list of objects, got a string; passed over",
                 "ImagingStudy/i2: series must be a list of objects, got a number; passed over",
                 "Observation/o4: code must be a CodeableConcept (an object), got a list; passed over",
                 "DiagnosticReport/d2: conclusion must be a string, got a number; passed over"):
        assert line in skipped, skipped
    texts = {f["id"]: f["text"] for f in http.get("/v1/patients/p1/fragments").json()["fragments"]}
    assert texts["Observation/o2"] == "Potassium: a value in a form that could not be read (flag critically high).", \
        "not 'no value recorded': a value was sent, and its flag is kept"
    assert "Penicillin" in texts["AllergyIntolerance/a1"]
    panels = [{"resourceType": "Observation", "id": f"c{n}", "status": "final", "code": {"text": f"Panel {n}"},
               "subject": {"reference": "Patient/p1"}, "hasMember": [{"reference": f"Observation/c{n + 1}"}]}
              for n in range(3000)]
    reply = http.put("/v1/patients/p1", json=chart(*panels), headers=FHIR)
    assert reply.status_code == 200, reply.text
    assert any(f["text"].startswith("Panel 0") for f in http.get("/v1/patients/p1/fragments").json()["fragments"])


def test_control_characters_in_ids_are_a_422_naming_the_field_on_both_backends(http: httpx.Client) -> None:
    """NUL in a fragment id, result_id, producer or encounter was a 500 on PostgreSQL and stored on SQLite."""
    record = {"patient_id": "p1", "fragments": [{"id": "a", "text": "Potassium 6.9 mmol/L."}]}
    for field, value in (("id", "a\u0000b"), ("id", "a\u001bb"), ("encounter", "Encounter/\u0000"),
                         ("source", "lab\u0007")):
        changed = copy.deepcopy(record)
        changed["fragments"][0][field] = value  # type: ignore[index]
        for method, path in (("PUT", "/v1/patients/p1"), ("POST", "/v1/patients/p1/fragments")):
            detail = problem(http.request(method, path, json=changed), 422, "invalid-record")["detail"]
            assert f"fragments[0].{field}: contains a control character (U+00" in detail, detail
    detail = problem(http.put("/v1/patients/p1", json={**record, "patient_id": "p\u00001"}), 422,
                     "invalid-record")["detail"]
    assert "patient_id: contains a control character (U+0000)" in detail
    for field, value in (("result_id", "r\u00001"), ("producer", "lab\u0000"), ("encounter", "E\u001f")):
        said = http.post("/v1/results", json=[{**MESSAGE, "result_id": "r1", "text": "K 6.9", field: value},
                                              {**MESSAGE, "result_id": "r2", "text": "K 7.0"}]).json()
        assert said["stored"] == 1 and said["rejected"][0]["index"] == 0, said
        assert said["rejected"][0]["reason"].startswith(f"invalid result message: {field}: Value error, contains a "
                                                        "control character")


def test_nul_inside_text_and_resource_ids_is_stored_alike_on_both_backends(http: httpx.Client) -> None:
    """Text may hold any character (it is stored as escaped JSON); a FHIR resource id with NUL becomes a printable
    fragment id instead of a PostgreSQL error."""
    text = "Potassium\u0000 6.9 mmol/L\u0007 (critical)."
    record = {"patient_id": "p1", "fragments": [{"id": "a", "text": text, "section": "Lab\u0000s"}]}
    assert http.put("/v1/patients/p1", json=record).status_code == 200
    (fragment,) = http.get("/v1/patients/p1/fragments").json()["fragments"]
    assert fragment["text"] == text and fragment["section"] == "Lab\u0000s"
    said = http.post("/v1/results", json={**MESSAGE, "result_id": "r1", "title": "K\u0000", "text": text}).json()
    assert said["stored"] == 1, said
    observation = {**OBSERVATION, "id": "o\u00001", "encounter": {"reference": "Encounter/e\u00001"}}
    reply = http.put("/v1/patients/p2", json=chart(observation), headers=FHIR)
    assert reply.status_code == 200, reply.text
    ids = {f["id"]: f for f in http.get("/v1/patients/p2/fragments").json()["fragments"]}
    assert "Observation/o\\u00001" in ids and ids["Observation/o\\u00001"]["encounter"] == "Encounter/e\\u00001"


def test_a_control_character_in_a_header_never_reaches_the_store(http: httpx.Client) -> None:
    """An Idempotency-Key (or any header) with NUL is refused by the HTTP parser: 400, before any handler."""
    url = urlparse(str(http.base_url))
    body = json.dumps({"patient_id": "p1", "fragments": [{"id": "a", "text": "K 6.9"}]}).encode()
    request = (f"POST /v1/patients/p1/fragments HTTP/1.1\r\nHost: {url.hostname}\r\n"
               f"Authorization: {http.headers['Authorization']}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nIdempotency-Key: a\x00b\r\nConnection: close\r\n\r\n").encode() + body
    with socket.create_connection((url.hostname, url.port), timeout=10) as raw:
        raw.sendall(request)
        status = raw.recv(64).split(b" ")[1]
    assert status == b"400"
    problem(http.get("/v1/patients/p1/fragments"), 404, "not-found")


def test_xml_nested_too_deeply_is_refused_before_it_is_walked(http: httpx.Client) -> None:
    """Both XML readers walk the tree recursively: 1,200 nested elements were a RecursionError (500)."""
    fhir = ('<Bundle xmlns="http://hl7.org/fhir"><entry><resource><Patient><id value="p1"/></Patient></resource>'
            '</entry><entry><resource><Observation><id value="o1"/><code><text value="Potassium"/></code>'
            '<valueString value="6.9"/><extension>{}</extension></Observation></resource></entry></Bundle>')
    ccda = ('<ClinicalDocument xmlns="urn:hl7-org:v3"><recordTarget><patientRole><id extension="1" root="2.16"/>'
            '</patientRole></recordTarget><component><structuredBody><component><section><title>Notes</title>'
            '<text>{}</text></section></component></structuredBody></component></ClinicalDocument>')
    for template, content_type in ((fhir, "application/fhir+xml"), (ccda, "application/xml")):
        for depth in (100_000, 1_200, 200):
            body = template.format("<paragraph>" * depth + "x" + "</paragraph>" * depth)
            detail = problem(http.put("/v1/patients/p1", content=body, headers={"Content-Type": content_type}), 422,
                             "invalid-record")["detail"]
            assert "XML nested more than 128 elements deep" in detail
        shallow = template.format("<paragraph>" * 20 + "Potassium 6.9 mmol/L." + "</paragraph>" * 20)
        reply = http.put("/v1/patients/p1", content=shallow, headers={"Content-Type": content_type})
        assert reply.status_code == 200, reply.text
