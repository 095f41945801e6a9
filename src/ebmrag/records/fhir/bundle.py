"""A FHIR R4/R4B chart -> one patient's fragments, read leniently, one resource at a time.

Real exports break the base specification everywhere (a missing status, a reaction without a
manifestation, a year-only date, ids missing, references in three styles), so nothing is validated as a
whole: each resource is read for what it does say, and what could not be read is reported per resource
in `record.skipped` (the trace shows it), never silently and never by refusing the chart. A chart is
refused only when it holds no patient or two patients: one record, one patient. A resource that names a
different patient than the chart's is not read (and its patient is not named in the report).

The flow: index every resource (fhir.index), find the patient, reconcile medications
(fhir.medications), render each clinical resource (fhir.resources), say in one more line of a resource
what its renderer passed over and say whole a type no renderer reads (fhir.coverage, fhir.generic: the
record's `coverage` counts both), read the document's section narratives (fhir.composition), keep exact
duplicate lines once, then build the face sheet (fhir.facts) from the renderers' own lines.

Dates are read against the present (`records.dates.Today`, the wall clock unless the caller gives one): a
resource dated after it is read and shown, flagged (`Fragment.date_in_future`, one defect line in the trace), and
never picked as the newest by the reconciliation, the order of versions or the face sheet.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.records.dates import Today, as_written, partial_timestamp
from ebmrag.records.fhir import coverage, facts, generic
from ebmrag.records.fhir.chart_facts import ChartFacts, Medications, read_facts
from ebmrag.records.fhir.checks import defects
from ebmrag.records.fhir.composition import section_notes
from ebmrag.records.fhir.genomics import observation, report
from ebmrag.records.fhir.index import ChartIndex, Entry, Resource, bundle_entries, reference_of, type_id
from ebmrag.records.fhir.medications import MEDICATION_TYPES, NOT_ACTIVE, current_names, reconcile
from ebmrag.records.fhir.order import canonical_order
from ebmrag.records.fhir.recommendations import detected_issue, risk_assessment, service_request, task
from ebmrag.records.fhir.rendered import Rendered, Skip
from ebmrag.records.fhir.resources import (
    allergy,
    care_plan,
    condition,
    encounter,
    family_history,
    flag,
    goal,
    immunization,
    medication,
    procedure,
    summary_of,
)
from ebmrag.records.fhir.results import document, imaging_study
from ebmrag.records.fragment import Coverage, Fragment, PatientRecord

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER = timedelta(days=730)
# Billing and workflow resources: not clinical evidence; counted in the trace, never packed.
_BILLING = {
    "Claim", "ExplanationOfBenefit", "Coverage", "Provenance", "CareTeam", "SupplyDelivery", "Account", "Invoice",
    "PaymentNotice", "AuditEvent", "Consent", "Group", "Endpoint", "HealthcareService", "MessageHeader",
    "OperationOutcome",
}
# Resources other resources point at: read through those references (a drug's name, an attachment's bytes).
_REFERENCED = {"Organization", "Practitioner", "PractitionerRole", "Location", "Device", "Medication", "RelatedPerson",
               "Specimen", "Substance", "Binary"}
ADMINISTRATIVE = _BILLING | _REFERENCED
Renderer = Callable[[Resource, ChartIndex], Sequence[Rendered] | Skip]
_RENDERERS: dict[str, tuple[Renderer, tuple[str, ...]]] = {
    "AllergyIntolerance": (allergy, ("recordedDate", "onsetDateTime")),
    "Condition": (condition, ("onsetDateTime", "recordedDate")),
    "Observation": (observation, ("effectiveDateTime", "effectivePeriod.start", "issued")),
    "DiagnosticReport": (report, ("effectiveDateTime", "effectivePeriod.start", "issued")),
    "DocumentReference": (document, ("date",)),
    "Procedure": (procedure, ("performedDateTime",)),
    "ImagingStudy": (imaging_study, ("started",)),
    "MedicationRequest": (medication("MedicationRequest"), ("authoredOn",)),
    "MedicationOrder": (medication("MedicationOrder"), ("dateWritten",)),  # DSTU2's MedicationRequest
    "MedicationStatement": (medication("MedicationStatement"), ("effectiveDateTime", "dateAsserted")),
    "MedicationAdministration": (medication("MedicationAdministration"), ("effectiveDateTime",)),
    "Immunization": (immunization, ("occurrenceDateTime",)),
    "CarePlan": (care_plan, ("created",)),
    "Encounter": (encounter, ()),
    "Flag": (flag, ()),
    "FamilyMemberHistory": (family_history, ("date",)),
    "Goal": (goal, ("startDate",)),
    "Task": (task, ("authoredOn", "lastModified")),
    "ServiceRequest": (service_request, ("authoredOn", "occurrenceDateTime")),
    "DetectedIssue": (detected_issue, ("identifiedDateTime", "date")),
    "RiskAssessment": (risk_assessment, ("occurrenceDateTime",)),
}
_UNIDENTIFIED = "Patient/unidentified"  # a Patient without id or fullUrl
_MAX_DEFECT_LINES = 40  # per chart: enough to find the export's habit, not a wall of text
_READ_ELSEWHERE = {"Composition", "List"}  # narratives (fhir.composition); medication lists (fhir.medications)


@dataclass
class _Chart:
    """What one reading accumulates: the index, the patient, what was passed over."""

    origin: str
    index: ChartIndex
    patient: Resource | None
    subject: str
    aliases: frozenset[str]
    unused: Counter[str]
    defects: list[str] = field(default_factory=list)
    more_defects: int = 0
    today: Today = field(default_factory=Today.wall_clock)  # the present the chart's dates are read against
    withheld: set[int] = field(default_factory=set)  # id() of resources their renderer chose not to pack
    coverage: Coverage = field(default_factory=Coverage)  # how their elements reached the fragments (fhir.coverage)

    def defect(self, label: str, problem: str) -> None:
        """One resource's defect, for the trace (the first `_MAX_DEFECT_LINES`, then a count)."""
        if len(self.defects) < _MAX_DEFECT_LINES:
            self.defects.append(f"{label}: {problem}")
        else:
            self.more_defects += 1


