"""The face sheet: the few lines every answer about this patient may need, built from the whole chart.

- who: age and sex (the Patient, its sex extension when `gender` is absent);
- the allergy status: the recorded allergies, else a "no known allergy" statement, else what the newest
  note says, else that nothing is recorded (not the same as "no known allergies");
- the active problem list and the current medications (after reconciliation), one line each;
- the drug-decision facts: pregnancy status with the due date, lactation, renal function (creatinine,
  eGFR, potassium), hepatic function, weight, found by LOINC code (vocab/drug_facts.toml), each the
  newest value with its unit and date;
- the latest value of other key results.
The tier rules make these must-keep when a question needs them (evidence/rules/questions.toml).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.records.dates import as_written, partial_timestamp
from ebmrag.records.fhir.coding import codings, has_code, obj, objects, strings, text_of
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.results import value_of
from ebmrag.records.fragment import Fragment

_VOCAB = Path(__file__).resolve().parent.parent / "vocab"
_SEXES = {"f": "female", "female": "female", "248152002": "female", "m": "male", "male": "male", "248153007": "male"}

@cache
def _vocab() -> dict[str, Any]:
    with open(_VOCAB / "drug_facts.toml", "rb") as handle:
        raw = tomllib.load(handle)
    for fact in [*raw["fact"], *raw["other"]]:
        fact["pattern"] = re.compile(fact["display"], re.IGNORECASE)
        fact["codes"] = frozenset(fact["loinc"])
        fact["preferred"] = re.compile(fact["prefer"], re.IGNORECASE) if fact.get("prefer") else None
    return raw


def identifiers(patient: Resource | None) -> tuple[tuple[str, str], ...]:
    """What identifies the person (name, MRN and other identifiers, birth date, address, telecom): never
    packed as such, kept so everything sent to an outside model can be redacted (generate.redact)."""
    if patient is None:
        return ()
    found: list[tuple[str, str]] = []
    for name in objects(patient.get("name")):
        given = strings(name.get("given"))
        parts = [*strings(name.get("prefix")), *given, str(name.get("family") or "")]
        found += [("name", p) for p in (str(name.get("text") or ""), " ".join(x for x in parts if x).strip(),
                                        *given, str(name.get("family") or "")) if p]
    found += [("id", str(i["value"])) for i in objects(patient.get("identifier")) if i.get("value")]
    found += [("birth_date", str(patient["birthDate"]))] if isinstance(patient.get("birthDate"), str) else []
    for address in objects(patient.get("address")):
        found += [("address", str(v)) for v in (*strings(address.get("line")), address.get("city"),
                                                address.get("postalCode")) if isinstance(v, str) and v]
    found += [("contact", str(t["value"])) for t in objects(patient.get("telecom")) if t.get("value")]
    return tuple(dict.fromkeys(found))


def _sex(patient: Resource) -> str:
    gender = patient.get("gender")
    if isinstance(gender, str) and gender in ("male", "female", "other"):
        return gender
    for extension in objects(patient.get("extension")):
        url = str(extension.get("url") or "")
        if "sex" not in url.lower():  # birthsex, individual-sex, sexParameterForClinicalUse
            continue
        coding = obj(extension.get("valueCoding"))
        said = [str(extension.get("valueCode") or ""), str(coding.get("code") or ""), str(coding.get("display") or ""),
                text_of(extension.get("valueCodeableConcept"))]
        sex = next((_SEXES[key] for s in said if (key := s.lower().split(" (")[0].strip()) in _SEXES), "")
        if sex:
            return f"{sex} (birth sex)" if "birthsex" in url else sex
    return "sex not recorded" if not gender else f"gender {gender}"


def demographics(patient: Resource | None, subject: str, newest: datetime | None, pregnancy: str = ""
                 ) -> Fragment | None:
    """Age and sex as one must-keep line ("Patient summary" in the tier rules), dated with the newest
    fragment so its age is the age at the time of the question; a recorded pregnancy status joins it, as
    every question about a pregnant patient must know it."""
    if patient is None:
        return None
    born = as_written(patient.get("birthDate"))
    deceased = as_written(patient.get("deceasedDateTime"))
    age = ""
    birth = partial_timestamp(born)
    if birth is not None and len(born) >= 4 and (newest or deceased):
        until = (partial_timestamp(deceased) or newest or birth).date()
        first = birth.date()
        years = until.year - first.year - ((until.month, until.day) < (first.month, first.day) if len(born) >= 10
                                           else 0)
        age = f"{years}-year-old"
    sex = _sex(patient)
    if not age and sex == "sex not recorded":
        return None
    words = " ".join(w for w in (age, sex) if w)
    extra = f" (born {born}" + (f", died {deceased}" if deceased else "") + ")" if born else ""
    extra += f"; {pregnancy}" if pregnancy else ""
    return Fragment(f"Patient/{patient.get('id') or 'patient'}", subject, f"Patient: {words}{extra}.",
                    "Patient summary", newest, source="fhir")


def allergy_status(subject: str, fragments: Sequence[Fragment], newest: datetime | None) -> Fragment:
    """The allergy banner: the recorded allergies (each as its own fragment says it, so packing keeps one
    copy), else the chart's statement of none, else what the newest note says, else that nothing is
    recorded (which is not "no known allergies")."""
    recorded = list(dict.fromkeys(f.text.rstrip(".") for f in fragments if (f.section or "").startswith("Allergy")
                                  and f.section != "Allergy status"))
    stated = [f for f in fragments if f.section == "Allergy status"]
    noted = [f for f in fragments if f.timestamp and (f.section or "").lower() == "clinical note > allergies"]
    if recorded:
        text = f"Allergies ({len(recorded)}): " + "; ".join(recorded) + "."
        if stated:
            text += f" (The chart also states: {stated[0].text.rstrip('.')}.)"
    elif stated:
        text = "Allergy status: " + "; ".join(dict.fromkeys(f.text.removeprefix("Allergy status: ").rstrip(".")
                                                            for f in stated)) + " (stated in the chart)."
    elif noted:
        latest = max(noted, key=lambda f: f.timestamp or datetime.min)
        stamp = latest.timestamp.date().isoformat() if latest.timestamp else "undated"
        text = f"Allergy status (clinical note of {stamp}): {latest.text}"
    else:
        text = "Allergy status: no allergy or allergy statement is recorded in this chart."
    return Fragment("summary/allergies", subject, text, "Patient summary", newest, source="fhir")


def problem_summary(subject: str, fragments: Sequence[Fragment], newest: datetime | None) -> Fragment | None:
    active = [re.sub(r"^Active problem: | \((?:since|unconfirmed|clinical status)[^)]*\)\.?$|\.$", "", f.text)
              for f in fragments if f.section == "Problem list > active"]
    stated = [f.text.rstrip(".") for f in fragments if f.section == "Problem list > status"]
    if active:
        names = list(dict.fromkeys(active))
        text = f"Active problems ({len(names)}): {'; '.join(names)}."
    elif stated and not active:
        text = f"{stated[0]} (stated in the chart)."
    else:
        return None
    return Fragment("summary/active-problems", subject, text, "Problem list > active summary", newest, source="fhir")


def medication_summary(subject: str, current: Sequence[str], unknown: Sequence[str], stated: str,
                       newest: datetime | None, ended: int = 0) -> Fragment | None:
    """The current medications after reconciliation; "none" said outright when the chart states it or when
    every medication record has ended (a drug question must know the list is empty, not missing)."""
    parts = []
    if current:
        stale = sum(name.endswith("*") for name in current)
        if stale == len(current):  # say it once, not once per drug
            legend, current = ", none recently confirmed", [name.rstrip("*") for name in current]
        else:
            legend = "; * = not recently confirmed" if stale else ""
        parts.append(f"Active medications ({len(current)}{legend}): {'; '.join(current)}.")
    elif stated:  # "No known medications" and "No information about medications" are not the same
        parts.append(f"Active medications: none listed; the chart states: {stated.rstrip('.')}.")
    elif ended and not unknown:
        parts.append(f"Active medications: none marked active ({ended} earlier medication records).")
    if unknown:
        parts.append(f"Medications whose status is not recorded ({len(unknown)}): {'; '.join(unknown)}.")
    if not parts:
        return None
    return Fragment("summary/active-medications", subject, " ".join(parts), "Active medications", newest,
                    source="fhir")


def observations(index: ChartIndex) -> list[Resource]:
    """The chart's Observations that count as results (not cancelled or entered in error), gathered once for
    every face-sheet line."""
    return [r for r in index.unique() if r.get("resourceType") == "Observation"
            and r.get("status") not in ("entered-in-error", "cancelled")]


def _raw_time(r: Resource) -> Any:
    return r.get("effectiveDateTime") or obj(r.get("effectivePeriod")).get("start") or r.get("issued")


def _stamp(r: Resource) -> datetime | None:
    return partial_timestamp(_raw_time(r))


def _day(r: Resource) -> str:
    """The result's date as the chart wrote it, at its precision ("2020-03", never an invented day)."""
    return as_written(_raw_time(r))


