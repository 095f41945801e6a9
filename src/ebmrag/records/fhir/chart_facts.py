"""The facts a drug decision turns on, read once from a chart: its allergies, a pregnancy, the newest renal,
hepatic and other key results, and the current medications.

One reading serves every consumer: the face sheet (records.fhir.facts) renders these facts into the context, and
the CDS cards (cds.facts) cite the same ones. Before they shared it, the two read the chart apart and disagreed
(the cards knew `effectiveInstant`, the face sheet did not; the cards dropped a refuted pregnancy Condition, the face
sheet did not): a clinician could see one answer on a card and another in the context of the same chart.

Each fact keeps where it came from (`Source`: resource type and id, the date as written, whether that date lies
after the present) and the chart's own words; nothing is derived that the chart does not hold (no eGFR from a
creatinine). "Newest" is by a trustworthy date: one dated after the present (records.dates.Today) never outranks
today's; it is kept beside it, flagged. The codes are LOINC and SNOMED CT, from rules/records/drug_facts.toml.

A kidney, liver, pregnancy or lactation fact comes from the Conditions too (a CKD stage, dialysis, a kidney
transplant, cirrhosis: rules/records/conditions.toml, by SNOMED CT and ICD-10 code, then by a grammar of the chart's
words), as a chart without a recent creatinine may still say the patient is on dialysis. Values are checked against
each other, not trusted blindly: a weight that the same period's height and BMI contradict (BMI = kg/m2), or one in
a unit that is no plausible body weight, is shown with why and is not the dosing weight; a drug level outside its
therapeutic range (rules/records/drug_levels.toml) is flagged when the laboratory sent no flag of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ebmrag.records.dates import Today, as_written, partial_timestamp, shown_date
from ebmrag.records.fhir.coding import (
    codings,
    concepts,
    has_code,
    obj,
    objects,
    states_absence,
    text_of,
    without_semantic_tags,
)
from ebmrag.records.fhir.index import Resource
from ebmrag.records.fhir.measures import (
    converted,
    drug_level_flag,
    drug_level_of,
    implausible,
    parse_unit,
    value_in,
)
from ebmrag.records.fhir.rendered import status_code
from ebmrag.records.fhir.results import interpretation, value_of
from ebmrag.rules import rule_file
from ebmrag.vocab.negation import negation

RETRACTED = ("refuted", "entered-in-error")
RENAL = ("creatinine", "eGFR", "creatinine clearance")  # the renal [[fact]]s a dose decision cites, in this order
NOT_RESULTS = ("entered-in-error", "cancelled")  # a tuple: a malformed status may be unhashable
_UNDATED = datetime.min.replace(tzinfo=UTC)
_PREGNANT_WORDS = re.compile(r"^\s*(currently )?pregnant\s*$", re.IGNORECASE)


@rule_file("records/drug_facts.toml")
def vocabulary(raw: Mapping[str, Any]) -> dict[str, Any]:
    """drug_facts.toml, compiled; a file without the renal facts or the pregnancy table is refused."""
    names = {fact.get("name") for fact in raw.get("fact", [])}
    missing = [name for name in RENAL if name not in names]
    if missing or "pregnancy" not in raw:
        raise ValueError(f"needs [[fact]]s named {list(RENAL)} and a [pregnancy] table")
    unread = [f"{name}: {limits['unit']!r}" for name, limits in raw.get("body", {}).get("plausible", {}).items()
              if name not in names or parse_unit(limits["unit"]) is None]
    if unread:
        raise ValueError(f"[body.plausible] {unread[0]}: needs a [[fact]] of that name and a UCUM unit")
    compiled: dict[str, Any] = {"pregnancy": dict(raw["pregnancy"]), "body": dict(raw.get("body", {}))}
    for table in ("fact", "other"):
        compiled[table] = [{**fact, "pattern": re.compile(fact["display"], re.IGNORECASE),
                            "codes": frozenset(fact["loinc"]),
                            "preferred": re.compile(fact["prefer"], re.IGNORECASE) if fact.get("prefer") else None}
                           for fact in raw[table]]
    return compiled


@dataclass(frozen=True)
class Source:
    """Where a fact is in the chart: `reference` ("AllergyIntolerance/a1"; "" for a resource without id), its date
    as written, and whether that date lies after the present (shown flagged, never taken as the newest)."""

    kind: str
    reference: str
    date: str
    future: bool = False

    @property
    def shown_date(self) -> str:
        return shown_date(self.date, self.future)


def source_of(resource: Resource, date: str, today: Today) -> Source:
    rid = resource.get("id")
    return Source(str(resource.get("resourceType") or "Resource"), f"{resource.get('resourceType')}/{rid}"
                  if isinstance(rid, str) and rid else "", date, today.is_future(partial_timestamp(date)))


@dataclass(frozen=True)
class Allergy:
    """A standing allergy or intolerance entry (`allergy_stands` says which entries stand)."""

    source: Source
    named_by: tuple[Any, ...]  # the coded values naming the substance (code, substance, the reactions' substances)
    substance: str  # the chart's words for what the patient reacts to
    reactions: tuple[str, ...]  # manifestations, as written
    severity: str  # the worst reaction severity written ("severe", "moderate", "mild") or ""
    criticality: str  # "high", "low", "unable-to-assess" or ""
    clinical_status: str  # "active", "inactive", "resolved" or "" (not recorded)
    verification: str  # "confirmed", "unconfirmed", "presumed" or ""

    @property
    def current(self) -> bool:
        """Not marked inactive or resolved (an allergy without a clinical status is taken as standing)."""
        return self.clinical_status not in ("inactive", "resolved")


@dataclass(frozen=True)
class LabResult:
    """One result as the chart gives it; `name`: the vocabulary's name ("creatinine") or the chart's test name."""

    source: Source
    name: str
    test: str  # the chart's own name of the test
    value: str  # "1.51 mg/dL", as written
    when: datetime | None
    time: str  # when, as written ("2024-05-01T09:30:00+02:00")
    flags: str  # the laboratory's interpretation in words ("high", "critically low") or ""
    reference_range: str  # as written, or ""
    abnormal: bool  # the laboratory flags it outside its range
    flagged_critical: bool  # the laboratory flags it critical (HL7 HH, LL, AA, or its own words)
    caution: str = ""  # ebmrag's own word on the value, never the laboratory's: out of therapeutic range, contradicted
    untrusted: bool = False  # contradicted by the chart's other values, or in an implausible unit: not for dosing


@dataclass(frozen=True)
class PregnancyStatus:
    source: Source
    answer: str  # "pregnant", "not pregnant", or the chart's words
    said: str  # "Pregnancy status: Pregnant" (the test and its value, as written)
    when: datetime | None  # None: an undated Condition (whether it is current is not known)


@dataclass(frozen=True)
class Pregnancy:
    """What the chart records about pregnancy and lactation. `statuses`: the newest status by a trustworthy date,
    then the newest dated after the present when that is another one. `condition`: with no status, the newest
    pregnancy Condition (conditions.toml) that stands, or that ended within the [pregnancy] `current_weeks` (shown
    as past). `current`: whether the newest of these says pregnant and is recent (the [pregnancy] rule of
    drug_facts.toml); `lapsed`: why one that says pregnant is not current ("past pregnancy, ended 2024-04-20").
    `lactation`: a breastfeeding status observation, else a lactation Condition, as written."""

    statuses: tuple[PregnancyStatus, ...] = ()
    condition: PregnancyStatus | None = None
    due_date: tuple[Source, str] | None = None  # this pregnancy's due date as written
    gestational_age: str = ""
    lactation: tuple[Source, str] | None = None
    current: bool = False
    lapsed: str = ""

    @property
    def newest(self) -> PregnancyStatus | None:
        return self.statuses[0] if self.statuses else self.condition


@dataclass(frozen=True)
class Medications:
    """The current medications after reconciliation (records.fhir.medications): names, "*" marking one not
    recently confirmed; those whose status is not recorded; the chart's own statement ("No known medications");
    how many records have ended."""

    current: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    stated: str = ""
    ended: int = 0


@dataclass(frozen=True)
class ConditionFact:
    """A standing condition a drug decision turns on (conditions.toml): `shown` "CKD stage 4", "kidney transplant
    (chronic rejection)", "cirrhosis"; `said`: the chart's own words for it."""

    source: Source
    name: str  # the rule's fact: "CKD", "dialysis", "kidney transplant", "cirrhosis", "pregnancy", ...
    group: str  # "renal", "hepatic", "pregnancy", "lactation"
    shown: str
    said: str
    when: datetime | None
    by_code: bool  # found by its code (else by the words of its text or displays)
    ended: str = ""  # why it no longer stands ("resolved", "ended 2025-11-02"): kept for a recent pregnancy only


