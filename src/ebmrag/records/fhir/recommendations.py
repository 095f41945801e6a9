"""Requests and warnings -> fragments: a recommendation (Task, ServiceRequest), a detected issue (DetectedIssue)
and a risk assessment (RiskAssessment).

Why they matter: a pharmacogenomic report's advice ("avoid this drug, and these related ones", "may need a higher
dose") is stored as a `Task` that points at the therapeutic implication it follows from (`reasonReference`) and at
the drug it is about (`focus`, `input`). Read for what it references, it becomes a T1 finding that names the drugs
it affects; left unread, the most actionable line of the report is lost. A request is genomic when it declares one
of the IG's recommendation profiles, when a genomic report or result names it as its recommended action, or when
something it references is a genomic result (records/fhir/genomics.py); its section then says "Genomic", which the
tier rule section.genetic ranks T1. Any other request is an order line with its status.

A request or issue entered in error, cancelled, revoked or rejected says nothing to act on: it is skipped, with
the reason counted in the trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ebmrag.records.dates import as_written
from ebmrag.records.fhir.coding import codings, concepts, obj, objects, text_of, without_semantic_tags
from ebmrag.records.fhir.genomics import genomics, is_genomic, medications_assessed, name_of, profiles_of, summary
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.rendered import Rendered, Skip
from ebmrag.records.fhir.resources import drug_name
from ebmrag.records.fhir.results import quantity, value_of

_WITHDRAWN = frozenset({"entered-in-error", "cancelled", "revoked", "rejected"})
_MEDICATION_TYPES = frozenset({"Medication", "MedicationRequest", "MedicationStatement", "MedicationAdministration",
                               "MedicationDispense", "MedicationOrder"})


def _status(r: Resource) -> str:
    return r["status"] if isinstance(r.get("status"), str) else ""


def _words(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _notes(r: Resource) -> str:
    return "; ".join(t for n in objects(r.get("note")) if (t := _words(n.get("text"))))


def _named(found: Resource, index: ChartIndex) -> str:
    """A referenced resource in a few words: a drug by its name, a genomic result by its summary, anything else
    by its code and value."""
    kind = found.get("resourceType")
    if kind in _MEDICATION_TYPES:
        return text_of(found.get("code")) if kind == "Medication" else drug_name(found, index)
    if is_genomic(found):
        return summary(found, index) if kind == "Observation" else name_of(found.get("code")) or "genomic report"
    return " ".join(w for w in (text_of(found.get("code")), value_of(found)) if w) or str(kind)


class _Reading:
    """What a request's references say: the drugs it is about, what it is based on, whether any is genomic."""

    def __init__(self, r: Resource, index: ChartIndex) -> None:
        self.r, self.index = r, index
        self.drugs: list[str] = []
        self.basis: list[str] = []
        self.genomic = False

    def follow(self, link: Any, drug: bool = False) -> str:
        """A reference, named: a drug joins the drugs; a result (a genomic one with the drugs it assessed) joins
        what the request is based on. `drug`: a reference that should be a drug (Task.focus, an input's value),
        where a display alone, the target not in the chart, is taken for the drug's name."""
        found = self.index.resolve(link, within=self.r)
        display = without_semantic_tags(_words(obj(link).get("display")))
        if found is None:
            (self.drugs if drug else self.basis).extend([display] if display else [])
            return display
        named = _named(found, self.index)
        if found.get("resourceType") in _MEDICATION_TYPES:
            self.drugs.append(named)
            return named
        if is_genomic(found):
            self.genomic = True
            self.drugs += medications_assessed(found) if found.get("resourceType") == "Observation" else []
        named = f"{named} ({display})" if display and display.lower() not in named.lower() else named
        self.basis.append(named)
        return named

    def concept(self, concept: Any) -> str:
        """A coded value; a drug when its code system is a drug terminology (RxNorm, ATC, ...)."""
        words = text_of(concept)
        if words and any(part in system for system, _, _ in codings(concept) for part in genomics().drug_systems):
            self.drugs.append(words)
        return words