def record_from_fhir_bundle(bundle: Any, origin: str, *, stale_after: timedelta = DEFAULT_STALE_AFTER,
                            today: Today | None = None) -> PatientRecord:
    """A Bundle of any type (document, collection, batch, transaction, searchset, message, history)."""
    return read_fhir_bundle(bundle, origin, stale_after=stale_after, today=today)[0]


def read_fhir_bundle(bundle: Any, origin: str, *, stale_after: timedelta = DEFAULT_STALE_AFTER,
                     today: Today | None = None) -> tuple[PatientRecord, ChartFacts]:
    """The record of a Bundle and the facts its face sheet was built from (the CDS cards cite the same)."""
    if not isinstance(bundle, Mapping) or bundle.get("resourceType") != "Bundle":
        raise RecordError(origin, "not a FHIR Bundle (resourceType must be \"Bundle\")")
    problems: list[str] = []
    return read_entries(bundle_entries(bundle, origin, problems), origin, problems, stale_after=stale_after,
                        today=today)


def record_from_entries(entries: Sequence[Entry], origin: str, problems: Sequence[str] = (), *,
                        stale_after: timedelta = DEFAULT_STALE_AFTER, today: Today | None = None) -> PatientRecord:
    return read_entries(entries, origin, problems, stale_after=stale_after, today=today)[0]