def _newest(found: list[tuple[datetime, str, str]]) -> tuple[datetime, str, str] | None:
    return max(found, key=lambda item: item[0]) if found else None


def _lab_facts(observations: Sequence[Resource], table: str = "fact") -> dict[str, tuple[datetime, str, str]]:
    """Newest (time, "creatinine 88 umol/L", date as written) of each result of a vocabulary table: by LOINC
    code, else by display name when the result has no LOINC coding at all (a local lab code)."""
    newest: dict[str, tuple[datetime, str, str]] = {}
    ranks: dict[str, tuple[datetime, bool]] = {}
    for r in observations:
        when, value = _stamp(r), value_of(r)
        if when is None or not re.search(r"\d", value):  # "Test Not Performed U/L" is no result
            continue
        loinc = {code for system, code, _ in codings(r.get("code")) if "loinc" in system}
        name = text_of(r.get("code"))
        for fact in _vocab()[table]:
            if loinc & fact["codes"] or (not loinc and fact["pattern"].search(name)):
                preferred = fact["preferred"]
                rank = (when, bool(preferred and preferred.search(" ".join([name, *sorted(loinc)]))))
                if fact["name"] not in ranks or rank > ranks[fact["name"]]:  # a tie keeps the first
                    ranks[fact["name"]] = rank
                    newest[fact["name"]] = (when, f"{fact['name']} {value}", _day(r))
                break
    return newest


