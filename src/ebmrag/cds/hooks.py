"""CDS Hooks 2.0 without HTTP: the services ebmrag offers, a hook request read and checked, its prefetch sorted
into what arrived and what is missing, and the cards a chart gives.

Three services, one per hook (patient-view 1.0, order-select 1.0, order-sign 1.0). Each declares the prefetch
templates of what its cards read (the patient, allergies, conditions, observations); a key the client did not
satisfy is fetched from the client's FHIR server with the hook's `fhirAuthorization` (cds.fetch), and a call
that can have neither is refused (412, as the specification says). The cards (cds.cards) state what the
chart says and cite it: the allergy of an ordered drug's class, renal function for a renally cleared drug, a
current pregnancy for any medication order, critical results of the last hours on every hook.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote as url_quote

from ebmrag.cds.cards import (
    Card,
    Order,
    allergy_card,
    critical_card,
    left_out_card,
    pregnancy_card,
    renal_card,
    uncompared_card,
)
from ebmrag.cds.facts import Chart, LabFact, allergy_facts, critical_facts, pregnancy_fact, renal_facts
from ebmrag.cds.params import normal_base
from ebmrag.ehr.ids import is_fhir_id
from ebmrag.errors import EbmragError, RecordError
from ebmrag.records.fhir.coding import codings, obj, objects, text_of
from ebmrag.records.fhir.index import ChartIndex, Entry, Resource, bundle_entries, type_id
from ebmrag.vocab.drugs import DrugVocabulary

ORDER_HOOKS = ("order-select", "order-sign")
_TOKEN = re.compile(r"\{\{\s*([A-Za-z][A-Za-z0-9.]*)\s*\}\}")
_USER_TOKENS = {"userPractitionerId": "Practitioner", "userPractitionerRoleId": "PractitionerRole",
                "userPatientId": "Patient", "userRelatedPersonId": "RelatedPerson"}
_ENDED_ORDERS = ("entered-in-error", "cancelled")  # a tuple: a malformed status may be unhashable
_PATIENT = "Patient/{{context.patientId}}"
_OBSERVATIONS = "Observation?patient={{context.patientId}}"
ORDER_PREFETCH = {"patient": _PATIENT, "allergies": "AllergyIntolerance?patient={{context.patientId}}",
                  "conditions": "Condition?patient={{context.patientId}}", "observations": _OBSERVATIONS}


class HookRequestError(EbmragError, ValueError):
    """A hook request that breaks the specification: `where` names the field ("context.patientId")."""

    def __init__(self, where: str, problem: str) -> None:
        self.where, self.problem = where, problem
        super().__init__(f"{where}: {problem}")


class UnreadableError(EbmragError):
    """Prefetched or fetched data that cannot all be read (the message says where, without its contents): cards
    from the readable part could claim an absence, so the key counts as not satisfied."""


@dataclass(frozen=True)
class ServiceDefinition:
    id: str
    hook: str
    title: str
    description: str
    prefetch: Mapping[str, str]
    usage: str = ""

    def to_json(self) -> dict[str, Any]:
        described = {"hook": self.hook, "title": self.title, "description": self.description, "id": self.id,
                     "prefetch": dict(self.prefetch)}
        return described | ({"usageRequirements": self.usage} if self.usage else {})


_USAGE = ("The client's JWT must be signed by a key of an issuer configured in [cds.issuers]. Without the "
          "prefetch, the service fetches the same queries with the hook's fhirAuthorization from a FHIR server "
          "listed for that issuer.")
SERVICES = {s.id: s for s in (
    ServiceDefinition("ebmrag-patient-view", "patient-view", "ebmrag: critical results on opening a chart",
                      "Cards for critical results of the last 24 hours (flagged critical by the laboratory or "
                      "beyond ebmrag's critical limits), each citing the chart's result.",
                      {"patient": _PATIENT, "observations": _OBSERVATIONS}, _USAGE),
    ServiceDefinition("ebmrag-order-select", "order-select", "ebmrag: chart facts for a selected medication",
                      "For each newly selected medication order: an allergy recorded to the drug or its class, the "
                      "chart's renal function for a renally cleared drug, a current pregnancy, and critical "
                      "results of the last 24 hours; every card cites the chart and gives no dosing advice.",
                      ORDER_PREFETCH, _USAGE),
    ServiceDefinition("ebmrag-order-sign", "order-sign", "ebmrag: chart facts before signing medication orders",
                      "For each medication order about to be signed: an allergy recorded to the drug or its class, "
                      "the chart's renal function for a renally cleared drug, a current pregnancy, and critical "
                      "results of the last 24 hours; every card cites the chart and gives no dosing advice.",
                      ORDER_PREFETCH, _USAGE),
)}


def discovery() -> dict[str, Any]:
    """The body of GET /cds-services."""
    return {"services": [s.to_json() for s in SERVICES.values()]}


@dataclass(frozen=True)
class FhirAuthorization:
    access_token: str = field(repr=False)
    token_type: str
    scope: str


@dataclass(frozen=True)
class HookRequest:
    hook: str
    instance: str
    patient_id: str
    context: Mapping[str, Any]
    fhir_server: str = ""
    authorization: FhirAuthorization | None = None
    prefetch: Mapping[str, Any] = field(default_factory=dict)


def parse_request(body: Any, service: ServiceDefinition) -> HookRequest:
    """The request body, checked where the cards depend on it; the first fault is a HookRequestError naming its
    field."""
    if not isinstance(body, Mapping):
        raise HookRequestError("body", "must be a JSON object")
    hook = _text(body, "hook", "hook")
    if hook != service.hook:
        raise HookRequestError("hook", f"this service answers the {service.hook} hook")
    instance = _text(body, "hookInstance", "hookInstance")[:256]
    context = body.get("context")
    if not isinstance(context, Mapping):
        raise HookRequestError("context", "must be an object")
    patient = _text(context, "patientId", "context.patientId")
    if not is_fhir_id(patient):
        raise HookRequestError("context.patientId", "must be a FHIR id (1-64 letters, digits, - or ., not only dots)")
    _text(context, "userId", "context.userId")
    if hook in ORDER_HOOKS:
        _draft_orders(context, hook)
    server = body.get("fhirServer", "")
    if server and (not isinstance(server, str) or normal_base(server) is None):
        raise HookRequestError("fhirServer", "must be the base URL of the client's FHIR server: absolute http(s), "
                                             "without a user part, query or fragment")
    prefetch = body.get("prefetch", {})
    if not isinstance(prefetch, Mapping):
        raise HookRequestError("prefetch", "must be an object of prefetch keys")
    return HookRequest(hook, instance, patient, context, str(server or ""), _authorization(body, bool(server)),
                       prefetch)


def _text(where: Mapping[str, Any], key: str, name: str) -> str:
    value = where.get(key)
    if not isinstance(value, str) or not value.strip():
        raise HookRequestError(name, "is required (a non-empty string)")
    return value.strip()


def _draft_orders(context: Mapping[str, Any], hook: str) -> None:
    """draftOrders must be readable whole: a Bundle whose every entry holds a resource, every selection one of
    them, and every order the cards read naming its medication. An order the service cannot read is refused (400),
    never answered with no cards as if it had been checked."""
    bundle = context.get("draftOrders")
    if not isinstance(bundle, Mapping) or bundle.get("resourceType") != "Bundle" or not isinstance(
            bundle.get("entry", []), list):
        raise HookRequestError("context.draftOrders", "must be a FHIR Bundle of the draft orders (entry a list)")
    entries: list[Any] = bundle.get("entry", [])
    for number, entry in enumerate(entries):
        resource = entry.get("resource") if isinstance(entry, Mapping) else None
        if not isinstance(resource, Mapping) or not isinstance(resource.get("resourceType"), str):
            raise HookRequestError(f"context.draftOrders.entry[{number}]", "must hold a resource with a resourceType")
    chosen = _chosen(context, entries) if hook == "order-select" else None
    for number, entry in enumerate(entries):
        order = entry["resource"]
        if order["resourceType"] != "MedicationRequest" or order.get("status") in _ENDED_ORDERS:
            continue
        if (chosen is None or chosen & set(_names_of(entry))) and not _names_a_medication(order):
            raise HookRequestError(f"context.draftOrders.entry[{number}].resource",
                                   "a MedicationRequest must name its medication (medicationCodeableConcept with a "
                                   "coding or text, or medicationReference)")


def _chosen(context: Mapping[str, Any], entries: list[Any]) -> set[str]:
    """order-select's selections, each naming an order of draftOrders (the specification's rule)."""
    selections = context.get("selections")
    if not isinstance(selections, list) or not all(isinstance(s, str) for s in selections):
        raise HookRequestError("context.selections", "must be a list of the selected orders' ids")
    chosen = {type_id(s) or s for s in selections}
    if chosen - {name for entry in entries for name in _names_of(entry)}:
        raise HookRequestError("context.selections", "names an order that is not in draftOrders")
    return chosen


def _readable(concept: Any) -> bool:
    """A concept that says something: a text, or a coding with a code or a display."""
    return isinstance(concept, Mapping) and bool(text_of(concept) or any(
        code or display for _, code, display in codings(concept)))


def _names_of(entry: Mapping[str, Any]) -> list[str]:
    """What a selection may call a draft order (`type_id` of the selection, or the selection itself): `Type/id`,
    its fullUrl, and the `Type/id` its fullUrl names."""
    resource = entry["resource"]
    names = [f"{resource['resourceType']}/{resource['id']}"] if isinstance(resource.get("id"), str) else []
    full = entry.get("fullUrl")
    return names + ([full, type_id(full)] if isinstance(full, str) and full else [])


def _names_a_medication(order: Mapping[str, Any]) -> bool:
    medication = obj(order.get("medication"))
    concepts = [order.get("medicationCodeableConcept"), medication.get("concept")]
    links = [order.get("medicationReference"), medication.get("reference")]
    return any(_readable(c) for c in concepts) or any(
        isinstance(link, Mapping) and isinstance(link.get("reference"), str) and link["reference"].strip()
        for link in links)


def _authorization(body: Mapping[str, Any], has_server: bool) -> FhirAuthorization | None:
    raw = body.get("fhirAuthorization")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise HookRequestError("fhirAuthorization", "must be an object")
    if not has_server:
        raise HookRequestError("fhirServer", "is required with fhirAuthorization")
    token = _text(raw, "access_token", "fhirAuthorization.access_token")
    kind = _text(raw, "token_type", "fhirAuthorization.token_type")
    if kind.lower() != "bearer":
        raise HookRequestError("fhirAuthorization.token_type", "must be Bearer")
    scope = raw.get("scope")
    return FhirAuthorization(token, kind, scope if isinstance(scope, str) else "")


# ------------------------------------------------------------------------------------------------ prefetch
def prefetched(request: HookRequest, service: ServiceDefinition) -> tuple[list[Resource], dict[str, str]]:
    """The resources the client prefetched, and the keys it did not satisfy with why: a key left out, answered
    with an OperationOutcome (the client's way of saying its query failed), or unreadable (a Bundle whose entries
    cannot all be read). A key sent as null means the client has no such data: satisfied, and empty."""
    resources: list[Resource] = []
    missing: dict[str, str] = {}
    for key in service.prefetch:
        if key not in request.prefetch:
            missing[key] = "not sent"
            continue
        value = request.prefetch[key]
        if value is None:
            continue
        try:
            resources += resources_of(value, f"prefetch.{key}")
        except UnreadableError as exc:
            missing[key] = str(exc)
    return resources, missing


def resources_of(value: Any, where: str) -> list[Resource]:
    """A prefetch value's resources: a Bundle's entries (OperationOutcome entries of a search left out), or the
    one resource. An UnreadableError when the value is no resource, reports a failed query, or is a Bundle with
    an entry that cannot be read (`entry` not a list, an entry without a resource): the rest alone could hide
    what that entry says."""
    if not isinstance(value, Mapping) or not isinstance(value.get("resourceType"), str):
        raise UnreadableError(f"{where}: not a FHIR resource")
    if value["resourceType"] == "OperationOutcome":
        raise UnreadableError(f"{where}: an OperationOutcome (the query failed)")
    if value["resourceType"] != "Bundle":
        return [value]
    if not isinstance(value.get("entry", []), list):
        raise UnreadableError(f"{where}.entry: not a list")
    problems: list[str] = []
    try:
        entries = bundle_entries(value, where, problems)
    except RecordError as exc:
        raise UnreadableError(f"{where}: {exc.args[0] if exc.args else 'unreadable'}") from None
    if problems or len(entries) < len(value.get("entry", [])):
        problem = problems[0].removesuffix("; skipped") if problems else "an entry holds no resource"
        raise UnreadableError(f"{where}: {problem}")
    failed = [e.resource for e in entries if e.resource.get("resourceType") == "OperationOutcome"
              and any(i.get("severity") in ("error", "fatal") for i in objects(e.resource.get("issue")))]
    if failed:
        raise UnreadableError(f"{where}: holds an OperationOutcome with an error (the search failed in part)")
    return [e.resource for e in entries if e.resource.get("resourceType") != "OperationOutcome"]


def query_for(template: str, request: HookRequest) -> str | None:
    """The template with its prefetch tokens filled from the context (root-level primitive fields) and the user
    tokens (from `context.userId`), each value URL-encoded; None when a token cannot be filled."""
    unfilled = False

    def fill(match: re.Match[str]) -> str:
        nonlocal unfilled
        name = match.group(1)
        value: Any = None
        if name.startswith("context."):
            value = request.context.get(name.removeprefix("context."))
        elif name in _USER_TOKENS:
            kind, _, rid = str(request.context.get("userId", "")).partition("/")
            value = rid if kind == _USER_TOKENS[name] else None
        if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value) == "":
            unfilled = True
            return ""
        return url_quote(str(value), safe="")

    query = _TOKEN.sub(fill, template)
    return None if unfilled else query


# ------------------------------------------------------------------------------------------------ orders
def orders_of(request: HookRequest, chart: Chart, vocabulary: DrugVocabulary) -> list[Order]:
    """The medication orders the cards are about: every MedicationRequest of `draftOrders` for order-sign, the
    selected ones for order-select; the drug read from the order's concept, or the Medication it references
    (contained, in the draft orders, or in the chart) with its ingredients."""
    bundle = request.context.get("draftOrders")
    raw = bundle.get("entry", []) if isinstance(bundle, Mapping) else []
    entries = [Entry(e["resource"], str(e.get("fullUrl") or ""), f"context.draftOrders.entry[{n}]")
               for n, e in enumerate(raw)]  # parse_request checked every entry holds a resource
    index = ChartIndex()
    for entry in [*entries, *(Entry(r, "", "chart") for r in chart.resources)]:
        index.add(entry)
    chosen = _selected(request)
    orders = []
    for entry, raw_entry in zip(entries, raw, strict=True):
        order = entry.resource
        reference = f"MedicationRequest/{order.get('id')}" if isinstance(order.get("id"), str) else entry.full_url
        if order.get("resourceType") != "MedicationRequest" or order.get("status") in _ENDED_ORDERS:
            continue
        if chosen is not None and not chosen & set(_names_of(raw_entry)):
            continue
        concepts = _medication_concepts(order, index)
        if not any(_readable(c) for c in concepts):
            raise HookRequestError(f"{entry.where}.resource", "its medicationReference names no Medication the "
                                   "order contains, draftOrders holds or the prefetch holds")
        name = next((t for c in concepts if (t := text_of(c))), "") or "an unnamed medication"
        orders.append(Order(reference or "MedicationRequest (without id)", name, vocabulary.identify(concepts)))
    return orders


def _selected(request: HookRequest) -> set[str] | None:
    if request.hook != "order-select":
        return None
    selections = request.context.get("selections")
    return {type_id(s) or s for s in selections if isinstance(s, str)} if isinstance(selections, list) else set()


def _medication_concepts(order: Resource, index: ChartIndex) -> list[Any]:
    """medicationCodeableConcept (R4), medication.concept (R5), or the referenced Medication's code and its
    ingredients' codes."""
    medication = obj(order.get("medication"))
    concepts = [order.get("medicationCodeableConcept"), medication.get("concept")]
    link = order.get("medicationReference") or medication.get("reference")
    found = index.resolve(link, within=order) if link else None
    if found is not None:
        concepts.append(found.get("code"))
        for ingredient in objects(found.get("ingredient")):
            item = ingredient.get("item")
            concepts += [ingredient.get("itemCodeableConcept"), item.get("concept") if isinstance(item, Mapping)
                         else None]
    return [c for c in concepts if isinstance(c, Mapping)]


