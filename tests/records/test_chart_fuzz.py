"""Issue 29: a real chart with one element broken is still read, or refused with a `RecordError` that says why;
never a traceback, and never the whole chart lost for one clinical resource's defect.

Exports from real systems break one field at a time (a missing status, a date in the wrong format, an object
where a list belongs). Each case below takes one of three small real charts, breaks exactly one element (delete
it, give it a wrong type, null it, or garble a date) and reads the result with `load_record`. A refusal is right
only when the Patient or the Bundle's own shape (resourceType, type, the entry list) is broken; an allergy
whose code and reaction are untouched must still be in some fragment. No model is loaded: reading is fast, and
the mutations are computed once per chart (deterministic, at most CAP of them, picked evenly over the chart).
"""

from __future__ import annotations

import copy
import json
import random
import re
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ebmrag.errors import RecordError
from ebmrag.records.fragment import PatientRecord
from ebmrag.records.loaders import load_record

CHART_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fhir_charts"
# chart -> the allergen words its AllergyIntolerance resources carry in `code` or `reaction.substance`
CHARTS = {
    "au_missing_composition_elements_document.json": ("lactose", "gluten", "chlorhexidine"),
    "fhirconv_onc_ambulatory_ccd_batch.json": ("penicillin g benzathine", "codeine"),
    "ips_cy_pregnancy_document.json": ("fish", "figs"),
}
CAP = 300  # mutations per chart
MAX_DEPTH = 7  # path length: entry / 3 / resource / reaction / 0 / substance / text
DATE = re.compile(r"\d{4}(-\d{2}(-\d{2}(T[\d:.]+(Z|[+-]\d{2}:\d{2})?)?)?)?")
GARBAGE_DATE = "2023-13-45T25:61:00+99:00"

Key = str | int
_DELETE = object()


@dataclass(frozen=True)
class Outcome:
    """One mutated chart as `load_record` saw it: a record, a RecordError, or anything else (a crash)."""

    path: tuple[Key, ...]
    change: str
    record: PatientRecord | None = None
    error: RecordError | None = None
    crash: str = ""

    def __str__(self) -> str:
        said = self.crash or (str(self.error) if self.error else "read")
        return f"{'/'.join(map(str, self.path))} {self.change}: {said.split(': ', 1)[-1][:160]}"