@dataclass(frozen=True)
class ChartFacts:
    """The facts of one chart read at `today`; `labs` (drug_facts.toml [[fact]]) and `other_labs` ([[other]]): per
    vocabulary name, the newest result, and after it the newest dated in the future, flagged. `conditions`: the
    standing conditions of conditions.toml, the newest of each fact; `drug_levels`: per drug of drug_levels.toml,
    the newest level (its `caution` says when it lies outside the therapeutic range)."""

    today: Today
    allergies: tuple[Allergy, ...]
    pregnancy: Pregnancy
    labs: Mapping[str, tuple[LabResult, ...]]
    other_labs: Mapping[str, tuple[LabResult, ...]]
    medications: Medications
    conditions: tuple[ConditionFact, ...] = ()
    drug_levels: Mapping[str, tuple[LabResult, ...]] = field(default_factory=dict)

    @property
    def dosing_weight(self) -> LabResult | None:
        """The newest weight by a trustworthy date, unless the chart's own height and BMI contradict it or its unit
        makes it no plausible body weight: a dose is never computed from such a value."""
        found = self.labs.get("weight", ())
        return found[0] if found and not found[0].untrusted and not found[0].source.future else None


def read_facts(resources: Iterable[Resource], today: Today, medications: Medications = Medications()) -> ChartFacts:
    """The facts of one patient's resources (the caller keeps them to this patient: the reader's compartment);
    `medications`: the reader's reconciliation, which needs the whole chart's index (records.fhir.bundle)."""
    kept = [r for r in resources if isinstance(r, Mapping)]
    observations = [r for r in kept if r.get("resourceType") == "Observation" and r.get("status") not in NOT_RESULTS]
    results = [r for r in observations if re.search(r"\d", value_of(r))]
    allergies = tuple(_allergy(r, today) for r in kept if r.get("resourceType") == "AllergyIntolerance"
                      and allergy_stands(r))
    conditions = condition_facts(kept, today)
    labs = {name: tuple(_checked(lab_result(r, name, today), r, results, today) for r in found)
            for name, found in _picked(results, today, "fact").items()}
    return ChartFacts(today, allergies, _pregnancy(observations, conditions, today), labs,
                      _labs(results, today, "other"), medications,
                      tuple(c for c in conditions if c.group in ("renal", "hepatic")), _drug_levels(results, today))