def _typed_values(items: Any, reading: _Reading) -> list[str]:
    """Task.input / Task.output: "type: value", a referenced value followed (a drug named, a result summed up)."""
    said = []
    for item in objects(items):
        label = text_of(item.get("type"))
        if isinstance(item.get("valueReference"), Mapping):
            value = reading.follow(item["valueReference"], drug=True)
        elif isinstance(item.get("valueCodeableConcept"), Mapping):
            value = reading.concept(item["valueCodeableConcept"])
        else:
            value = value_of(item) or next((_words(v) for k, v in item.items() if k.startswith("value")), "")
        if value:
            said.append(f"{label}: {value}" if label else value)
    return said


def _recommended_by_genomic(r: Resource, index: ChartIndex) -> str:
    """The genomic report or result that names `r` as its recommended action (an extension), or ""."""
    table = genomics()
    for other in index.resources.values():  # a resource under several names is seen again: the first match answers
        for extension in objects(other.get("extension")):
            url = _words(extension.get("url")).rstrip("/").rsplit("/", 1)[-1]
            if url in table.recommendation_extensions and index.resolve(extension.get("valueReference")) is r \
                    and is_genomic(other):
                return _named(other, index)
    return ""


def _request(r: Resource, index: ChartIndex, kind: str) -> Sequence[Rendered] | Skip:
    """A Task or ServiceRequest: what is asked, for which drugs, based on what, and its status."""
    if _status(r) in _WITHDRAWN:
        return Skip(f"{_status(r)}: nothing to act on")
    reading = _Reading(r, index)
    for link in objects(r.get("focus")):
        reading.follow(link, drug=True)
    for key in ("reasonReference", "supportingInfo", "basedOn"):
        for link in objects(r.get(key)):
            reading.follow(link)
    reasons = [t for c in concepts(r.get("reasonCode")) if (t := text_of(c))]
    inputs = _typed_values(r.get("input"), reading) + _typed_values(r.get("output"), reading)
    what = _join([name_of(r.get("code")), _words(r.get("description")), _notes(r)], "; ")
    asked = ", ".join(t for c in concepts(r.get("orderDetail")) if (t := text_of(c)))
    kinds = ", ".join(t for c in concepts(r.get("category")) if (t := text_of(c)))
    if by_report := _recommended_by_genomic(r, index):
        reading.basis.append(by_report)
    genomic = bool(reading.genomic or by_report or profiles_of(r) & genomics().recommendation_profiles)
    drugs = _join(reading.drugs, ", ")
    basis = _join(reading.basis, "; ")
    status = ", ".join(w for w in (_status(r), _words(r.get("intent")), _words(r.get("priority"))) if w)
    if genomic:
        text = "Genomic recommendation" + (f" for {drugs}" if drugs else "") + f": {what or 'not stated'}"
        section = "Genomic recommendation"
    else:
        forbid = "do not perform " if r.get("doNotPerform") is True else ""  # an order against, never for, it
        text = f"{'Order' if kind == 'ServiceRequest' else 'Task'}" + (f" ({kinds})" if kinds else "") \
            + f": {forbid}{what or 'not named'}" + (f" ({asked})" if asked else "") \
            + (f" for {drugs}" if drugs else "")
        section = "Order" if kind == "ServiceRequest" else "Task"
    details = [f"based on {basis}" if basis else "", f"reason: {', '.join(reasons)}" if reasons else "",
               *inputs, f"due {due}" if (due := _occurrence(r)) else "",
               f"status {status}" if status else "status not recorded"]
    return [Rendered(section, _sentence(text, details))]


def _occurrence(r: Resource) -> str:
    """When the request is to be done: occurrence[x] (ServiceRequest) or the execution period (Task)."""
    period = obj(r.get("occurrencePeriod")) or obj(r.get("executionPeriod"))
    return as_written(r.get("occurrenceDateTime")) or " to ".join(
        as_written(period[k]) for k in ("start", "end") if period.get(k))


