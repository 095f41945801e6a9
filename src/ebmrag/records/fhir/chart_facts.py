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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ebmrag.records.dates import Today, as_written, partial_timestamp, shown_date
from ebmrag.records.fhir.coding import codings, concepts, has_code, obj, objects, states_absence, text_of
from ebmrag.records.fhir.index import Resource
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
    missing = [name for name in RENAL if name not in {fact.get("name") for fact in raw.get("fact", [])}]
    if missing or "pregnancy" not in raw:
        raise ValueError(f"needs [[fact]]s named {list(RENAL)} and a [pregnancy] table")
    compiled: dict[str, Any] = {"pregnancy": dict(raw["pregnancy"])}
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
    active pregnancy Condition that is not refuted. `current`: whether the newest of these says pregnant and is
    recent (the [pregnancy] rule of drug_facts.toml); `lapsed`: why one that says pregnant is not current."""

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
class ChartFacts:
    """The facts of one chart read at `today`; `labs` (drug_facts.toml [[fact]]) and `other_labs` ([[other]]): per
    vocabulary name, the newest result, and after it the newest dated in the future, flagged."""

    today: Today
    allergies: tuple[Allergy, ...]
    pregnancy: Pregnancy
    labs: Mapping[str, tuple[LabResult, ...]]
    other_labs: Mapping[str, tuple[LabResult, ...]]
    medications: Medications


def read_facts(resources: Iterable[Resource], today: Today, medications: Medications = Medications()) -> ChartFacts:
    """The facts of one patient's resources (the caller keeps them to this patient: the reader's compartment);
    `medications`: the reader's reconciliation, which needs the whole chart's index (records.fhir.bundle)."""
    kept = [r for r in resources if isinstance(r, Mapping)]
    observations = [r for r in kept if r.get("resourceType") == "Observation" and r.get("status") not in NOT_RESULTS]
    results = [r for r in observations if re.search(r"\d", value_of(r))]
    allergies = tuple(_allergy(r, today) for r in kept if r.get("resourceType") == "AllergyIntolerance"
                      and allergy_stands(r))
    conditions = [r for r in kept if r.get("resourceType") == "Condition"]
    return ChartFacts(today, allergies, _pregnancy(observations, conditions, today),
                      _labs(results, today, "fact"), _labs(results, today, "other"), medications)


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
    return {name: tuple(lab_result(r, name, today) for r in [first, *([ahead[name][1]] if name in ahead
                                                                       and ahead[name][1] is not first else [])])
            for name, (_, first) in newest.items()}


# ------------------------------------------------------------------------------------------------ pregnancy
def _pregnancy(observations: Sequence[Resource], conditions: Sequence[Resource], today: Today) -> Pregnancy:
    vocab = vocabulary()["pregnancy"]
    statuses = [(w, r) for r in observations if (w := result_stamp(r)) is not None
                and (has_code(r.get("code"), "loinc", frozenset(vocab["status_loinc"]))
                     or has_code(r.get("code"), "snomed", frozenset(vocab["status_snomed"])))]
    shown = _newest_and_ahead(statuses, today)
    said = tuple(PregnancyStatus(source_of(r, as_written(result_time(r)), today), _answer(r, vocab),
                                 f"{text_of(r.get('code')) or 'pregnancy status'}: {value_of(r)}", w) for w, r in shown)
    condition = None
    if not said:
        active = [(partial_timestamp(r.get("onsetDateTime") or r.get("recordedDate")), r) for r in conditions
                  if has_code(r.get("code"), "snomed", frozenset(vocab["pregnant_conditions"]))
                  and status_of(r.get("clinicalStatus")) in ("", "active")
                  and status_of(r.get("verificationStatus")) not in RETRACTED]
        if active:  # the newest dated one; an undated one only when none is dated
            when, r = max(active, key=lambda item: (item[0] is not None, *today.rank(item[0] or _UNDATED)))
            condition = PregnancyStatus(source_of(r, as_written(r.get("onsetDateTime") or r.get("recordedDate")),
                                                  today), "pregnant", f"active condition: {text_of(r.get('code'))}",
                                        when)
    newest = said[0] if said else condition
    due = _due_date(observations, vocab, today)
    if due is not None and (newest is None or newest.when is None
                            or due[0] < newest.when - timedelta(weeks=vocab["current_weeks"])):
        due = None  # an earlier pregnancy's
    current, lapsed = _currency(newest, due[0] if due else None, today, vocab)
    lactation = _newest_and_ahead([(w, r) for r in observations if (w := result_stamp(r)) is not None
                                   and value_of(r) and has_code(r.get("code"), "loinc",
                                                                frozenset(vocab["lactation_loinc"]))], today)
    gestation = _newest_and_ahead([(w, r) for r in observations if (w := result_stamp(r)) is not None
                                   and value_of(r) and has_code(r.get("code"), "loinc",
                                                                frozenset(vocab["gestational_age_loinc"]))], today)
    return Pregnancy(said, condition, (due[1], due[2]) if due else None,
                     value_of(gestation[0][1]) if gestation else "",
                     (source_of(lactation[0][1], as_written(result_time(lactation[0][1])), today),
                      value_of(lactation[0][1])) if lactation else None, current, lapsed)


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
        return False, f"its due date lies more than {vocab['post_term_weeks']} weeks in the past"
    if today.now - newest.when <= timedelta(weeks=vocab["current_weeks"]):
        return True, ""
    return False, f"recorded more than {vocab['current_weeks']} weeks ago"