# ------------------------------------------------------------------------------------------------ allergies
_SEVERITY = ["mild", "moderate", "severe"]


@rule_file("records/allergy_statements.toml")
def statements(raw: Mapping[str, Any]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """[(status code, its words)]: the statuses a chart writes as text (allergy_statements.toml)."""
    return tuple((code, re.compile(pattern, re.IGNORECASE)) for code, pattern in raw["status_words"].items())


def status_of(concept: Any) -> str:
    """A status's code, or the code its text spells out ("Entered in Error") when it has none."""
    code = status_code(concept)
    if code:
        return code
    text = text_of(concept)
    return next((name for name, words in statements() if words.search(text)), "") if text else ""


def taken_back(r: Resource) -> bool:
    """The entry's own words say the allergy is not there ("not allergic to penicillin", "否认青霉素过敏",
    "penicillin allergy delabelled after oral challenge"), read with the scope of the shared negation grammar
    (vocab.negation: a cue governs its clause, doubt takes nothing back, so "阿莫西林过敏（未确认）" stands): its
    code and substance text only, never its notes or reactions, where "no rash" says something else. The reader
    shows such an entry as an allergy status, never as an allergy."""
    return any(negation().allergy_taken_back(t, entry=True)
               for t in (text_of(r.get("code")), text_of(r.get("substance"))) if t)


def allergy_stands(r: Resource) -> bool:
    """Whether an AllergyIntolerance entry states an allergy: not refuted or entered in error (by code, or in
    words where a code belongs), not a statement of absence ("no known allergy") and not taken back in its own
    words (both are allergy statuses of their own)."""
    return (status_of(r.get("verificationStatus")) not in RETRACTED and not states_absence(r.get("code"), "allergy")
            and not taken_back(r))


def _allergy(r: Resource, today: Today) -> Allergy:
    reactions = objects(r.get("reaction"))
    named_by = tuple(s for s in [r.get("code"), r.get("substance"), *(x.get("substance") for x in reactions)] if s)
    manifestations = tuple(dict.fromkeys(t for x in reactions for m in concepts(x.get("manifestation"))
                                         if (t := text_of(m) or text_of(obj(m).get("concept")))))
    severities = [str(x.get("severity")) for x in reactions if x.get("severity") in _SEVERITY]
    date = as_written(r.get("onsetDateTime")) or as_written(r.get("recordedDate")) or next(
        (as_written(x.get("onset")) for x in reactions if as_written(x.get("onset"))), "")
    return Allergy(source_of(r, date, today), named_by, next((t for s in named_by if (t := text_of(s))), ""),
                   manifestations, max(severities, key=_SEVERITY.index, default=""),
                   str(r.get("criticality")) if isinstance(r.get("criticality"), str) else "",
                   status_of(r.get("clinicalStatus")), status_of(r.get("verificationStatus")))


# ------------------------------------------------------------------------------------------------ results
def result_time(r: Resource) -> Any:
    """When a result holds, as written: effective[x] (dateTime, Period start, instant), else when it was issued."""
    return (r.get("effectiveDateTime") or obj(r.get("effectivePeriod")).get("start") or r.get("effectiveInstant")
            or r.get("issued"))


def result_stamp(r: Resource) -> datetime | None:
    return partial_timestamp(result_time(r))


def lab_result(r: Resource, name: str, today: Today) -> LabResult:
    """The result as the chart gives it, with the laboratory's own flags in words (its display, else the HL7
    code's meaning) and whether they call it abnormal or critical."""
    table = interpretation()
    words, codes = [], set()
    for concept in concepts(r.get("interpretation")):
        code = status_code(concept).upper()
        codes.add(code)
        named = bool(concept.get("text")) or any(display for _, _, display in codings(concept))
        words.append(text_of(concept) if named else table.words.get(code, code))
    flags = ", ".join(w for w in words if w)
    ranges = "; ".join(str(rr.get("text") or "-".join(v for v in (value_of({"valueQuantity": rr.get(k)})
                                                                    for k in ("low", "high")) if v))
                       for rr in objects(r.get("referenceRange")))
    raw = result_time(r)
    test = text_of(r.get("code")) or name
    return LabResult(source_of(r, as_written(raw), today), name or test, test, value_of(r), result_stamp(r),
                     raw.strip()[:40] if isinstance(raw, str) else "", flags, ranges,
                     bool(codes & table.abnormal) or bool(table.abnormal_words.search(flags)),
                     bool(codes & table.critical) or bool(table.critical_words.search(flags)))


Ranked = tuple[tuple[bool, datetime, bool], Resource]


def _labs(results: Sequence[Resource], today: Today, table: str) -> dict[str, tuple[LabResult, ...]]:
    return {name: tuple(lab_result(r, name, today) for r in found)
            for name, found in _picked(results, today, table).items()}


def _picked(results: Sequence[Resource], today: Today, table: str) -> dict[str, list[Resource]]:
    """Per fact of a vocabulary table, the newest result by a trustworthy date (of two of one time, the one the
    fact's `prefer` names, else the first), then the newest dated in the future, flagged, when that is another:
    by LOINC code, else by display name when the result has no LOINC coding at all (a local lab code)."""
    newest: dict[str, Ranked] = {}
    ahead: dict[str, Ranked] = {}
    for r in results:
        when = result_stamp(r)
        if when is None:
            continue
        loinc = {code for system, code, _ in codings(r.get("code")) if "loinc" in system}
        name = text_of(r.get("code"))
        fact = next((f for f in vocabulary()[table] if loinc & f["codes"] or (not loinc and f["pattern"].search(name))),
                    None)
        if fact is None:
            continue
        preferred = fact["preferred"]
        rank = (*today.rank(when), bool(preferred and preferred.search(" ".join([name, *sorted(loinc)]))))
        for chosen in (newest, ahead) if today.is_future(when) else (newest,):
            if fact["name"] not in chosen or rank > chosen[fact["name"]][0]:  # a tie keeps the first
                chosen[fact["name"]] = (rank, r)
    return {name: [first, *([ahead[name][1]] if name in ahead and ahead[name][1] is not first else [])]
            for name, (_, first) in newest.items()}


def _of_fact(r: Resource, name: str) -> bool:
    """Whether a result is one of the [[fact]] `name` (by LOINC code, else by display without a LOINC coding)."""
    fact = next(f for f in vocabulary()["fact"] if f["name"] == name)
    loinc = {code for system, code, _ in codings(r.get("code")) if "loinc" in system}
    return bool(loinc & fact["codes"]) if loinc else bool(fact["pattern"].search(text_of(r.get("code"))))


# ------------------------------------------------------------------------------------------------ body measures
def _checked(result: LabResult, r: Resource, results: Sequence[Resource], today: Today) -> LabResult:
    """A body measure (drug_facts.toml [body.plausible]) whose unit is not of its kind, or whose value no person
    has in that unit, is untrusted; so is a weight that the same period's height and BMI contradict."""
    body = vocabulary()["body"]
    limits = body.get("plausible", {}).get(result.name)
    if limits is None:
        return result
    why = implausible(result.name, r.get("valueQuantity"), limits)
    if not why and result.name == "weight":
        why = _contradicted(r, results, body)
    return replace(result, caution=f"{why}: not used for dosing", untrusted=True) if why else result


def _contradicted(weight: Resource, results: Sequence[Resource], body: Mapping[str, Any]) -> str:
    """Why the height recorded nearest the weight (within `same_period_days`) and the BMI of its day contradict it
    (BMI = kg/m2, beyond `bmi_tolerance`), naming the unit in which the weight would agree; "" when they agree or
    are missing."""
    when = result_stamp(weight)
    kg = value_in(weight.get("valueQuantity"), "kg")
    if when is None or kg is None:
        return ""
    window = timedelta(days=body["same_period_days"])
    near: dict[str, Resource] = {}
    for name in ("height", "BMI"):  # a BMI is computed from that day's weight: only the same day's can contradict it
        found = [(abs(w - when), r) for r in results if _of_fact(r, name) and (w := result_stamp(r)) is not None
                 and (abs(w - when) <= window if name == "height" else w.date() == when.date())
                 and not implausible(name, r.get("valueQuantity"), body["plausible"][name])]
        if not found:
            return ""
        near[name] = min(found, key=lambda item: item[0])[1]
    metres = value_in(near["height"].get("valueQuantity"), "m")
    bmi = value_in(near["BMI"].get("valueQuantity"), "kg/m2", bare=bool(body["plausible"]["BMI"].get("bare")))
    if metres is None or bmi is None:
        return ""
    expected = bmi * metres**2
    if abs(kg - expected) <= body["bmi_tolerance"] * expected:
        return ""
    raw = float(obj(weight.get("valueQuantity"))["value"])
    agrees = next((shown for unit, shown in body["plausible"]["weight"].get("units", {}).items()
                   if (v := converted(raw, unit, "kg")) is not None and abs(v - expected) <= body["bmi_tolerance"]
                   * expected), "")
    said = as_written(result_time(near["BMI"])) or as_written(result_time(near["height"]))
    return (f"contradicts height {value_of(near['height'])} and BMI {value_of(near['BMI'])}"
            + (f" of {said}" if said else "") + (f" (agrees if read in {agrees})" if agrees else ""))


# ------------------------------------------------------------------------------------------------ drug levels
def _drug_levels(results: Sequence[Resource], today: Today) -> dict[str, tuple[LabResult, ...]]:
    """Per drug of drug_levels.toml, the newest level (and the newest dated in the future, flagged), with ebmrag's
    judgement of its range as `caution` when the laboratory sent no interpretation of its own."""
    by_drug: dict[str, list[tuple[datetime, Resource]]] = {}
    for r in results:
        level, when = drug_level_of(r), result_stamp(r)
        if level is not None and when is not None:
            by_drug.setdefault(level.drug, []).append((when, r))
    return {drug: tuple(replace(lab_result(r, drug, today), caution="" if concepts(r.get("interpretation"))
                                else drug_level_flag(r)) for _, r in _newest_and_ahead(found, today))
            for drug, found in by_drug.items()}


# ------------------------------------------------------------------------------------------------ conditions
_GROUPS = ("renal", "hepatic", "pregnancy", "lactation")


@dataclass(frozen=True)
class ConditionRule:
    """One conditions.toml [[condition]], compiled."""

    name: str
    group: str
    shown: str  # with "{q}" (the qualifier) and "{words}" (the chart's words)
    plain: str  # without a qualifier
    snomed: frozenset[str]
    icd10: tuple[str, ...]  # prefixes, upper-cased, without dots
    qualifier_codes: Mapping[str, str]  # a SNOMED CT code or an ICD-10 code (no dots) -> its qualifier
    qualifier_pattern: re.Pattern[str] | None  # group `q`
    qualifiers: tuple[tuple[str, re.Pattern[str]], ...]
    words: re.Pattern[str]
    exclude: re.Pattern[str] | None
    fallback: bool
    procedure_days: float | None  # read from Procedures done within this many days (inf: ever); None: never
    upper: bool


@dataclass(frozen=True)
class ConditionRules:
    rules: tuple[ConditionRule, ...]
    snomed_system: re.Pattern[str]
    icd10_system: re.Pattern[str]
    not_icd10: re.Pattern[str]
    ended: frozenset[str]
    not_the_patients: re.Pattern[str]
    roman: Mapping[str, str]
    test: re.Pattern[str]  # "pregnancy test": a test, which names the condition only with a positive result
    positive: re.Pattern[str]


def _icd(code: str) -> str:
    return code.replace(".", "").strip().upper()


@rule_file("records/conditions.toml")
def condition_rules(raw: Mapping[str, Any]) -> ConditionRules:
    """conditions.toml, compiled; a fact of an unknown group, or one whose words cannot be shown, is refused."""
    systems = raw["systems"]
    return ConditionRules(tuple(_condition_rule(c) for c in raw["condition"]),
                          re.compile(systems["snomed"], re.IGNORECASE),
                          re.compile(systems["icd10"], re.IGNORECASE), re.compile(systems["not_icd10"], re.IGNORECASE),
                          frozenset(raw["standing"]["ended"]),
                          re.compile(raw["words"]["not_the_patients"], re.IGNORECASE), dict(raw["words"]["roman"]),
                          re.compile(raw["words"]["test"], re.IGNORECASE),
                          re.compile(raw["words"]["positive"], re.IGNORECASE))


def _condition_rule(c: Mapping[str, Any]) -> ConditionRule:
    if c["group"] not in _GROUPS or "{" in c["plain"].replace("{words}", ""):
        raise ValueError(f"[[condition]] {c.get('name')!r}: group is one of {_GROUPS}; `plain` has no {{q}}")
    days = c.get("procedures")

    def pattern(key: str) -> re.Pattern[str] | None:
        return re.compile(c[key], re.IGNORECASE) if c.get(key) else None

    return ConditionRule(
        str(c["name"]), str(c["group"]), str(c["shown"]), str(c["plain"]), frozenset(c.get("snomed", [])),
        tuple(_icd(code) for code in c.get("icd10", [])),
        {(k if k.isdigit() else _icd(k)): str(v) for k, v in c.get("qualifier_codes", {}).items()},
        pattern("qualifier_pattern"),
        tuple((str(q), re.compile(rx, re.IGNORECASE)) for q, rx in c.get("qualifiers", {}).items()),
        re.compile(c["words"], re.IGNORECASE), pattern("exclude"), bool(c.get("fallback", False)),
        None if days is None else float("inf") if days == "ever" else float(days), c.get("qualifier_case") == "upper")


def condition_stands(r: Resource, today: Today) -> bool:
    """A Condition that stands: not ended by its clinicalStatus, not refuted or entered in error, and not abated (an
    abatement date that has passed, or an abatement given as words, an age or a plain "true")."""
    return _ended(r, today) == ""


def _ended(r: Resource, today: Today) -> str | None:
    """"" for a standing Condition, why it ended ("resolved", "ended 2025-11-02") for one that has, None for one
    refuted or entered in error (it never stood)."""
    if status_of(r.get("verificationStatus")) in RETRACTED:
        return None
    abated = next((v for v in (r.get("abatementDateTime"), obj(r.get("abatementPeriod")).get("end"),
                               obj(r.get("abatementPeriod")).get("start")) if v), None)
    stamp = partial_timestamp(abated)
    if stamp is not None and not today.is_future(stamp):
        return f"ended {as_written(abated)}"
    status = status_of(r.get("clinicalStatus"))
    if status in condition_rules().ended:
        return status
    if stamp is None and (abated or any(r.get(k) for k in ("abatementBoolean", "abatementString", "abatementAge",
                                                           "abatementRange"))):
        return "ended"
    return ""


def _procedure_done(r: Resource) -> bool:
    return str(r.get("status") or "completed") in ("completed", "in-progress")


def _when_recorded(r: Resource) -> str:
    """The date a condition holds from (onset, else recorded), or a procedure was done (its end, else start)."""
    for value in (r.get("onsetDateTime"), obj(r.get("onsetPeriod")).get("start"), r.get("recordedDate"),
                  r.get("assertedDate"), r.get("dateRecorded"), r.get("performedDateTime"),
                  obj(r.get("performedPeriod")).get("end"), obj(r.get("performedPeriod")).get("start")):
        if as_written(value):
            return as_written(value)
    return ""


def _texts(concept: Any) -> list[str]:
    """A code's text and each display: the words a condition is recognised by when no code is known."""
    return list(dict.fromkeys(t.strip() for t in [str(obj(concept).get("text") or ""),
                                                 *(display for _, _, display in codings(concept))] if t.strip()))


def _said_by_words(rule: ConditionRule, texts: Sequence[str], rules: ConditionRules) -> bool:
    """The words name the fact, about the patient's own standing condition: not taken back by the shared negation
    grammar ("no chronic kidney disease"), not a family history, a screening or a donor, not the rule's exclusions."""
    for text in texts:
        found = rule.words.search(text)
        if found is None:
            continue
        clause = _clause(text, found.start(), found.end())  # "CKD stage 3 - referral to nephrology": two clauses
        if rules.not_the_patients.search(clause) or (rule.exclude and rule.exclude.search(clause)) \
                or (rules.test.search(clause) and not rules.positive.search(clause)):
            continue
        if not any(negation().taken_back(text, [found.span()])):
            return True
    return False


_CLAUSE_END = re.compile(r"[;,.()\[\]]|\s[-–—/]\s|\band\b|\bwith\b")


def _clause(text: str, start: int, end: int) -> str:
    """The clause of `text` that holds the span: what modifies a condition ("family history of", "suspected",
    "previous") is written in its clause, not in the next ("Hepatitis C with cirrhosis, suspected HCC")."""
    before = [m.end() for m in _CLAUSE_END.finditer(text, 0, start)]
    after = _CLAUSE_END.search(text, end)
    return text[before[-1] if before else 0: after.start() if after else len(text)]


def _qualifier(rule: ConditionRule, codes: set[str], texts: Sequence[str], rules: ConditionRules) -> str:
    """The qualifier by code first, then by the words (a stage "IV" read as "4")."""
    found = next((rule.qualifier_codes[c] for c in codes if c in rule.qualifier_codes), "")
    for text in texts if not found else ():
        match = rule.qualifier_pattern.search(text) if rule.qualifier_pattern else None
        if match:
            found = rules.roman.get(match["q"].lower(), match["q"].lower())
            break
        found = next((q for q, pattern in rule.qualifiers if pattern.search(text)), "")
        if found:
            break
    return found.upper() if rule.upper else found


def _condition_fact(rule: ConditionRule, r: Resource, today: Today) -> ConditionFact | None:
    rules = condition_rules()
    snomed = {code for system, code, _ in codings(r.get("code")) if rules.snomed_system.search(system)}
    icd = {_icd(code) for system, code, _ in codings(r.get("code"))
           if rules.icd10_system.search(system) and not rules.not_icd10.search(system)}
    texts = _texts(r.get("code"))
    by_code = bool(snomed & rule.snomed) or any(c.startswith(rule.icd10) for c in icd) or bool(
        (snomed | icd) & set(rule.qualifier_codes))
    if not by_code and not _said_by_words(rule, texts, rules):
        return None
    said = without_semantic_tags(text_of(r.get("code")))
    qualifier = _qualifier(rule, snomed | icd, texts, rules)
    shown = (rule.shown if qualifier else rule.plain).format(q=qualifier, words=said)
    date = _when_recorded(r)
    return ConditionFact(source_of(r, date, today), rule.name, rule.group, shown, said, partial_timestamp(date),
                         by_code)


def condition_facts(resources: Sequence[Resource], today: Today) -> tuple[ConditionFact, ...]:
    """Per fact of conditions.toml, the newest standing Condition (or, for a fact read from Procedures, a recent
    enough Procedure) that names it, in the file's order; a `fallback` fact only when its group has no other."""
    found: dict[str, list[ConditionFact]] = {}
    for r in resources:
        rules, ended = _rules_for(r, today)
        for rule in rules:
            fact = _condition_fact(rule, r, today)
            if fact is None or (r.get("resourceType") == "Procedure" and not _recent(fact, rule, today)) or (
                    ended and not _recently_ended(r, fact, today)):
                continue
            found.setdefault(rule.name, []).append(replace(fact, ended=ended) if ended else fact)
    newest = [max(facts, key=lambda f: (f.when is not None, *today.rank(f.when or _UNDATED), f.shown != f.said))
              for rule in condition_rules().rules if (facts := found.get(rule.name))]
    groups = {f.group for f, rule in _with_rules(newest) if not rule.fallback}
    return tuple(f for f, rule in _with_rules(newest) if not rule.fallback or f.group not in groups)


def _rules_for(r: Resource, today: Today) -> tuple[tuple[ConditionRule, ...], str]:
    """The rules a resource is read by, and why it ended: every rule for a standing Condition, the pregnancy rules
    for an ended one (a past pregnancy), the rules that read Procedures for a Procedure done; none otherwise."""
    kind, rules = r.get("resourceType"), condition_rules().rules
    if kind == "Condition" and not states_absence(r.get("code"), "problem"):
        ended = _ended(r, today)
        if ended is None:
            return (), ""
        return tuple(rule for rule in rules if not ended or rule.group == "pregnancy"), ended
    if kind == "Procedure" and _procedure_done(r):
        return tuple(rule for rule in rules if rule.procedure_days is not None), ""
    return (), ""


def _with_rules(facts: Sequence[ConditionFact]) -> list[tuple[ConditionFact, ConditionRule]]:
    rules = {rule.name: rule for rule in condition_rules().rules}
    return [(f, rules[f.name]) for f in facts]


def _recently_ended(r: Resource, fact: ConditionFact, today: Today) -> bool:
    """An ended pregnancy is kept (shown as past, never as current) while it ended, or was recorded, within the
    [pregnancy] `current_weeks`: a recent delivery still bears on a drug choice, an old one does not."""
    end = partial_timestamp(r.get("abatementDateTime") or obj(r.get("abatementPeriod")).get("end")) or fact.when
    weeks = timedelta(weeks=vocabulary()["pregnancy"]["current_weeks"])
    return end is not None and not today.is_future(end) and today.now - end <= weeks


def _recent(fact: ConditionFact, rule: ConditionRule, today: Today) -> bool:
    """A Procedure shows a standing fact when done within the rule's days (a dialysis session last week), or ever
    for a fact that lasts (a kidney transplant); an undated one only for the latter."""
    days = rule.procedure_days
    if days is None or days == float("inf"):
        return days is not None
    return fact.when is not None and not today.is_future(fact.when) and today.now - fact.when <= timedelta(days=days)


# ------------------------------------------------------------------------------------------------ pregnancy
def _pregnancy(observations: Sequence[Resource], conditions: Sequence[ConditionFact], today: Today) -> Pregnancy:
    """The pregnancy statuses, else the newest standing pregnancy Condition (conditions.toml), with this pregnancy's
    due date, the gestational age and lactation (a status observation, else a lactation Condition)."""
    vocab = vocabulary()["pregnancy"]
    statuses = [(w, r) for r in observations if (w := result_stamp(r)) is not None
                and (has_code(r.get("code"), "loinc", frozenset(vocab["status_loinc"]))
                     or has_code(r.get("code"), "snomed", frozenset(vocab["status_snomed"])))]
    shown = _newest_and_ahead(statuses, today)
    said = tuple(PregnancyStatus(source_of(r, as_written(result_time(r)), today), _answer(r, vocab),
                                 f"{text_of(r.get('code')) or 'pregnancy status'}: {value_of(r)}", w) for w, r in shown)
    condition = None
    pregnant = next((c for c in conditions if c.group == "pregnancy"), None)  # the newest dated; undated only alone
    if not said and pregnant is not None:
        condition = PregnancyStatus(pregnant.source, "pregnant", f"active condition: {pregnant.said}", pregnant.when)
    newest = said[0] if said else condition
    due = _due_date(observations, vocab, today)
    if due is not None and (newest is None or newest.when is None
                            or due[0] < newest.when - timedelta(weeks=vocab["current_weeks"])):
        due = None  # an earlier pregnancy's
    current, lapsed = _currency(newest, due[0] if due else None, today, vocab)
    if condition is not None and pregnant is not None and pregnant.ended:
        current, lapsed = False, f"past pregnancy, {pregnant.ended}"
    lactation = _newest_and_ahead([(w, r) for r in observations if (w := result_stamp(r)) is not None
                                   and value_of(r) and _lactation_code(r, vocab)], today)
    lactating = next((c for c in conditions if c.group == "lactation"), None)
    gestation = _newest_and_ahead([(w, r) for r in observations if (w := result_stamp(r)) is not None
                                   and value_of(r) and has_code(r.get("code"), "loinc",
                                                                frozenset(vocab["gestational_age_loinc"]))], today)
    return Pregnancy(said, condition, (due[1], due[2]) if due else None,
                     value_of(gestation[0][1]) if gestation else "",
                     (source_of(lactation[0][1], as_written(result_time(lactation[0][1])), today),
                      value_of(lactation[0][1])) if lactation
                     else (lactating.source, lactating.said) if lactating is not None else None, current, lapsed)


def _lactation_code(r: Resource, vocab: Mapping[str, Any]) -> bool:
    return has_code(r.get("code"), "loinc", frozenset(vocab["lactation_loinc"])) or has_code(
        r.get("code"), "snomed", frozenset(vocab["lactation_snomed"]))


def _newest_and_ahead(found: Sequence[tuple[datetime, Resource]], today: Today) -> list[tuple[datetime, Resource]]:
    """The newest by a trustworthy date, then the newest dated in the future when that is another one."""
    if not found:
        return []
    newest = max(found, key=lambda item: today.rank(item[0]))
    ahead = max((item for item in found if today.is_future(item[0])), key=lambda item: item[0], default=None)
    return [newest] if ahead is None or ahead[1] is newest[1] else [newest, ahead]


def _answer(r: Resource, vocab: Mapping[str, Any]) -> str:
    value = r.get("valueCodeableConcept")
    if has_code(value, "", frozenset(vocab["not_pregnant_answers"])):
        return "not pregnant"
    if has_code(value, "", frozenset(vocab["pregnant_answers"])) or _PREGNANT_WORDS.match(value_of(r)):
        return "pregnant"
    return value_of(r) or "not stated"


def _due_date(observations: Sequence[Resource], vocab: Mapping[str, Any],
              today: Today) -> tuple[datetime, Source, str] | None:
    """The newest recorded due date, by when it was recorded (a recording dated in the future last); the due date
    itself lies ahead by nature and is never flagged."""
    found = [(stamp, written, r) for r in observations
             if has_code(r.get("code"), "loinc", frozenset(vocab["due_date_loinc"]))
             and (stamp := partial_timestamp(written := as_written(r.get("valueDateTime")))) is not None]
    if not found:
        return None
    stamp, written, r = max(found, key=lambda item: (not today.is_future(result_stamp(item[2])),
                                                     result_stamp(item[2]) or item[0], item[0]))
    return stamp, source_of(r, as_written(result_time(r)), today), written


def _currency(newest: PregnancyStatus | None, due: datetime | None, today: Today,
              vocab: Mapping[str, Any]) -> tuple[bool, str]:
    """(current, why not) for the newest status: a "pregnant" one is current until `post_term_weeks` after this
    pregnancy's due date, or, with none recorded, for `current_weeks` after it was recorded."""
    if newest is None or newest.answer != "pregnant":
        return False, ""
    if newest.when is None:
        return False, "recorded without a date: whether it is current is not known"
    if due is not None:
        if today.now <= due + timedelta(weeks=vocab["post_term_weeks"]):
            return True, ""
        return False, f"past pregnancy, its due date lies more than {vocab['post_term_weeks']} weeks in the past"
    if today.now - newest.when <= timedelta(weeks=vocab["current_weeks"]):
        return True, ""
    return False, f"past pregnancy, recorded more than {vocab['current_weeks']} weeks ago"
