"""The face sheet: the few lines every answer about this patient may need, built from the whole chart.

- who: age and sex (the Patient, its sex extension when `gender` is absent: rules/records/fhir.toml [sex]);
- the allergy status: the recorded allergies, else a "no known allergy" statement, else what the newest
  note says, else that nothing is recorded (not the same as "no known allergies");
- the active problem list and the current medications (after reconciliation), one line each;
- the drug-decision facts: pregnancy status with the due date, lactation, renal function (creatinine,
  eGFR, potassium), hepatic function, weight, height and BMI, found by LOINC code (rules/records/drug_facts.toml),
  each the newest value with its unit and date; beside them the kidney and liver conditions (a CKD stage, dialysis,
  a kidney transplant, cirrhosis: rules/records/conditions.toml), so a drug question keeps the renal fact of a chart
  that has no recent creatinine; a weight the chart's own height and BMI contradict, said so ("not used for
  dosing"); and the newest drug levels, flagged outside their therapeutic range (rules/records/drug_levels.toml);
- the latest value of other key results.
The tier rules make these must-keep when a question needs them (rules/evidence/questions.toml).

"Newest" is the newest trustworthy date: a result or status dated after the present (records.dates.Today) never
outranks today's; it is shown after it, flagged ("date in the future: 2062-03-01"). The age is the age today (or at
death); a birth date in the future gives no age and a defect line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

from ebmrag.records.codes import text_table
from ebmrag.records.dates import Today, as_written, future_birth, partial_timestamp, shown_date, trust_rank
from ebmrag.records.fhir.chart_facts import ChartFacts, ConditionFact, LabResult, Medications, Pregnancy, vocabulary
from ebmrag.records.fhir.coding import obj, objects, strings, text_of
from ebmrag.records.fhir.index import Resource
from ebmrag.records.fhir.medications import LISTED_STATUS
from ebmrag.records.fragment import Fragment
from ebmrag.rules import rule_file


@rule_file("records/fhir.toml")
def _sexes(raw: Mapping[str, Any]) -> dict[str, str]:
    """fhir.toml [sex]: a sex extension's code or display, lower-cased -> "female" or "male"."""
    sexes = text_table(raw.get("sex"), "sex")
    wrong = [key for key, sex in sexes.items() if key != key.lower() or sex not in ("female", "male")]
    if wrong:
        raise ValueError(f"[sex] {wrong[0]!r}: keys are lower-cased, values \"female\" or \"male\"")
    return sexes


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
        sexes = _sexes()
        sex = next((sexes[key] for s in said if (key := s.lower().split(" (")[0].strip()) in sexes), "")
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


def medication_summary(subject: str, medications: Medications, newest: datetime | None) -> Fragment | None:
    """The current medications after reconciliation; "none" said outright when the chart states it or when
    every medication record has ended (a drug question must know the list is empty, not missing). Drugs a document
    lists with a status that ended them ("Metformin (status completed)", fhir.medications) are named as listed,
    with that status: the document's list is not "none active"."""
    parts = []
    current = list(medications.current)
    listed = [name for name in medications.unknown if LISTED_STATUS in name]
    unknown = [name for name in medications.unknown if LISTED_STATUS not in name]
    if current:
        stale = sum(name.endswith("*") for name in current)
        if stale == len(current):  # say it once, not once per drug
            legend, current = ", none recently confirmed", [name.rstrip("*") for name in current]
        else:
            legend = "; * = not recently confirmed" if stale else ""
        parts.append(f"Active medications ({len(current)}{legend}): {'; '.join(current)}.")
    elif medications.stated and not listed:  # "No known medications" and "No information about medications" differ
        parts.append(f"Active medications: none listed; the chart states: {medications.stated.rstrip('.')}.")
    elif medications.ended and not unknown and not listed:
        parts.append(f"Active medications: none marked active ({medications.ended} earlier medication records).")
    if listed:
        parts.append(f"{'Also listed' if current else 'Medications listed'} in the chart's document ({len(listed)}): "
                     f"{'; '.join(listed)}.")
    if unknown:
        parts.append(f"Medications whose status is not recorded ({len(unknown)}): {'; '.join(unknown)}.")
    if not parts:
        return None
    return Fragment("summary/active-medications", subject, " ".join(parts), "Active medications", newest,
                    source="fhir")


def _result(r: LabResult) -> str:
    """"weight 70 kg"; with ebmrag's caution when it has one ("weight 7 kg (contradicts height 170 cm and BMI 24
    kg/m2 of 2024-01-03: not used for dosing)")."""
    return f"{r.name} {r.value}" + (f" ({r.caution})" if r.caution else "")