def read_entries(entries: Sequence[Entry], origin: str, problems: Sequence[str] = (), *,
                 stale_after: timedelta = DEFAULT_STALE_AFTER,
                 today: Today | None = None) -> tuple[PatientRecord, ChartFacts]:
    """`today`: the present the chart's dates are read against (default: the wall clock now)."""
    chart = _identify(entries, origin)
    chart.today = today or Today.wall_clock()
    clinical = canonical_order([e for e in entries if e.resource.get("resourceType") != "Patient"
                                and _is_this_patients(e, chart)], _time,
                               today=chart.today)  # however the chart was packaged
    index = chart.index  # holds only this patient's resources and shared ones: nothing else can be resolved
    index.patient = chart.patient
    for entry in clinical:
        index.add(entry)
    _mark_panels(clinical, index)
    medications = [e.resource for e in clinical if e.resource.get("resourceType") in MEDICATION_TYPES]
    lists = [e.resource for e in clinical if e.resource.get("resourceType") == "List"]
    newest_recorded = chart.today.newest(_time(e.resource) for e in clinical)
    reconcile(medications, lists, index, newest_recorded, stale_after, today=chart.today)
    fragments = _fragments(clinical, chart)
    fragments += _narratives(clinical, chart)
    fragments = _collapsed(fragments, chart)
    rendered = [f for f in fragments if not f.id.endswith(generic.MORE)]  # the face sheet reads the renderers' lines
    chart_facts = read_facts(index.unique(), chart.today, _medications(chart, rendered, medications))
    summary = _face_sheet(chart, rendered, chart_facts)
    skipped = _skipped(chart, problems)
    for note in skipped:
        log.debug("%s: %s", origin, note)  # a note may quote the chart: not at INFO, where logs are kept
    if not fragments and chart.patient is None:  # a Patient alone is a chart (a new patient); a Claim alone is not
        raise RecordError(origin, "the chart holds neither a Patient nor a clinical resource that could be read"
                                  + (f" ({'; '.join(skipped[:3])})" if skipped else ""))
    return PatientRecord(chart.subject, tuple(_unique_ids([*summary, *fragments])), origin, tuple(skipped),
                         facts.identifiers(chart.patient), chart.coverage), chart_facts


def _identify(entries: Sequence[Entry], origin: str) -> _Chart:
    """The one patient of the chart: its Patient resource, else the one patient every resource names."""
    patients: dict[str, Entry] = {}
    for entry in entries:
        if entry.resource.get("resourceType") == "Patient":
            key = _patient_key(entry)
            if key in patients and not _same_patient(patients[key].resource, entry.resource):
                raise RecordError(origin, f"{patients[key].where} ({patients[key].full_url or 'no fullUrl'}) and "
                                          f"{entry.where} ({entry.full_url or 'no fullUrl'}) are two Patient "
                                          f"resources with id {key.removeprefix('Patient/')!r}: one record must "
                                          "hold exactly one patient")
            patients.setdefault(key, entry)
    if len(patients) > 1:
        where = ", ".join(e.where for e in patients.values())
        raise RecordError(origin, f"the chart holds {len(patients)} Patient resources ({where}); "
                                  "one record must hold exactly one patient")
    named = {type_id(ref) or ref for e in entries if (ref := reference_of(subject_link(e.resource)))}
    if patients:
        (key, entry), = patients.items()
        names = {key, entry.full_url, type_id(entry.full_url)} - {""}
        if key == _UNIDENTIFIED and len(named) == 1:  # a Patient nobody can reference: the one patient named
            names |= named
        return _Chart(origin, ChartIndex(), entry.resource, key, frozenset(names), Counter())
    if len(named) != 1:
        raise RecordError(origin, "the chart holds no patient (no Patient resource and no patient reference)"
                          if not named else f"the chart's resources name {len(named)} different patients; "
                                            "one record must hold exactly one patient")
    subject = named.pop()
    return _Chart(origin, ChartIndex(), None, subject, frozenset({subject}), Counter())


def _same_patient(one: Resource, other: Resource) -> bool:
    """Two copies of one Patient (a searchset repeats it, with another `meta`) agree on who it is; a copy that
    names another person or birth date is another patient."""
    core = ("name", "birthDate", "gender", "identifier")
    return one == other or ({k: one.get(k) for k in core} == {k: other.get(k) for k in core})


def _patient_key(entry: Entry) -> str:
    rid = entry.resource.get("id")
    if isinstance(rid, str) and rid:
        return f"Patient/{rid}"
    if entry.full_url:
        return f"Patient/{entry.full_url.rsplit(':', 1)[-1].rsplit('/', 1)[-1]}"
    return _UNIDENTIFIED


def subject_link(resource: Resource) -> Any:
    """Whose resource it is: `subject` or `patient` (a Task: `for`); a Binary says it in its `securityContext`."""
    return resource.get("subject") or resource.get("patient") or (
        resource.get("for") if resource.get("resourceType") == "Task" else None) or (
        resource.get("securityContext") if resource.get("resourceType") == "Binary" else None)


