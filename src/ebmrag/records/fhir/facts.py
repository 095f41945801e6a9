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

"Newest" is the newest trustworthy date: a result or status dated after the present (records.dates.Today) never
outranks today's; it is shown after it, flagged ("date in the future: 2062-03-01"). The age is the age today (or at
death); a birth date in the future gives no age and a defect line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.records.dates import Today, as_written, future_birth, partial_timestamp, shown_date, trust_rank
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


def birth_defect(patient: Resource | None, today: Today) -> str:
    """The chart defect of a birth date after the present ("" when there is none): no age is computed from it."""
    born = as_written(patient.get("birthDate")) if patient is not None else ""
    if not born or not today.is_future(partial_timestamp(born)):
        return ""
    return f"birth date {born} lies after the time of reading ({today.day}): no age computed"


def demographics(patient: Resource | None, subject: str, newest: datetime | None, pregnancy: str = "",
                 today: Today | None = None) -> Fragment | None:
    """Age and sex as one must-keep line ("Patient summary" in the tier rules), dated with the newest
    trustworthy fragment; the age is the age `today` (the present the chart is read at), or at death: never at
    the chart's newest date, which may be a mistyped year. A recorded pregnancy status joins it, as every
    question about a pregnant patient must know it."""
    if patient is None:
        return None
    today = today or Today.wall_clock()
    born = as_written(patient.get("birthDate"))
    deceased = as_written(patient.get("deceasedDateTime"))
    birth, death = partial_timestamp(born), partial_timestamp(deceased)
    unborn = today.is_future(birth)
    age = ""
    if birth is not None and not unborn:
        until = (death if death is not None and not today.is_future(death) else today.now).date()
        first = birth.date()
        years = until.year - first.year - ((until.month, until.day) < (first.month, first.day) if len(born) >= 10
                                           else 0)
        age = f"{years}-year-old" if years >= 0 else ""
    sex = _sex(patient)
    if not age and sex == "sex not recorded" and not unborn:
        return None
    words = " ".join(w for w in (age, sex) if w)
    died = ""
    if deceased:
        died = f", died ({shown_date(deceased, True)})" if today.is_future(death) else f", died {deceased}"
    extra = f" ({future_birth(born) if unborn else f'born {born}'}{died})" if born else ""
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
    elif noted:  # dated ones only; a note dated in the future is never the newest
        latest = max(noted, key=lambda f: trust_rank(f.timestamp or datetime.min, f.date_in_future))
        stamp = latest.timestamp.date().isoformat() if latest.timestamp else "undated"
        of = f", {shown_date(stamp, True)}" if latest.date_in_future else f" of {stamp}"
        text = f"Allergy status (clinical note{of}): {latest.text}"
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


Dated = tuple[datetime, str, str]  # (time, "creatinine 88 umol/L", its date as shown: as written, or flagged)


def _newest(found: list[Dated], today: Today) -> Dated | None:
    """The newest by a trustworthy date; one dated in the future only when no other is."""
    return max(found, key=lambda item: today.rank(item[0])) if found else None


def _and_ahead(found: list[Dated], today: Today) -> list[Dated]:
    """The newest, and after it the newest of those dated in the future when that is not the same: a mistyped
    date is shown, flagged, and never replaces today's value."""
    newest = _newest(found, today)
    ahead = _newest([item for item in found if today.is_future(item[0])], today)
    if newest is None:
        return []
    return [newest] if ahead is None or ahead is newest else [newest, ahead]


def _shown(r: Resource, when: datetime, today: Today) -> str:
    return shown_date(_day(r), today.is_future(when))


def _lab_facts(observations: Sequence[Resource], today: Today, table: str = "fact") -> dict[str, list[Dated]]:
    """Per result of a vocabulary table, the newest value (time, "creatinine 88 umol/L", date as shown) by a
    trustworthy date, then the newest dated in the future, flagged, if any is newer: by LOINC code, else by
    display name when the result has no LOINC coding at all (a local lab code)."""
    newest: dict[str, tuple[tuple[bool, datetime, bool], Dated]] = {}
    ahead: dict[str, tuple[tuple[bool, datetime, bool], Dated]] = {}
    for r in observations:
        when, value = _stamp(r), value_of(r)
        if when is None or not re.search(r"\d", value):  # "Test Not Performed U/L" is no result
            continue
        loinc = {code for system, code, _ in codings(r.get("code")) if "loinc" in system}
        name = text_of(r.get("code"))
        for fact in _vocab()[table]:
            if loinc & fact["codes"] or (not loinc and fact["pattern"].search(name)):
                preferred = fact["preferred"]
                rank = (*today.rank(when), bool(preferred and preferred.search(" ".join([name, *sorted(loinc)]))))
                item = (when, f"{fact['name']} {value}", _shown(r, when, today))
                for chosen in (newest, ahead) if today.is_future(when) else (newest,):
                    if fact["name"] not in chosen or rank > chosen[fact["name"]][0]:  # a tie keeps the first
                        chosen[fact["name"]] = (rank, item)
                break
    return {name: [item] + ([ahead[name][1]] if name in ahead and ahead[name][1] is not item else [])
            for name, (_, item) in newest.items()}


