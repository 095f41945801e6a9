"""Fuzzing harness (issue 18): generated ebmrag JSON records, FHIR Bundles and JSONL corpus lines.

Every input must end in a valid result or a located `EbmragError`, never another exception, and a
record that loads holds exactly one patient. 2,000 inputs per format; each is a small file, so the
whole harness runs in well under a minute.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebmrag.errors import EbmragError
from ebmrag.ingest.readers import read_file
from ebmrag.records.loaders import load_records

FUZZ = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                    st.text(max_size=30), st.sampled_from(["", " ", "\ud800", "2026-03-01", "T1", "[1|T1|x] y"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def fragment() -> st.SearchStrategy[Any]:
    good = st.fixed_dictionaries({"id": st.text(min_size=1, max_size=6), "text": st.text(max_size=40)},
                                 optional={"section": scalars, "timestamp": scalars, "source": scalars,
                                           "encounter": scalars, "patient_id": scalars})
    return st.one_of(good, json_values)


records = st.one_of(
    json_values,
    st.fixed_dictionaries({"patient_id": scalars, "fragments": st.lists(fragment(), max_size=5)}),
    st.lists(st.fixed_dictionaries({"patient_id": st.sampled_from(["p1", "p2", ""]),
                                    "fragments": st.lists(fragment(), max_size=3)}), max_size=3),
)

references = st.sampled_from(["Patient/p1", "Patient/p2", "urn:uuid:1", "http://a.example/fhir/Patient/p1",
                              "http://b.example/fhir/Patient/p1", "", "Group/g1"])
resource_types = st.sampled_from(["Patient", "AllergyIntolerance", "Condition", "Observation", "DiagnosticReport",
                                  "Procedure", "ImagingStudy", "MedicationRequest", "Encounter", "Bogus"])


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(resource_types)
    resource: dict[str, Any] = {"resourceType": kind, "id": draw(st.sampled_from(["p1", "p2", "x", "o1"]))}
    reference = {"reference": draw(references)}
    resource["patient" if kind == "AllergyIntolerance" else "subject"] = reference
    if draw(st.booleans()):
        resource["status"] = draw(st.sampled_from(["final", "active", "entered-in-error", "nonsense"]))
    if draw(st.booleans()):
        resource["code"] = {"text": draw(st.text(max_size=20))}
    if draw(st.booleans()):
        resource["valueQuantity"] = {"value": draw(st.floats(allow_nan=False, width=32)), "unit": "mg/dL"}
    if draw(st.booleans()):
        resource["effectiveDateTime"] = draw(st.sampled_from(["2026-01-02", "yesterday", "2026-13-40"]))
    if draw(st.booleans()):
        resource["extra"] = draw(json_values)
    return resource


@st.composite
def bundles(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    entries = [{"resource": draw(resources()),
                **({"fullUrl": draw(references)} if draw(st.booleans()) else {})}
               for _ in range(draw(st.integers(0, 5)))]
    return {"resourceType": "Bundle", "type": draw(st.sampled_from(["collection", "transaction", "weird"])),
            "entry": entries}


def load_checked(data: Any, suffix: str = ".json") -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"record{suffix}"
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8", errors="surrogatepass")
        try:
            loaded = load_records(path)
        except EbmragError:
            return
        for record in loaded:
            assert record.fragments, "a record that loads has fragments"
            assert {f.patient_id for f in record.fragments} == {record.patient_id}, "one patient per record"


@pytest.mark.slow
@FUZZ
@given(records)
def test_ebmrag_json_records(data: Any) -> None:
    load_checked(data)


@pytest.mark.slow
@FUZZ
@given(bundles())
def test_fhir_bundles(data: Any) -> None:
    load_checked(data)


@FUZZ
@given(st.lists(st.one_of(json_values.map(lambda v: json.dumps(v, ensure_ascii=False)), st.text(max_size=40)),
                min_size=1, max_size=4))
@pytest.mark.slow
def test_jsonl_corpus_lines(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        try:
            result = read_file(path, "corpus.jsonl")
        except EbmragError:
            return
        assert all(d.text.strip() for d in result.documents), "no empty document goes in"
        assert all(isinstance(e, EbmragError) for e in result.errors)