def _is_this_patients(entry: Entry, chart: _Chart) -> bool:
    """Read a resource only when it is this patient's: it names the patient (in any reference style) or names
    nobody. A resource naming another patient is left out, and that patient is not named in the report."""
    kind = str(entry.resource.get("resourceType"))
    link = subject_link(entry.resource)
    if kind in ADMINISTRATIVE and not (kind == "Binary" and type_id(reference_of(link)).startswith("Patient/")):
        return True
    reference = reference_of(link)
    if not reference:
        if _names_another_patient(entry.resource, chart):  # an Appointment's participant, a ResearchSubject's ...
            chart.unused[f"{kind}: names a different patient than the chart's; not read"] += 1
            return False
        if kind in _RENDERERS and kind not in ("Encounter",):
            chart.unused[f"{kind}: names no patient; read as this chart's patient's"] += 1
        return True
    if reference in chart.aliases or (type_id(reference) in chart.aliases and not _other_server(reference, chart)):
        return True
    chart.unused[f"{kind}: names a different patient than the chart's; not read"] += 1
    return False


def _names_another_patient(node: Any, chart: _Chart, depth: int = 0) -> bool:
    """Whether a resource that names no patient in `subject` or `patient` points at another patient anywhere else
    (`participant.actor`, `individual`, ...): every type the generic renderer reads is checked, not a list of them."""
    if depth > _MAX_LINK_DEPTH:
        return False
    if isinstance(node, Mapping):
        target = node.get("reference")
        if isinstance(target, str) and type_id(target).startswith("Patient/") and not (
                target in chart.aliases or (type_id(target) in chart.aliases and not _other_server(target, chart))):
            return True
        return any(_names_another_patient(v, chart, depth + 1) for k, v in node.items() if k != "contained")
    if isinstance(node, list):
        return any(_names_another_patient(v, chart, depth + 1) for v in node)
    return False


_MAX_LINK_DEPTH = 12  # deeper than any FHIR element that holds a reference


def _other_server(reference: str, chart: _Chart) -> bool:
    """"https://b/fhir/Patient/1" is not "https://a/fhir/Patient/1": the same id on two servers is two people.
    A chart whose Patient has no server URL (urn:uuid, relative) accepts its exporter's absolute references."""
    if not reference.startswith(("http://", "https://")):
        return False
    servers = {a.rsplit("/Patient/", 1)[0] for a in chart.aliases if a.startswith(("http://", "https://"))}
    return bool(servers) and reference.rsplit("/Patient/", 1)[0] not in servers


def _mark_panels(entries: Sequence[Entry], index: ChartIndex) -> None:
    """Observations a report or a panel Observation lists are read into it, not packed twice. A member that
    already holds its panel (a cycle, as real exports have) stays the panel's: the first seen is the panel."""
    holds: dict[int, set[int]] = {}  # panel -> members, to refuse an edge that would close a cycle
    for entry in entries:
        resource = entry.resource
        links = resource.get("result") if resource.get("resourceType") == "DiagnosticReport" else \
            resource.get("hasMember") if resource.get("resourceType") == "Observation" else None
        for link in links if isinstance(links, list) else []:
            member = index.resolve(link)
            if member is None or member.get("resourceType") != "Observation" or _reaches(holds, id(member),
                                                                                           id(resource)):
                continue
            holds.setdefault(id(resource), set()).add(id(member))
            index.in_panel.add(id(member))


def _reaches(holds: Mapping[int, set[int]], start: int, goal: int) -> bool:
    """Whether `goal` is `start` or one of the members it holds, directly or through other panels."""
    stack, seen = [start], set()
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(holds.get(node, ()))
    return False


def _time(resource: Resource) -> datetime | None:
    kind = str(resource.get("resourceType"))
    keys = _RENDERERS[kind][1] if kind in _RENDERERS else ()
    when = _when(resource, keys)
    return partial_timestamp(when) if when else None


