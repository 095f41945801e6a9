"""What a CDS card may cite from a chart: its allergies, its newest renal results, a current pregnancy, and the
critical results of the last hours.

Each fact keeps where it came from (resource type and id, the date as written) and the chart's own words, so a
card states what the chart says and names its source; nothing is derived that the chart does not hold (no eGFR
from a creatinine, no dose). The chart is the prefetched or fetched resources of one patient, read leniently
as the face sheet reads them: the LOINC codes of renal function and pregnancy are the face sheet's
(records/vocab/drug_facts.toml), the critical limits the evidence rules' (evidence/rules/critical_values.toml)
beside the laboratory's own critical flags (HL7 interpretation HH, LL, AA). The `Chart` also reads the same
resources into a `PatientRecord`, so a card can name the record fragment that holds each cited resource.

"Newest" is by a trustworthy date: a result or status dated after the present (the hook's `now`, with the default
skew of records.dates) never outranks today's, so a mistyped year cannot replace today's creatinine or take back a
pregnancy; it is cited flagged (`Cited.future`) beside what was picked.
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.ehr.compartment import belongs_to
from ebmrag.ehr.drugs import DrugVocabulary, Identity
from ebmrag.errors import ConfigError, RecordError
from ebmrag.evidence import adr
from ebmrag.evidence.results import Analyte, load_vocabulary, unit_key
from ebmrag.records.dates import Today, as_written, partial_timestamp, shown_date
from ebmrag.records.fhir import facts
from ebmrag.records.fhir.bundle import record_from_fhir_bundle
from ebmrag.records.fhir.coding import codings, concepts, has_code, obj, objects, states_absence, text_of
from ebmrag.records.fhir.index import Resource, reference_of, type_id
from ebmrag.records.fhir.rendered import status_code
from ebmrag.records.fhir.results import value_of
from ebmrag.records.fragment import PatientRecord

log = logging.getLogger(__name__)

DRUG_FACTS = Path(facts.__file__).resolve().parent.parent / "vocab" / "drug_facts.toml"
ALLERGY_STATEMENTS = Path(__file__).parent / "data" / "allergy_statements.toml"  # an entry taking itself back
RENAL_FACTS = ("creatinine", "eGFR", "creatinine clearance")  # names of drug_facts.toml's renal [[fact]]s
PREGNANCY_WEEKS = 42  # a pregnancy recorded longer ago than this, with no due date, is not taken as current
POST_TERM = timedelta(weeks=2)  # a due date further in the past than this ends the pregnancy
_RETRACTED = {"refuted", "entered-in-error"}
_NOT_RESULTS = ("entered-in-error", "cancelled")  # a tuple: a malformed status may be unhashable
_CRITICAL_CODES = {"HH", "LL", "AA"}
_ABNORMAL_CODES = {"H", "L", "A", "HU", "LU", "H>", "L<", ">", "<"} | _CRITICAL_CODES
_CODE_WORDS = {"H": "high", "L": "low", "A": "abnormal", "HH": "critically high", "LL": "critically low",
               "AA": "critically abnormal", "HU": "significantly high", "LU": "significantly low", "N": "normal"}
_CRITICAL_WORDS = re.compile(r"(?<!non-)(?<!non )(?<!not )(?<!no )\b(critical|panic)", re.IGNORECASE)
_ABNORMAL_WORDS = re.compile(r"\b(high|low|abnormal|elevated|decreased|raised|critical|panic)\b", re.IGNORECASE)
_PREGNANT_WORDS = re.compile(r"^\s*(currently )?pregnant\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Cited:
    """Where a fact is in the chart: `reference` ("AllergyIntolerance/a1", "" for a resource without id) and
    its date as written; `fragment`: the record fragment that holds it ("" when the record has none)."""

    kind: str
    reference: str
    date: str
    fragment: str = ""
    future: bool = False  # dated after the present: shown flagged, never taken as the newest

    @property
    def label(self) -> str:
        return self.reference or f"{self.kind} (without id)"

    @property
    def shown_date(self) -> str:
        """The date as written, or flagged ("date in the future: 2062-03-01")."""
        return shown_date(self.date, self.future)


@dataclass(frozen=True)
class AllergyFact:
    cited: Cited
    identity: Identity
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
class LabFact:
    cited: Cited
    name: str  # "creatinine" (the vocabulary's name), else the chart's test name
    test: str  # the chart's own name of the test
    value: str  # "1.51 mg/dL", as written
    when: datetime | None
    time: str  # when, as written ("2024-05-01T09:30:00+02:00")
    flags: str  # the laboratory's interpretation in words ("high", "critically low") or ""
    reference_range: str  # as written, or ""
    abnormal: bool  # the laboratory flags it outside its range
    critical: str  # why it is critical ("flagged critically high by the laboratory", ...) or ""

    @property
    def future(self) -> bool:
        return self.cited.future


@dataclass(frozen=True)
class PregnancyFact:
    cited: Cited
    said: str  # "pregnancy status: Pregnant" / "active condition: Pregnancy"
    due_date: str  # as written, or ""
    due_cited: Cited | None
    ahead: tuple[Cited, str] | None = None  # a newer status dated in the future (not taken as current), its words


class Chart:
    """One patient's resources as a hook call sees them: only this patient's, by the pull's own compartment rule
    (ehr.compartment), read once into a record for the fragment ids a card cites. A resource that does not name
    the context's patient by reference on the hook's FHIR server (another patient, an identifier or a display
    only, another server, no one) is left out and counted by type in `left_out`: the cards say what was left out
    rather than claim the chart lacks what it may hold."""

    def __init__(self, patient_id: str, resources: Iterable[Resource], fhir_base: str = "") -> None:
        self.patient_id = patient_id
        kept: list[Resource] = []
        self.left_out: dict[str, int] = {}  # resource type -> how many were left out
        for r in resources:
            if _belongs(r, patient_id, fhir_base):
                kept.append(r)
            else:
                kind = r.get("resourceType")
                kind = kind if isinstance(kind, str) and len(kind) <= 64 else "Resource"
                self.left_out[kind] = self.left_out.get(kind, 0) + 1
        self.resources = tuple(kept)
        self.record = _record(self.resources)
        self._fragments: dict[str, str] = {}
        for fragment in self.record.fragments if self.record is not None else ():
            self._fragments.setdefault(re.split(r"[#~]", fragment.id, maxsplit=1)[0], fragment.id)
        named = {str(r["id"]): f"{r.get('resourceType')}/{r['id']}" for r in self.resources
                 if isinstance(r.get("id"), str)}  # "urn:uuid:<id>" links name resources by id alone
        self._panel_of = {type_id(link) or named.get(link.rsplit(":", 1)[-1], ""): f"{r['resourceType']}/{r['id']}"
                          for r in self.resources if isinstance(r.get("id"), str)
                          for link in map(reference_of, objects(r.get("result")) + objects(r.get("hasMember")))}

    def cite(self, resource: Resource, date: str, future: bool = False) -> Cited:
        kind = str(resource.get("resourceType") or "Resource")
        rid = resource.get("id")
        reference = f"{kind}/{rid}" if isinstance(rid, str) and rid else ""
        fragment = self._fragments.get(reference) or self._fragments.get(self._panel_of.get(reference, ""), "")
        return Cited(kind, reference, date, fragment if reference else "", future)

    def of_type(self, *kinds: str) -> list[Resource]:
        return [r for r in self.resources if r.get("resourceType") in kinds]


def _belongs(resource: Resource, patient_id: str, fhir_base: str) -> bool:
    """The context's patient's resource, or a shared one that names no patient (a Medication, an Organization)."""
    return belongs_to(resource, patient_id, fhir_base) is not False


def _record(resources: Sequence[Resource]) -> PatientRecord | None:
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}
    try:
        return record_from_fhir_bundle(bundle, "CDS Hooks chart")
    except RecordError as exc:  # no resource could be read: the cards cite resources only
        log.debug("the hook's chart gave no record: %s", type(exc).__name__)
        return None


# ------------------------------------------------------------------------------------------------ allergies
def allergy_facts(chart: Chart, vocabulary: DrugVocabulary, now: datetime | None = None) -> list[AllergyFact]:
    """The chart's allergies and intolerances that may be compared with an order: not refuted or entered in
    error, and not a statement of absence ("no known allergy"). One dated after `now` (default: the wall clock)
    still counts, its date flagged: an allergy is never dropped for its date."""
    today = _today(now)
    found = []
    for r in chart.of_type("AllergyIntolerance"):
        verification = _status(r.get("verificationStatus"))
        if verification in _RETRACTED or states_absence(r.get("code"), "allergy") or _taken_back(r):
            continue
        reactions = objects(r.get("reaction"))
        substances = [r.get("code"), r.get("substance"), *(x.get("substance") for x in reactions)]
        substance = next((t for s in substances if (t := text_of(s))), "")
        manifestations = tuple(dict.fromkeys(t for x in reactions for m in concepts(x.get("manifestation"))
                                             if (t := text_of(m) or text_of(obj(m).get("concept")))))
        severities = [str(x.get("severity")) for x in reactions if x.get("severity") in _SEVERITY]
        date = as_written(r.get("onsetDateTime")) or as_written(r.get("recordedDate")) or next(
            (as_written(x.get("onset")) for x in reactions if as_written(x.get("onset"))), "")
        found.append(AllergyFact(
            chart.cite(r, date, today.is_future(partial_timestamp(date))), vocabulary.identify(s for s in substances
                                                                                               if s),
            substance, manifestations,
            max(severities, key=_SEVERITY.index, default=""),
            str(r.get("criticality")) if isinstance(r.get("criticality"), str) else "",
            _status(r.get("clinicalStatus")), verification))
    return found


@cache
def _statements() -> tuple[re.Pattern[str], list[tuple[str, re.Pattern[str]]]]:
    """(an entry's words taking the allergy back, [(status code, its words)]): ehr/data/allergy_statements.toml,
    with the ADR rules' negation and tolerance cues."""
    with open(ALLERGY_STATEMENTS, "rb") as handle:
        raw = tomllib.load(handle)
    cues = adr.vocabulary()
    taken_back = "|".join([cues.negation.pattern, cues.tolerated.pattern, *raw["retracted"]])
    words = [(code, re.compile(pattern, re.IGNORECASE)) for code, pattern in raw["status_words"].items()]
    return re.compile(taken_back, re.IGNORECASE), words


def _status(concept: Any) -> str:
    """A status's code, or the code its text spells out ("Entered in Error") when it has none."""
    code = status_code(concept)
    if code:
        return code
    text = text_of(concept)
    return next((name for name, words in _statements()[1] if words.search(text)), "") if text else ""


def _taken_back(r: Resource) -> bool:
    """The entry's substance or code text says the allergy is not there ("not allergic to penicillin", "penicillin
    allergy delabelled after oral challenge"): its own words, not its notes or reactions."""
    texts = [text_of(r.get("code")), text_of(r.get("substance"))]
    return any(_statements()[0].search(t) for t in texts if t)


_SEVERITY = ["mild", "moderate", "severe"]


# ------------------------------------------------------------------------------------------------ results
@cache
def _drug_facts() -> dict[str, Any]:
    with open(DRUG_FACTS, "rb") as handle:
        raw = tomllib.load(handle)
    named = {fact["name"]: fact for fact in raw["fact"]}
    missing = [name for name in RENAL_FACTS if name not in named]
    if missing:
        raise ConfigError(f"{DRUG_FACTS}: has no [[fact]] named {missing}")
    return raw


def _when(r: Resource) -> datetime | None:
    return partial_timestamp(_raw_time(r))


def _today(now: datetime | None) -> Today:
    return Today(now) if now is not None else Today.wall_clock()


def _raw_time(r: Resource) -> Any:
    return (r.get("effectiveDateTime") or obj(r.get("effectivePeriod")).get("start") or r.get("effectiveInstant")
            or r.get("issued"))


def _results(chart: Chart) -> list[Resource]:
    return [r for r in chart.of_type("Observation") if r.get("status") not in _NOT_RESULTS
            and re.search(r"\d", value_of(r))]


def _interpretation(r: Resource) -> tuple[str, set[str]]:
    """The laboratory's flags in words (its own display, else the HL7 code's meaning) and their codes."""
    words, codes = [], set()
    for concept in concepts(r.get("interpretation")):
        code = status_code(concept).upper()
        codes.add(code)
        named = bool(concept.get("text")) or any(display for _, _, display in codings(concept))
        words.append(text_of(concept) if named else _CODE_WORDS.get(code, code))
    return ", ".join(w for w in words if w), codes


def _lab_fact(chart: Chart, r: Resource, name: str, critical: str = "", future: bool = False) -> LabFact:
    """The result as a card shows it; `critical`: why ebmrag's rules call it critical, unless the laboratory did;
    `future`: dated after the present."""
    flags, codes = _interpretation(r)
    abnormal = bool(codes & _ABNORMAL_CODES) or bool(_ABNORMAL_WORDS.search(flags))
    if codes & _CRITICAL_CODES or _CRITICAL_WORDS.search(flags):  # the laboratory's own call first
        critical = f"flagged {flags or 'critical'} by the laboratory"
    ranges = "; ".join(str(rr.get("text") or "-".join(v for v in (value_of({"valueQuantity": rr.get(k)})
                                                                    for k in ("low", "high")) if v))
                       for rr in objects(r.get("referenceRange")))
    test = text_of(r.get("code")) or name
    raw = _raw_time(r)
    return LabFact(chart.cite(r, as_written(raw), future), name or test, test, value_of(r), _when(r),
                   raw.strip()[:40] if isinstance(raw, str) else "", flags, ranges, abnormal, critical)


def renal_facts(chart: Chart, now: datetime | None = None) -> list[LabFact]:
    """The newest creatinine, eGFR and creatinine clearance, each by LOINC code (by name when the result has no
    LOINC coding), in that order, as the face sheet picks them: of two results of one time, the one the
    vocabulary's `prefer` names (the CKD-EPI eGFR), else the first; an undated result is never "newest", nor is
    one dated after `now` (default: the wall clock) while one of another date exists. After them, flagged, the
    newest of each dated after `now`, when that is not the one picked: a mistyped year is shown, never trusted."""
    today = _today(now)
    vocab = [fact for fact in _drug_facts()["fact"] if fact["name"] in RENAL_FACTS]
    newest: dict[str, tuple[tuple[bool, datetime, bool], Resource]] = {}
    ahead: dict[str, tuple[tuple[bool, datetime, bool], Resource]] = {}
    for r in _results(chart):
        when = _when(r)
        if when is None:
            continue
        loinc = {code for system, code, _ in codings(r.get("code")) if "loinc" in system}
        name = text_of(r.get("code"))
        fact = next((f for f in vocab if loinc & set(f["loinc"])
                     or (not loinc and re.search(f["display"], name, re.IGNORECASE))), None)
        if fact is None:
            continue
        preferred = bool(fact.get("prefer")) and bool(re.search(fact["prefer"], " ".join([name, *sorted(loinc)]),
                                                                re.IGNORECASE))
        rank = (*today.rank(when), preferred)
        for chosen in (newest, ahead) if today.is_future(when) else (newest,):
            if fact["name"] not in chosen or rank > chosen[fact["name"]][0]:
                chosen[fact["name"]] = (rank, r)
    found = [(name, newest[name]) for name in RENAL_FACTS if name in newest]
    found += [(name, ahead[name]) for name in RENAL_FACTS if name in ahead and ahead[name][1] is not newest[name][1]]
    return [_lab_fact(chart, r, name, future=not trusted) for name, ((trusted, _, _), r) in found]


@cache
def _critical_analytes() -> dict[str, Analyte]:
    """LOINC code -> the analyte of evidence/rules/analytes.toml that has a critical limit."""
    return {code: a for a in load_vocabulary().analytes.values()
            if a.critical_low is not None or a.critical_high is not None for code in a.loinc}


def beyond_limit(r: Resource) -> str:
    """Why the value is critical by ebmrag's critical-value rules, or "": the result's LOINC code names the
    analyte, its unit is one the analyte is written in, and the value (converted, to three significant digits)
    is at or beyond a limit. A value written "<x" can only be critically low, ">x" only critically high."""
    analyte = next((a for _, code, _ in codings(r.get("code")) if (a := _critical_analytes().get(code))), None)
    quantity = obj(r.get("valueQuantity"))
    value = quantity.get("value")
    if analyte is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    written = [u for u in (quantity.get("unit"), quantity.get("code")) if isinstance(u, str)] or [""]  # INR, pH
    unit = next((analyte.units[unit_key(u)] for u in written if unit_key(u) in analyte.units), None)
    if unit is None:  # a unit the analyte is not written in: not compared
        return ""
    compared = float(f"{unit.canonical(float(value)):.3g}")
    comparator = str(quantity.get("comparator") or "")
    shown = f" {analyte.unit}" if analyte.unit else ""
    if analyte.critical_high is not None and compared >= analyte.critical_high and "<" not in comparator:
        return f"at or above the critical limit {analyte.critical_high:g}{shown} of ebmrag's rules"
    if analyte.critical_low is not None and compared <= analyte.critical_low and ">" not in comparator:
        return f"at or below the critical limit {analyte.critical_low:g}{shown} of ebmrag's rules"
    return ""


def critical_facts(chart: Chart, now: datetime, hours: float) -> list[LabFact]:
    """Results of the `hours` before `now` (a quarter of an hour ahead allowed for clocks) that the laboratory
    flags critical or that are beyond a critical limit of ebmrag's rules, newest first."""
    found = []
    for r in _results(chart):
        when = _when(r)
        if when is None or not now - timedelta(hours=hours) <= when <= now + timedelta(minutes=15):
            continue
        fact = _lab_fact(chart, r, "", beyond_limit(r))
        if fact.critical:
            found.append(fact)
    return sorted(found, key=lambda f: f.when or now, reverse=True)


# ------------------------------------------------------------------------------------------------ pregnancy
def pregnancy_fact(chart: Chart, now: datetime) -> PregnancyFact | None:
    """A current pregnancy the chart records: the newest pregnancy status says pregnant (by answer code, or in so
    many words) and is recent (within `PREGNANCY_WEEKS`, or its due date not more than `POST_TERM` past); or, with
    no status recorded, an active pregnancy Condition as recent. None otherwise: a newer "not pregnant" wins, unless
    it is dated after `now`: a mistyped year never takes a pregnancy back (it is cited on the card, flagged)."""
    today = Today(now)
    vocab = _drug_facts()["pregnancy"]
    statuses = [(w, r) for r in chart.of_type("Observation") if r.get("status") not in _NOT_RESULTS
                and (w := _when(r)) is not None
                and (has_code(r.get("code"), "loinc", frozenset(vocab["status_loinc"]))
                     or has_code(r.get("code"), "snomed", frozenset(vocab["status_snomed"])))]
    due = _due_date(chart, vocab, today)
    if statuses:
        when, status = max(statuses, key=lambda item: today.rank(item[0]))
        if not _says_pregnant(status, vocab):
            return None
        cited = chart.cite(status, as_written(_raw_time(status)), today.is_future(when))
        fact = _if_current(cited, _status_words(status), when, due, chart, now)
        later = max(((w, r) for w, r in statuses if today.is_future(w) and r is not status),
                    key=lambda item: item[0], default=None)
        if fact is None or later is None:
            return fact
        return replace(fact, ahead=(chart.cite(later[1], as_written(_raw_time(later[1])), True),
                                    _status_words(later[1])))
    conditions = [(w, r) for r in chart.of_type("Condition")
                  if has_code(r.get("code"), "snomed", frozenset(vocab["pregnant_conditions"]))
                  and status_code(r.get("clinicalStatus")) in ("", "active")
                  and status_code(r.get("verificationStatus")) not in _RETRACTED
                  and (w := partial_timestamp(r.get("onsetDateTime") or r.get("recordedDate"))) is not None]
    if not conditions:
        return None
    when, condition = max(conditions, key=lambda item: today.rank(item[0]))
    said = f"active condition: {text_of(condition.get('code'))}"
    date = as_written(condition.get("onsetDateTime") or condition.get("recordedDate"))
    return _if_current(chart.cite(condition, date, today.is_future(when)), said, when, due, chart, now)


def _status_words(status: Resource) -> str:
    return f"{text_of(status.get('code')) or 'pregnancy status'}: {value_of(status)}"


def _says_pregnant(status: Resource, vocab: Mapping[str, Any]) -> bool:
    value = status.get("valueCodeableConcept")
    if has_code(value, "", frozenset(vocab["not_pregnant_answers"])):
        return False
    return has_code(value, "", frozenset(vocab["pregnant_answers"])) or bool(_PREGNANT_WORDS.match(value_of(status)))


def _due_date(chart: Chart, vocab: Mapping[str, Any], today: Today) -> tuple[datetime, str, Resource] | None:
    """The newest recorded due date, by when it was recorded (a recording dated in the future last); the due date
    itself lies ahead by nature and is never flagged."""
    found = [(stamp, written, r) for r in chart.of_type("Observation") if r.get("status") not in _NOT_RESULTS
             and has_code(r.get("code"), "loinc", frozenset(vocab["due_date_loinc"]))
             and (stamp := partial_timestamp(written := as_written(r.get("valueDateTime")))) is not None]
    return max(found, key=lambda item: (not today.is_future(_when(item[2])), _when(item[2]) or item[0], item[0])
               ) if found else None


def _if_current(cited: Cited, said: str, when: datetime, due: tuple[datetime, str, Resource] | None, chart: Chart,
                now: datetime) -> PregnancyFact | None:
    if due is not None and due[0] >= when - timedelta(weeks=PREGNANCY_WEEKS):  # this pregnancy's due date
        current = now <= due[0] + POST_TERM
    else:
        due, current = None, now - when <= timedelta(weeks=PREGNANCY_WEEKS)
    if not current:
        return None
    due_cited = chart.cite(due[2], as_written(_raw_time(due[2])), Today(now).is_future(_when(due[2]))
                           ) if due is not None else None
    return PregnancyFact(cited, said, due[1] if due is not None else "", due_cited)