def _level(r: LabResult) -> str:
    """A drug level with the laboratory's own flag when it sent one, else ebmrag's range judgement."""
    flag = f"flag {r.flags}" if r.flags else r.caution
    return f"{r.name} {r.value}" + (f" ({flag})" if flag else "")


def _dated(found: Sequence[LabResult], said: Callable[[LabResult], str] = _result) -> str:
    """Values of one day share their date ("(2024-03-11) creatinine 88 umol/L, eGFR 78"): dates cost tokens."""
    days = {r.source.shown_date for r in found}
    if len(days) == 1:
        return f" ({days.pop()}): " + ", ".join(said(r) for r in found)
    return ": " + ", ".join(f"{said(r)} ({r.source.shown_date})" for r in found)


def _condition(fact: ConditionFact) -> str:
    """"CKD stage 4 (Condition, 2023-05-02)": the fact, where the chart holds it and since when."""
    date = fact.source.shown_date
    return f"{fact.shown} ({fact.source.kind}{f', {date}' if date else ''})"


def pregnancy_status(pregnancy: Pregnancy) -> str:
    """"pregnancy status pregnant (2022-08-24), estimated due date 2020-02-18" for the face sheet's first line
    (every question about a pregnant or lactating patient must know it), or "" when none is recorded. A status
    that says pregnant but is no longer current says so, as the CDS cards then warn of no pregnancy."""
    said: list[str] = []
    newest = pregnancy.newest
    lapsed = f"; not current: {pregnancy.lapsed}" if pregnancy.lapsed else ""
    if pregnancy.statuses:
        said += [f"pregnancy status {s.answer} ({s.source.shown_date}{lapsed if s is newest else ''})"
                 for s in pregnancy.statuses]
    elif newest is not None:
        name = newest.said.removeprefix("active condition: ")
        head = "pregnant" if pregnancy.current or not lapsed else "pregnancy"
        said.append(f"{head} ({name}, recorded {newest.source.shown_date or 'undated'}{lapsed})")
    if said and pregnancy.due_date is not None:
        said.append(f"estimated due date {pregnancy.due_date[1]}")
    if said and pregnancy.gestational_age:
        said.append(f"gestational age {pregnancy.gestational_age}")
    if pregnancy.lactation is not None:
        source, value = pregnancy.lactation
        where = ", ".join(w for w in (source.kind if source.kind == "Condition" else "", source.shown_date) if w)
        said.append(f"lactation {value}" + (f" ({where})" if where else ""))
    return ", ".join(said)


def drug_facts(subject: str, chart: ChartFacts) -> Fragment | None:
    """One line with what a drug choice or dose turns on: renal and hepatic function (the conditions first, "CKD
    stage 4 (Condition, 2023-05-02)", then the results), weight, height and BMI, and the drug levels, each dated;
    pregnancy and lactation are on the patient's line of the face sheet. Short, as it competes for a small window."""
    groups: list[str] = []
    for group, title in (("renal", "Renal"), ("hepatic", "Hepatic"), ("body", "Body")):
        found = [r for f in vocabulary()["fact"] if f["group"] == group for r in chart.labs.get(f["name"], ())]
        conditions = [c for c in chart.conditions if c.group == group]
        if conditions:
            groups.append(f"{title}: " + ", ".join(_condition(c) for c in conditions)
                          + (f"; results{_dated(found)}" if found else ""))
        elif found:
            groups.append(title + _dated(found))
    levels = [r for found in chart.drug_levels.values() for r in found]
    if levels:
        groups.append("Drug levels" + _dated(levels, _level))
    if not groups:
        return None
    stamps = [r.when for found in (*chart.labs.values(), *chart.drug_levels.values()) for r in found]
    return Fragment("summary/drug-facts", subject, "Drug decision facts: " + "; ".join(groups) + ".",
                    "Drug decision facts", chart.today.newest([*stamps, *(c.when for c in chart.conditions)]),
                    source="fhir")


def latest_results(subject: str, chart: ChartFacts) -> Fragment | None:
    """The newest value of other key results (sodium, hemoglobin, platelets, HbA1c, glucose), one dated line:
    trustworthy dates first, newest first, then any dated in the future (flagged)."""
    newest = chart.other_labs
    if not newest:
        return None
    by_day: dict[tuple[bool, date, str], list[str]] = {}
    for fact in vocabulary()["other"]:
        for r in newest.get(fact["name"], ()):
            when = r.when or datetime.min
            by_day.setdefault((not r.source.future, when.date(), r.source.shown_date), []).append(f"{r.name} {r.value}")
    groups = [f"{'; '.join(values)} ({day})" for (_, _, day), values in sorted(by_day.items(), reverse=True)]
    return Fragment("summary/latest-results", subject, "Latest results: " + "; ".join(groups) + ".",
                    "Latest results", chart.today.newest(r.when for found in newest.values() for r in found),
                    source="fhir")