def _when(resource: Resource, keys: Sequence[str]) -> Any:
    """The first of `keys` the resource has; a dotted key reads inside an element ("effectivePeriod.start")."""
    for key in keys:
        head, _, inner = key.partition(".")
        value = resource.get(head)
        value = value.get(inner) if inner and isinstance(value, Mapping) else value if not inner else None
        if value:
            return value
    return None


def _fragments(entries: Sequence[Entry], chart: _Chart) -> list[Fragment]:
    """Each resource's fragments in the chart's order, each resource's followed by the line that says what its
    renderer passed over (fhir.coverage); a type no renderer reads is said whole by such a line (fhir.generic)."""
    reads: list[tuple[Entry, coverage.Read]] = []
    for entry in entries:
        kind = str(entry.resource.get("resourceType"))
        found: list[Fragment] = []
        if kind in _RENDERERS:
            found = _render(entry, chart)
        elif kind in ADMINISTRATIVE:
            chart.unused[f"{kind}: " + ("billing or administrative, not clinical evidence" if kind in _BILLING
                                        else "read through the resources that refer to it")] += 1
        elif kind not in _READ_ELSEWHERE and generic.taken_back(entry.resource):
            chart.unused[f"{kind}: entered in error or refuted"] += 1
            chart.withheld.add(id(entry.resource))
        through = kind in _REFERENCED and not reference_of(subject_link(entry.resource))  # a patient's implant is read
        reads.append((entry, coverage.Read(entry.resource, found, id(entry.resource) in chart.withheld, through)))
    more = _said_generically(reads, chart)
    return [f for entry, read in reads for f in (*read.fragments, *more.get(id(read.resource), ()))]


def _said_generically(reads: Sequence[tuple[Entry, coverage.Read]], chart: _Chart) -> dict[int, list[Fragment]]:
    """id(resource) -> the line of its clinical elements no fragment says (fhir.coverage), audited again."""
    audit = coverage.Audit(chart.index)
    try:
        leftovers = audit.leftovers([read for _, read in reads])
    except Exception as exc:  # the audit of a chart it cannot walk costs the audit, never the chart
        log.debug("%s: coverage audit failed: %s", chart.origin, type(exc).__name__)
        chart.defect(chart.origin, f"its elements could not be audited ({type(exc).__name__}); what the renderers "
                                   "say is kept, nothing is said generically")
        return {}
    more: dict[int, list[Fragment]] = {}
    for entry, read in reads:
        kind = str(read.resource.get("resourceType"))
        left = leftovers.get(id(read.resource))
        if left is None:
            if kind not in _RENDERERS and kind not in ADMINISTRATIVE and kind not in _READ_ELSEWHERE \
                    and not read.withheld:
                chart.unused[f"{kind}: holds no clinical element (only ids, links and statuses)"] += 1
            continue
        try:
            line = _generic_line(entry, left, audit, chart)
        except Exception as exc:  # any failure costs this line, never the chart; the audit counts it unsaid
            chart.defect(f"{kind} at {entry.where}", f"its elements no renderer says could not be said "
                                                     f"({type(exc).__name__})")
            audit.confirm(left.items, [])
            continue
        more[id(read.resource)] = [line]
        audit.confirm(left.items, [line])
    chart.coverage = audit.report()
    return more


def _generic_line(entry: Entry, left: coverage.Leftover, audit: coverage.Audit, chart: _Chart) -> Fragment:
    """The line of a resource's unsaid elements: after its renderer's lines (under their section, with their date
    and visit), or its only line, under its type's name ("Nutrition order")."""
    resource, like = entry.resource, left.like
    kind = str(resource.get("resourceType"))
    base = f"{kind}/{resource.get('id') if isinstance(resource.get('id'), str) else entry.where}"
    text = generic.line(resource, left.items, audit.names, also=like is not None)
    stamp = partial_timestamp(generic.timed(resource))
    if like is not None:
        future = like.date_in_future if like.timestamp else chart.today.is_future(stamp)
        return Fragment(base + generic.MORE, chart.subject, text, generic.also_section(like.section),
                        like.timestamp or stamp, source="fhir", encounter=like.encounter, date_in_future=future)
    return Fragment(base, chart.subject, text, generic.type_words(kind), stamp, source="fhir",
                    encounter=_encounter_of(resource, chart.index), date_in_future=chart.today.is_future(stamp))