# ------------------------------------------------------------------------------------------------ cards
def hook_cards(request: HookRequest, chart: Chart, *, now: datetime, vocabulary: DrugVocabulary,
               critical_hours: float) -> list[Card]:
    """The cards of one hook call, the most urgent first: critical results, then per order its allergy card and
    renal card, then a current pregnancy; and a card naming what was left out of a type those cards read."""
    cards: list[Card] = []
    critical = critical_facts(chart, now, critical_hours)
    if critical:
        cards.append(critical_card(request.instance, critical, critical_hours))
    orders = orders_of(request, chart, vocabulary) if request.hook in ORDER_HOOKS else []
    cards += _order_cards(request, chart, orders, now, vocabulary)
    left_out = left_out_card(request.instance, chart.left_out, _ORDER_READS if orders else ("Observation",))
    cards += [left_out] if left_out is not None else []
    return sorted(cards, key=lambda c: _URGENCY[c.indicator])


_ORDER_READS = ("AllergyIntolerance", "Observation", "Condition")  # what the order cards read of the chart


def _order_cards(request: HookRequest, chart: Chart, orders: list[Order], now: datetime,
                 vocabulary: DrugVocabulary) -> list[Card]:
    if not orders:
        return []
    cards: list[Card] = []
    allergies = allergy_facts(chart, vocabulary, now)
    renal: list[LabFact] | None = None
    for order in orders:
        found, unread = [], []
        for allergy in allergies:
            relation = vocabulary.relation(order.identity, allergy.identity)
            if relation is not None:
                found.append((allergy, relation))
            elif allergy.current and (why := vocabulary.uncomparable(order.identity, allergy.identity)):
                unread.append((allergy, why))  # codes only, none known: never silence
        card = allergy_card(request.instance, order, found, vocabulary, chart.left_out.get("AllergyIntolerance", 0))
        cards += [card] if card is not None else []
        cards += [uncompared_card(request.instance, order, unread)] if unread else []
    for order in orders:
        group = vocabulary.renal_group(order.identity)
        if group is not None:
            renal = renal if renal is not None else renal_facts(chart, now)
            cards.append(renal_card(request.instance, order, group, renal, chart.left_out.get("Observation", 0)))
    pregnancy = pregnancy_fact(chart, now)
    if pregnancy is not None:
        cards.append(pregnancy_card(request.instance, orders, pregnancy))
    return cards


