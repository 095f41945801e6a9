"""What a CDS card may cite from a chart: its allergies, its newest renal results, a current pregnancy, and the
critical results of the last hours.

The facts are the chart reader's (records.fhir.chart_facts: the same `ChartFacts` the face sheet renders), so
a card and the context of the same chart say the same thing; this module adds what only a card needs: the drug
vocabulary's identity of each allergy, the record fragment that holds each cited resource, and the results that
ebmrag's critical limits (rules/evidence/critical_values.toml) call critical beside the laboratory's own flags.

"Newest" is by a trustworthy date: a result or status dated after the present (the hook's `now`, with the default
skew of records.dates) never outranks today's, so a mistyped year cannot replace today's creatinine or take back a
pregnancy; it is cited flagged (`Cited.future`) beside what was picked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ebmrag.ehr.compartment import belongs_to
from ebmrag.errors import RecordError
from ebmrag.evidence.result_tables import unit_key
from ebmrag.evidence.results import load_vocabulary
from ebmrag.records.dates import Today, shown_date
from ebmrag.records.fhir.bundle import read_fhir_bundle
from ebmrag.records.fhir.chart_facts import (
    NOT_RESULTS,
    RENAL,
    Allergy,
    ChartFacts,
    LabResult,
    Source,
    lab_result,
    read_facts,
    result_stamp,
)
from ebmrag.records.fhir.coding import codings, obj, objects
from ebmrag.records.fhir.index import Resource, reference_of, type_id
from ebmrag.records.fhir.results import value_of
from ebmrag.records.fragment import PatientRecord
from ebmrag.vocab.drugs import DrugVocabulary, Identity

log = logging.getLogger(__name__)

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
    """A standing allergy entry of the chart (`entry`: substance, reactions, severity, statuses, as the chart reader
    read it), cited, with what the drug vocabulary makes of its substance."""

    cited: Cited
    identity: Identity
    entry: Allergy

    @property
    def current(self) -> bool:
        return self.entry.current


@dataclass(frozen=True)
class LabFact:
    """A result as the chart reader read it (`result`), cited; `critical`: why it is critical (the laboratory's flag,
    or a limit of ebmrag's rules) or ""."""

    cited: Cited
    result: LabResult
    critical: str = ""

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
        self._facts: dict[datetime, ChartFacts] = {}
        self.record, facts = _read(self.resources, Today.wall_clock())
        self._facts[facts.today.now] = facts
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

    def facts(self, now: datetime | None = None) -> ChartFacts:
        """The chart reader's facts of these resources read at `now` (default: the wall clock), once per `now`:
        the very facts the face sheet of the chart read at that moment renders."""
        today = Today(now) if now is not None else Today.wall_clock()
        if today.now not in self._facts:
            self._facts[today.now] = _read(self.resources, today)[1]
        return self._facts[today.now]

    def cited(self, source: Source) -> Cited:
        """A card's citation of a fact's source: with the record fragment that holds the resource (or its panel)."""
        fragment = self._fragments.get(source.reference) or self._fragments.get(
            self._panel_of.get(source.reference, ""), "")
        return Cited(source.kind, source.reference, source.date, fragment if source.reference else "", source.future)


def _belongs(resource: Resource, patient_id: str, fhir_base: str) -> bool:
    """The context's patient's resource, or a shared one that names no patient (a Medication, an Organization)."""
    return belongs_to(resource, patient_id, fhir_base) is not False


def _read(resources: Sequence[Resource], today: Today) -> tuple[PatientRecord | None, ChartFacts]:
    """The record (for the fragment ids a card cites) and the facts of the chart, by the chart reader."""
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}
    try:
        return read_fhir_bundle(bundle, "CDS Hooks chart", today=today)
    except RecordError as exc:  # no resource could be read: the cards cite resources only
        log.debug("the hook's chart gave no record: %s", type(exc).__name__)
        return None, read_facts(resources, today)


# ------------------------------------------------------------------------------------------------ allergies
def allergy_facts(chart: Chart, vocabulary: DrugVocabulary, now: datetime | None = None) -> list[AllergyFact]:
    """The chart's standing allergies and intolerances (records.fhir.chart_facts: not refuted or entered in error,
    not a statement of absence) that do not take themselves back in words ("not allergic to penicillin"), each with
    the drug vocabulary's identity of its substance. One dated after `now` (default: the wall clock) still counts,
    its date flagged: an allergy is never dropped for its date."""
    return [AllergyFact(chart.cited(allergy.source), vocabulary.identify(allergy.named_by), allergy)
            for allergy in chart.facts(now).allergies]


# ------------------------------------------------------------------------------------------------ results
def _lab_fact(chart: Chart, result: LabResult, critical: str = "") -> LabFact:
    """The result as a card shows it; `critical`: why ebmrag's rules call it critical, unless the laboratory did."""
    if result.flagged_critical:  # the laboratory's own call first
        critical = f"flagged {result.flags or 'critical'} by the laboratory"
    return LabFact(chart.cited(result.source), result, critical)


def renal_facts(chart: Chart, now: datetime | None = None) -> list[LabFact]:
    """The newest creatinine, eGFR and creatinine clearance as the chart reader picks them for the face sheet
    (records.fhir.chart_facts), in that order; after them, flagged, the newest of each dated after `now` (default:
    the wall clock) when that is not the one picked: a mistyped year is shown, never trusted."""
    labs = chart.facts(now).labs
    picked = [labs[name] for name in RENAL if name in labs]
    return [_lab_fact(chart, r) for r in [found[0] for found in picked] + [r for found in picked for r in found[1:]]]


def beyond_limit(r: Resource) -> str:
    """Why the value is critical by ebmrag's critical-value rules, or "": the result's LOINC code names the
    analyte, its unit is one the analyte is written in, and the value (converted, to three significant digits)
    is at or beyond a limit. A value written "<x" can only be critically low, ">x" only critically high."""
    critical = load_vocabulary().critical  # LOINC code -> an analyte with a critical limit
    analyte = next((a for _, code, _ in codings(r.get("code")) if (a := critical.get(code))), None)
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
    today = Today(now)
    found = []
    for r in chart.of_type("Observation"):
        when = result_stamp(r)
        if (r.get("status") in NOT_RESULTS or not re.search(r"\d", value_of(r)) or when is None
                or not now - timedelta(hours=hours) <= when <= now + timedelta(minutes=15)):
            continue
        fact = _lab_fact(chart, lab_result(r, "", today), beyond_limit(r))
        if fact.critical:
            found.append(fact)
    return sorted(found, key=lambda f: f.result.when or now, reverse=True)


# ------------------------------------------------------------------------------------------------ pregnancy
def pregnancy_fact(chart: Chart, now: datetime) -> PregnancyFact | None:
    """A current pregnancy as the chart reader reads it (records.fhir.chart_facts, the face sheet's reading): the
    newest pregnancy status says pregnant and is recent, or, with no status recorded, an active pregnancy Condition
    that is not refuted is. None otherwise: a newer "not pregnant" wins, unless it is dated after `now`: a mistyped
    year never takes a pregnancy back (it is cited on the card, flagged)."""
    pregnancy = chart.facts(now).pregnancy
    newest = pregnancy.newest
    if newest is None or not pregnancy.current:
        return None
    due = pregnancy.due_date
    ahead = pregnancy.statuses[1] if len(pregnancy.statuses) > 1 else None
    return PregnancyFact(chart.cited(newest.source), newest.said, due[1] if due else "",
                         chart.cited(due[0]) if due else None,
                         (chart.cited(ahead.source), ahead.said) if ahead is not None else None)