def _render(entry: Entry, chart: _Chart) -> list[Fragment]:
    """One resource's fragments; a resource no renderer can read still yields what can be said of it."""
    resource = entry.resource
    kind = str(resource.get("resourceType"))
    render, time_keys = _RENDERERS[kind]
    label = f"{kind}/{resource['id']}" if isinstance(resource.get("id"), str) else f"{kind} at {entry.where}"
    for defect in defects(resource):
        chart.defect(label, defect)
    try:
        rendered = render(resource, chart.index)
    except Exception as exc:  # any failure costs this resource, never the chart
        log.debug("%s could not be read: %s", label, type(exc).__name__)
        said = summary_of(resource)
        chart.defect(label, f"could not be read as a whole ({type(exc).__name__}); "
                     + ("its main concept was kept" if said else "not read"))
        rendered = [Rendered("Allergy" if kind == "AllergyIntolerance" else kind, said)] if said else Skip("")
    if isinstance(rendered, Skip):
        if rendered.reason:  # the renderer's decision, named in the trace: not said generically
            chart.withheld.add(id(resource))
            chart.unused[f"{kind}: {rendered.reason}"] += 1
        return []  # a resource that could not be read at all is said generically (fhir.generic)
    base = f"{kind}/{resource.get('id') if isinstance(resource.get('id'), str) else entry.where}"
    visit = _encounter_of(resource, chart.index)
    default = _when(resource, time_keys)
    found: list[Fragment] = []
    for part in rendered:
        raw = part.timestamp or default
        stamp = partial_timestamp(raw)
        if raw and stamp is None:
            chart.defect(label, f"a date that is not a date ({str(raw)[:30]!r}); read undated")
        future = chart.today.is_future(stamp)
        if future and not found and resource.get("status") not in _PLANNED:
            chart.defect(label, f"dated {as_written(raw)}, after the time of reading ({chart.today.day}): shown "
                                "flagged, never taken as the newest")
        found.append(Fragment(base + part.id_suffix, chart.subject, part.text, part.section, stamp, source="fhir",
                              encounter=visit, date_in_future=future))
    return found


_PLANNED = ("planned", "proposed", "draft", "preparation")  # statuses whose date may lie ahead (a tuple: may be a dict)


def _encounter_of(resource: Resource, index: ChartIndex) -> str | None:
    if resource.get("resourceType") == "Encounter" and isinstance(resource.get("id"), str):
        return f"Encounter/{resource['id']}"
    link = resource.get("encounter") or resource.get("context")
    reference = reference_of(link)
    if not reference:
        return None
    found = index.resolve(link)
    if found is not None and isinstance(found.get("id"), str):
        return f"Encounter/{found['id']}"
    return type_id(reference) or reference


def _narratives(entries: Sequence[Entry], chart: _Chart) -> list[Fragment]:
    fragments: list[Fragment] = []
    for entry in entries:
        if entry.resource.get("resourceType") != "Composition":
            continue
        resource = entry.resource
        stamp = partial_timestamp(resource.get("date"))
        base = f"Composition/{resource.get('id') if isinstance(resource.get('id'), str) else entry.where}"
        future = chart.today.is_future(stamp)
        if future:
            chart.defect(base, f"dated {as_written(resource.get('date'))}, after the time of reading "
                               f"({chart.today.day}): shown flagged, never taken as the newest")
        fragments += [Fragment(base + note.id_suffix, chart.subject, note.text, note.section, stamp, source="fhir",
                               date_in_future=future)
                      for note in section_notes(resource, chart.index, chart.unused)]
    return fragments


def _medications(chart: _Chart, fragments: Sequence[Fragment], medications: Sequence[Resource]) -> Medications:
    """The reconciled medication list (after `reconcile` filled the index's states)."""
    current, unknown = current_names(medications, chart.index)
    stated = next((f.text.removeprefix("Medications: ") for f in fragments if f.section == "Medication status"), "")
    ended = sum(chart.index.medication_state.get(id(m), ("",))[0] == NOT_ACTIVE for m in medications)
    return Medications(tuple(current), tuple(unknown), stated, ended)