_URGENCY = {"critical": 0, "warning": 1, "info": 2}


def cited_fragments(cards: Iterable[Card]) -> tuple[str, ...]:
    """The record fragments the cards cite, once each (for the audit)."""
    return tuple(dict.fromkeys(f for card in cards for f in card.fragments))


# ------------------------------------------------------------------------------------------------ feedback
_CARD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-._:]{0,127}$")
OUTCOMES = ("accepted", "overridden")


@dataclass(frozen=True)
class Feedback:
    """One card's outcome: ids and the outcome only (an override's reason and comment are the user's text and are
    not kept)."""

    card: str
    outcome: str
    accepted: tuple[str, ...] = ()  # the accepted suggestions' ids


def parse_feedback(body: Any) -> list[Feedback]:
    """The feedback POSTed to /cds-services/{id}/feedback, checked; a HookRequestError names the first fault."""
    items = body.get("feedback") if isinstance(body, Mapping) else None
    if not isinstance(items, list) or not items:
        raise HookRequestError("feedback", "must be a non-empty list")
    found = []
    for number, item in enumerate(items):
        where = f"feedback[{number}]"
        if not isinstance(item, Mapping):
            raise HookRequestError(where, "must be an object")
        card = _text(item, "card", f"{where}.card")
        if not _CARD_ID.match(card):
            raise HookRequestError(f"{where}.card", "must be a card uuid")
        outcome = _text(item, "outcome", f"{where}.outcome")
        if outcome not in OUTCOMES:
            raise HookRequestError(f"{where}.outcome", "must be accepted or overridden")
        _text(item, "outcomeTimestamp", f"{where}.outcomeTimestamp")
        accepted = item.get("acceptedSuggestions", [])
        if outcome == "accepted" and (not isinstance(accepted, list) or not accepted):
            raise HookRequestError(f"{where}.acceptedSuggestions", "is required for an accepted outcome")
        ids = [s.get("id") for s in accepted] if isinstance(accepted, list) and all(
            isinstance(s, Mapping) for s in accepted) else None
        if ids is None or not all(isinstance(i, str) and _CARD_ID.match(i) for i in ids):
            raise HookRequestError(f"{where}.acceptedSuggestions", "must be a list of {\"id\": <suggestion uuid>}")
        found.append(Feedback(card, outcome, tuple(str(i) for i in ids)))
    return found