def task(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    return _request(r, index, "Task")


def service_request(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    return _request(r, index, "ServiceRequest")


def detected_issue(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """"Detected issue: drug interaction, severity high: <detail> (implicated: warfarin, aspirin; mitigation:
    ...)": a clinical decision support warning the chart kept. Its section names the severity."""
    if _status(r) in _WITHDRAWN:
        return Skip(f"{_status(r)}: nothing to act on")
    implicated, evidence = _Reading(r, index), _Reading(r, index)
    for link in objects(r.get("implicated")):
        implicated.follow(link, drug=True)
    for item in objects(r.get("evidence")):
        for link in objects(item.get("detail")):
            evidence.follow(link)
    evidence_said = [t for e in objects(r.get("evidence")) for c in concepts(e.get("code")) if (t := text_of(c))]
    severity = _words(r.get("severity"))
    mitigations = [t for m in objects(r.get("mitigation")) if (t := text_of(m.get("action")))]
    named = text_of(r.get("code")) or text_of(r.get("category")) or "unnamed issue"
    head = f"Detected issue: {named}" + (f" severity {severity}" if severity else "")
    detail = _words(r.get("detail"))
    text = head + (f": {detail}" if detail else "")
    details = [f"implicated: {_join(implicated.drugs + implicated.basis, ', ')}"
               if implicated.drugs or implicated.basis else "",
               f"evidence: {_join(evidence_said + evidence.basis + evidence.drugs, '; ')}"
               if evidence_said or evidence.basis or evidence.drugs else "",
               f"mitigation: {', '.join(mitigations)}" if mitigations else "", _notes(r),
               f"status {_status(r)}" if _status(r) else ""]
    section = ("Genomic detected issue" if implicated.genomic or evidence.genomic else "Detected issue") + (
        f" > {severity}" if severity else "")
    return [Rendered(section, _sentence(text, details))]


def risk_assessment(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """"Risk assessment: breast cancer probability 0.25 (high risk) within 10 years; basis: <what it was
    computed from>": each predicted outcome with its probability, the method and what it is based on."""
    if _status(r) in _WITHDRAWN:
        return Skip(f"{_status(r)}: nothing to act on")
    reading = _Reading(r, index)
    for key in ("basis", "condition"):
        for link in objects(r.get(key)):
            reading.follow(link)
    predictions = [p for item in objects(r.get("prediction")) if (p := _prediction(item))]
    about = _join([text_of(r.get("code")), text_of(r.get("method"))], ", ")
    head = "Risk assessment" + (f" ({about})" if about else "") + ": " + (
        "; ".join(predictions) or "no prediction stated")
    details = [f"basis: {_join(reading.basis + reading.drugs, '; ')}" if reading.basis or reading.drugs else "",
               f"mitigation: {_words(r.get('mitigation'))}" if _words(r.get("mitigation")) else "",
               f"reason: {', '.join(t for c in concepts(r.get('reasonCode')) if (t := text_of(c)))}"
               if concepts(r.get("reasonCode")) else "", _notes(r)]
    section = "Genomic risk assessment" if reading.genomic else "Risk assessment"
    return [Rendered(section, _sentence(head, details))]


def _prediction(item: Mapping[str, Any]) -> str:
    """"<outcome> probability 0.25 (High risk), relative risk 2.1, within 10 years; <rationale>"."""
    outcome = text_of(item.get("outcome")) or "outcome not named"
    probability = item.get("probabilityDecimal")
    span = obj(item.get("probabilityRange"))
    said = (f"{probability:.4g}" if isinstance(probability, float) else str(probability)
            if isinstance(probability, int) and not isinstance(probability, bool) else "") or "-".join(
        q for q in (quantity(span.get("low")), quantity(span.get("high"))) if q)
    qualitative = text_of(item.get("qualitativeRisk"))
    relative = item.get("relativeRisk")
    when = obj(item.get("whenPeriod"))
    period = " to ".join(as_written(when[k]) for k in ("start", "end") if when.get(k))
    within = "-".join(q for q in (quantity(obj(item.get("whenRange")).get(k)) for k in ("low", "high")) if q)
    parts = [f"{outcome}" + (f" probability {said}" if said else "") + (f" ({qualitative})" if qualitative else ""),
             f"relative risk {relative}" if isinstance(relative, (int, float)) and not isinstance(relative, bool)
             else "", f"over {period}" if period else "", f"within {within}" if within else "",
             _words(item.get("rationale"))]
    return ", ".join(p for p in parts if p)


def _join(words: Sequence[str], sep: str) -> str:
    return sep.join(dict.fromkeys(w for w in words if w))


def _sentence(head: str, details: Sequence[str]) -> str:
    said = "; ".join(d for d in details if d)
    return head.rstrip(". ") + (f" ({said})" if said else "") + "."