def _face_sheet(chart: _Chart, fragments: Sequence[Fragment], chart_facts: ChartFacts) -> list[Fragment]:
    """The face sheet's lines, rendered from the chart's facts (records.fhir.facts)."""
    today = chart.today
    newest = today.newest(f.timestamp for f in fragments if not f.date_in_future)
    if (born := facts.birth_defect(chart.patient, today)):
        chart.defect(chart.subject, born)
    sheet = (facts.demographics(chart.patient, chart.subject, newest, facts.pregnancy_status(chart_facts.pregnancy),
                                today),
             facts.allergy_status(chart.subject, fragments, newest),
             facts.problem_summary(chart.subject, fragments, newest),
             facts.medication_summary(chart.subject, chart_facts.medications, newest),
             facts.drug_facts(chart.subject, chart_facts),
             facts.latest_results(chart.subject, chart_facts))
    return [f for f in sheet if f is not None]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _printable(text: str) -> str:
    """An id with its control characters written out ("o\\u0000"): a resource id is no FHIR id with them, and
    PostgreSQL refuses NUL in the id column, so both stores keep the same, readable id."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _unique_ids(fragments: Sequence[Fragment]) -> list[Fragment]:
    """Two resources with one id (a searchset's repeats, producers without ids) keep both, told apart; ids
    and encounters are made printable first."""
    seen: Counter[str] = Counter()
    unique = []
    for fragment in fragments:
        if _CONTROL.search(fragment.id) or (fragment.encounter and _CONTROL.search(fragment.encounter)):
            fragment = replace(fragment, id=_printable(fragment.id),
                               encounter=_printable(fragment.encounter) if fragment.encounter else None)
        seen[fragment.id] += 1
        if seen[fragment.id] > 1:
            fragment = replace(fragment, id=f"{fragment.id}~{seen[fragment.id]}")
        unique.append(fragment)
    return unique


def _collapsed(fragments: Sequence[Fragment], chart: _Chart) -> list[Fragment]:
    """Exact duplicate lines (one text in one section: the same allergy recorded twice) kept once, the trace
    counting the rest. The copy kept is the newest one not dated in the future (the one packing would keep of
    copies: a repeated result keeps its latest date), else the first."""
    copies: dict[tuple[str, str | None], list[int]] = {}
    for n, fragment in enumerate(fragments):
        copies.setdefault((" ".join(fragment.text.split()), fragment.section), []).append(n)
    dropped: set[int] = set()
    for places in copies.values():
        if len(places) < 2:
            continue
        kept = max(places, key=lambda n: (*_trusted_time(fragments[n]), -n))
        for n in places:
            if n != kept:
                dropped.add(n)
                kind = fragments[n].id.split("/", 1)[0]
                chart.unused[f"{kind}: the same line as another in its section (same text); kept once"] += 1
    return [f for n, f in enumerate(fragments) if n not in dropped]


def _trusted_time(fragment: Fragment) -> tuple[bool, datetime]:
    """(dated and not in the future, that date): the newest such copy ranks first, undated ones by order."""
    trusted = fragment.timestamp is not None and not fragment.date_in_future
    return trusted, fragment.timestamp if trusted and fragment.timestamp else datetime.min.replace(tzinfo=UTC)


def _skipped(chart: _Chart, problems: Sequence[str]) -> list[str]:
    lines = [f"{kind.split(': ')[0]} x{n}: {kind.split(': ', 1)[1]}" for kind, n in sorted(chart.unused.items())]
    if chart.index.dangling:
        kinds = Counter(type_id(r).split("/")[0] or "unnamed" for r in chart.index.dangling)
        lines.append(f"references x{len(chart.index.dangling)}: point outside the chart ("
                     + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + "); those links not followed")
    lines += [f"attachments x{n}: {why}" for why, n in sorted(chart.index.unread.items())]
    lines += chart.defects + ([f"... and {chart.more_defects} more defects of the same kinds"]
                              if chart.more_defects else [])
    return lines + list(problems)