def _pregnancy(observations: Sequence[Resource], conditions: Sequence[Resource]) -> list[str]:
    """Pregnancy status (with the estimated due date) and lactation, newest first; an active pregnancy
    Condition counts when no status was observed."""
    vocab = _vocab()["pregnancy"]
    said: list[str] = []
    status = _newest([(w, _answer(r, vocab), _day(r)) for r in observations if (w := _stamp(r)) is not None
                      and (has_code(r.get("code"), "loinc", frozenset(vocab["status_loinc"]))
                           or has_code(r.get("code"), "snomed", frozenset(vocab["status_snomed"])))])
    if status is None:
        active = [r for r in conditions if has_code(r.get("code"), "snomed", frozenset(vocab["pregnant_conditions"]))
                  and next((code for _, code, _ in codings(r.get("clinicalStatus"))), "active") == "active"]
        if active:
            said.append(f"pregnant ({text_of(active[0].get('code'))}, recorded "
                        f"{as_written(active[0].get('onsetDateTime') or active[0].get('recordedDate')) or 'undated'})")
    else:
        said.append(f"pregnancy status {status[1]} ({status[2]})")
    for key, label in (("due_date_loinc", "estimated due date"), ("gestational_age_loinc", "gestational age"),
                       ("lactation_loinc", "lactation")):
        found = _newest([(w, value_of(r), _day(r)) for r in observations if (w := _stamp(r)) is not None
                         and value_of(r)
                         and has_code(r.get("code"), "loinc", frozenset(vocab[key]))])
        if found and (key == "lactation_loinc" or said):
            said.append(f"{label} {found[1]}")
    return said


def _answer(r: Resource, vocab: dict[str, Any]) -> str:
    value = r.get("valueCodeableConcept")
    if has_code(value, "", frozenset(vocab["pregnant_answers"])):
        return "pregnant"
    if has_code(value, "", frozenset(vocab["not_pregnant_answers"])):
        return "not pregnant"
    return value_of(r) or "not stated"


def _dated(found: Sequence[tuple[datetime, str, str]]) -> str:
    """Values of one day share their date ("(2024-03-11) creatinine 88 umol/L, eGFR 78"): dates cost tokens."""
    days = {day for _, _, day in found}
    if len(days) == 1:
        return f" ({days.pop()}): " + ", ".join(value for _, value, _ in found)
    return ": " + ", ".join(f"{value} ({day})" for _, value, day in found)


def pregnancy_status(results: Sequence[Resource], conditions: Sequence[Resource]) -> str:
    """"pregnancy status pregnant (2022-08-24), estimated due date 2020-02-18" for the face sheet's first
    line (every question about a pregnant or lactating patient must know it), or "" when none is recorded."""
    return ", ".join(_pregnancy(results, conditions))


def drug_facts(subject: str, results: Sequence[Resource]) -> Fragment | None:
    """One line with the results a drug choice or dose turns on (renal and hepatic function, weight), each
    dated; pregnancy and lactation are on the patient's line of the face sheet."""
    labs = _lab_facts(results)
    groups: list[str] = []
    for group, title in (("renal", "Renal"), ("hepatic", "Hepatic"), ("body", "Body")):
        found = [labs[f["name"]] for f in _vocab()["fact"] if f["group"] == group and f["name"] in labs]
        if found:
            groups.append(title + _dated(found))
    if not groups:
        return None
    stamps = [when for when, _, _ in labs.values()]
    return Fragment("summary/drug-facts", subject, "Drug decision facts: " + "; ".join(groups) + ".",
                    "Drug decision facts", max(stamps) if stamps else None, source="fhir")


def latest_results(subject: str, results: Sequence[Resource]) -> Fragment | None:
    """The newest value of other key results (sodium, hemoglobin, platelets, HbA1c, glucose), one dated line."""
    newest = _lab_facts(results, "other")
    if not newest:
        return None
    by_day: dict[tuple[date, str], list[str]] = {}
    for fact in _vocab()["other"]:
        if fact["name"] in newest:
            when, value, day = newest[fact["name"]]
            by_day.setdefault((when.date(), day), []).append(value)
    groups = [f"{'; '.join(values)} ({day})" for (_, day), values in sorted(by_day.items(), reverse=True)]
    return Fragment("summary/latest-results", subject, "Latest results: " + "; ".join(groups) + ".",
                    "Latest results", max(when for when, _, _ in newest.values()), source="fhir")