def elements(node: Any, path: tuple[Key, ...] = ()) -> Iterator[tuple[tuple[Key, ...], Any]]:
    """Every key of every object and every item of every list, in document order, down to MAX_DEPTH."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        yield (*path, key), value
        if len(path) + 1 < MAX_DEPTH:
            yield from elements(value, (*path, key))


def mutations(bundle: dict[str, Any]) -> list[tuple[tuple[Key, ...], str, Any]]:
    found: list[tuple[tuple[Key, ...], str, Any]] = []
    for path, value in elements(bundle):
        found.append((path, "deleted", _DELETE))
        if isinstance(value, dict | list):
            found.append((path, 'replaced by "x"', "x"))
        if isinstance(value, str):
            found += [(path, "replaced by a list", [value]), (path, "replaced by 5", 5)]
            if DATE.fullmatch(value):
                found.append((path, "replaced by a garbage date", GARBAGE_DATE))
        found.append((path, "replaced by null", None))
    if len(found) <= CAP:
        return found
    return [found[round(i * (len(found) - 1) / (CAP - 1))] for i in range(CAP)]


def mutated(bundle: dict[str, Any], path: tuple[Key, ...], value: Any) -> dict[str, Any]:
    copied = copy.deepcopy(bundle)
    parent: Any = copied
    for key in path[:-1]:
        parent = parent[key]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return copied


def read(path: Path, where: tuple[Key, ...], change: str) -> Outcome:
    try:
        return Outcome(where, change, record=load_record(path))
    except RecordError as error:
        return Outcome(where, change, error=error)
    except Exception as error:  # the point of the test: anything else is a crash to report
        frame = traceback.extract_tb(error.__traceback__)[-1]
        return Outcome(where, change, crash=f"{type(error).__name__} at {Path(frame.filename).name}:{frame.lineno}: "
                                            f"{error}")


@cache
def original(name: str) -> dict[str, Any]:
    assert (CHART_DIR / name).is_file(), f"{CHART_DIR / name} is missing: the tests need ../shared/data"
    data: dict[str, Any] = json.loads((CHART_DIR / name).read_text(encoding="utf-8"))
    return data


@cache
def outcomes(name: str) -> tuple[Outcome, ...]:
    bundle = original(name)
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / name
        results = []
        for path, change, value in mutations(bundle):
            target.write_text(json.dumps(mutated(bundle, path, value)), encoding="utf-8")
            results.append(read(target, path, change))
    return tuple(results)


def entries_of(name: str, kind: str) -> list[int]:
    return [i for i, e in enumerate(original(name)["entry"]) if e.get("resource", {}).get("resourceType") == kind]


def may_refuse(name: str, path: tuple[Key, ...]) -> bool:
    """The Bundle's own shape (resourceType, type, the entry list) or the Patient. Conservative reading: a broken
    single entry (replaced by "x", or its fullUrl garbled) is a defect of one resource, not of the Bundle, and so
    is a broken Composition (the document's index, not the patient's identity)."""
    if path[0] != "entry":
        return path[0] in ("resourceType", "type")
    return len(path) == 1 or path[1] in entries_of(name, "Patient")


def report(bad: list[Outcome], total: int) -> str:
    kinds = Counter(o.crash.split(":")[0] if o.crash else o.change for o in bad)
    return f"{len(bad)} of {total} mutations ({dict(kinds)}), e.g.:\n" + "\n".join(str(o) for o in bad[:12])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHARTS))
def test_a_broken_element_is_read_or_refused_never_a_crash(name: str) -> None:
    results = outcomes(name)
    crashes = [o for o in results if o.crash or (o.error and not o.error.problem.strip())]
    assert not crashes, report(crashes, len(results))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHARTS))
def test_only_the_patient_or_the_bundle_shape_may_refuse_a_chart(name: str) -> None:
    results = outcomes(name)
    refused = [o for o in results if o.error and not may_refuse(name, o.path)]
    assert not refused, report(refused, len(results))


def allergen_touched(path: tuple[Key, ...], entry: int) -> bool:
    """The mutation removed or broke this allergy's code or reaction (or the allergy, or the entry list, whole)."""
    inside = ("entry", entry, "resource")
    return path in (("entry",), inside[:2], inside, (*inside, "resourceType")) or path[:4] in (
        (*inside, "code"), (*inside, "reaction"))


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_an_untouched_allergy_survives_any_other_defect(name: str) -> None:
    bundle, results = original(name), outcomes(name)
    allergies = {i: next(w for w in CHARTS[name] if w in json.dumps(
        [bundle["entry"][i]["resource"].get(k) for k in ("code", "reaction")]).lower())
                 for i in entries_of(name, "AllergyIntolerance")}
    lost = []
    for outcome in results:
        if outcome.crash or may_refuse(name, outcome.path):
            continue  # crashes are the first test's; a refused Patient or Bundle shape carries no allergy
        texts = " ".join(f.text for f in outcome.record.fragments).lower() if outcome.record else ""
        lost += [f"{outcome} (lost {word})" for entry, word in allergies.items()
                 if not allergen_touched(outcome.path, entry) and word not in texts]
    assert not lost, f"{len(lost)} allergies lost of {len(results)} mutations, e.g.:\n" + "\n".join(lost[:12])


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_a_truncated_file_is_refused_as_invalid(name: str, tmp_path: Path) -> None:
    raw = (CHART_DIR / name).read_bytes()
    end = raw.rstrip().rfind(b"}")  # cut before the closing brace: never a complete document
    for offset in sorted(random.Random(29).sample(range(1, end), 10)):
        (tmp_path / name).write_bytes(raw[:offset])
        with pytest.raises(RecordError, match=r"invalid JSON|not UTF-8"):
            load_record(tmp_path / name)