def _pregnancy(observations: Sequence[Resource], conditions: Sequence[Resource], today: Today) -> list[str]:
    """Pregnancy status (with the estimated due date) and lactation, newest first (a status dated in the future,
    flagged, after today's); an active pregnancy Condition counts when no status was observed."""
    vocab = _vocab()["pregnancy"]
    said: list[str] = []
    statuses = _and_ahead([(w, _answer(r, vocab), _shown(r, w, today)) for r in observations
                           if (w := _stamp(r)) is not None
                           and (has_code(r.get("code"), "loinc", frozenset(vocab["status_loinc"]))
                                or has_code(r.get("code"), "snomed", frozenset(vocab["status_snomed"])))], today)
    status = statuses[0] if statuses else None
    if status is None:
        active = [r for r in conditions if has_code(r.get("code"), "snomed", frozenset(vocab["pregnant_conditions"]))
                  and next((code for _, code, _ in codings(r.get("clinicalStatus"))), "active") == "active"]
        if active:
            written = as_written(active[0].get("onsetDateTime") or active[0].get("recordedDate"))
            future = today.is_future(partial_timestamp(written))
            said.append(f"pregnant ({text_of(active[0].get('code'))}, recorded "
                        f"{shown_date(written, future) or 'undated'})")
    else:
        said += [f"pregnancy status {answer} ({day})" for _, answer, day in statuses]
    for key, label in (("due_date_loinc", "estimated due date"), ("gestational_age_loinc", "gestational age"),
                       ("lactation_loinc", "lactation")):
        found = _newest([(w, value_of(r), _day(r)) for r in observations if (w := _stamp(r)) is not None
                         and value_of(r)
                         and has_code(r.get("code"), "loinc", frozenset(vocab[key]))], today)
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


def pregnancy_status(results: Sequence[Resource], conditions: Sequence[Resource], today: Today) -> str:
    """"pregnancy status pregnant (2022-08-24), estimated due date 2020-02-18" for the face sheet's first
    line (every question about a pregnant or lactating patient must know it), or "" when none is recorded."""
    return ", ".join(_pregnancy(results, conditions, today))


def drug_facts(subject: str, results: Sequence[Resource], today: Today) -> Fragment | None:
    """One line with the results a drug choice or dose turns on (renal and hepatic function, weight), each
    dated; pregnancy and lactation are on the patient's line of the face sheet."""
    labs = _lab_facts(results, today)
    groups: list[str] = []
    for group, title in (("renal", "Renal"), ("hepatic", "Hepatic"), ("body", "Body")):
        found = [item for f in _vocab()["fact"] if f["group"] == group for item in labs.get(f["name"], [])]
        if found:
            groups.append(title + _dated(found))
    if not groups:
        return None
    return Fragment("summary/drug-facts", subject, "Drug decision facts: " + "; ".join(groups) + ".",
                    "Drug decision facts", today.newest(when for found in labs.values() for when, _, _ in found),
                    source="fhir")


def latest_results(subject: str, results: Sequence[Resource], today: Today) -> Fragment | None:
    """The newest value of other key results (sodium, hemoglobin, platelets, HbA1c, glucose), one dated line:
    trustworthy dates first, newest first, then any dated in the future (flagged)."""
    newest = _lab_facts(results, today, "other")
    if not newest:
        return None
    by_day: dict[tuple[bool, date, str], list[str]] = {}
    for fact in _vocab()["other"]:
        for when, value, day in newest.get(fact["name"], []):
            by_day.setdefault((not today.is_future(when), when.date(), day), []).append(value)
    groups = [f"{'; '.join(values)} ({day})" for (_, _, day), values in sorted(by_day.items(), reverse=True)]
    return Fragment("summary/latest-results", subject, "Latest results: " + "; ".join(groups) + ".",
                    "Latest results", today.newest(when for found in newest.values() for when, _, _ in found),
                    source="fhir")
