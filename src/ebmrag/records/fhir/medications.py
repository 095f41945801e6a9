"""Medication reconciliation: which of a chart's medication records are current.

EHR exports keep every order ever written, and orders are rarely closed out: a statin ordered in 2008 is
still `active` in 2024 though a newer list stopped it. A drug question needs what the patient takes now,
so each medication record gets a state, with the reason a reader can check:
- the newest reconciled medication `List` wins: an active record it does not hold (made before it), or one
  it marks deleted or stopped, is not current;
- a record whose status is stopped, cancelled, completed, not-taken, entered-in-error or draft is never
  current, nor is an order replaced by a newer one (`priorPrescription`) or followed by a newer record of
  the same drug that ends it ("the same drug": the same INN ingredients when the drug vocabulary knows the drug,
  so an order for "Lipitor 20 mg" and a record of "atorvastatin 20 MG Oral Tablet" are one drug);
- a record without a status is "status unknown" (listed apart, never as active);
- an active record older than `stale_after` with no newer record of the drug stays current but is marked
  "not recently confirmed";
- a record a document lists in a section (a referral summary's medication list) whose own status alone ends it
  (`completed`) is "listed": the document keeps it on its list, so the face sheet names it with its status rather
  than counting it among ended records ("none active" would contradict the document);
- a record named only by a placeholder ("Medication", "Drug") names no drug and is left off the face sheet.
A record or list dated after the present (records.dates.Today) is never "the newest": a mistyped year cannot stop
today's orders or make them stale.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ebmrag.records.codes import text_table
from ebmrag.records.dates import Today, as_written, partial_timestamp
from ebmrag.records.fhir.coding import codings, obj, objects, states_absence, text_of
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.resources import drug_name, names_no_drug, started
from ebmrag.rules import rule_file
from ebmrag.vocab.drugs import vocabulary

MEDICATION_TYPES = ("MedicationRequest", "MedicationOrder", "MedicationStatement", "MedicationAdministration")
_CURRENT = {"active", "on-hold", "intended"}
_ENDED = {"stopped", "cancelled", "completed", "entered-in-error", "not-taken", "draft", "revoked", "superseded"}


@rule_file("records/fhir.toml")
def _list_codes(raw: Mapping[str, Any]) -> frozenset[str]:
    """The LOINC codes of a medication List (rules/records/fhir.toml [medication_lists])."""
    return frozenset(text_table(raw.get("medication_lists"), "medication_lists"))
_STOPPED_FLAGS = re.compile(r"stop|cancel|discontinu|cease|delet|remov|suspend", re.IGNORECASE)
ACTIVE, NOT_ACTIVE, UNKNOWN, LISTED = "active", "not active", "status unknown", "listed"
_LISTED_ENDED = ("completed",)  # statuses that end a record without saying the drug was stopped
LISTED_STATUS = " (status "  # "Metformin (status completed)": how a listed drug is named on the face sheet
_MAX_SECTION_DEPTH = 4


DO_NOT_GIVE = "an order not to give it (doNotPerform)"


def reconcile(resources: Sequence[Resource], lists: Sequence[Resource], index: ChartIndex,
              as_of: datetime | None, stale_after: timedelta, *, today: Today | None = None) -> None:
    """Fill `index.medication_state` for every medication record of the chart; `today`: the present dates are
    read against (default: the wall clock now)."""
    today = today or Today.wall_clock()
    by_drug: dict[str, list[Resource]] = {}
    for r in resources:
        index.medication_state[id(r)] = _by_status(r)
        by_drug.setdefault(drug_key(r, index), []).append(r)
    _replaced_orders(resources, index)
    for records in by_drug.values():
        _newest_ends_older(records, index, today)
    reconciled = _newest_list(lists, today)
    if reconciled is not None:
        _apply_list(reconciled, resources, index)
    _listed_by_documents(resources, index)
    if as_of is not None:
        for records in by_drug.values():
            _mark_stale(records, index, as_of - stale_after, today)
    for r in resources:  # whatever a list or a newer record says, an order not to give a drug is no current drug
        if r.get("doNotPerform") is True:
            index.medication_state[id(r)] = (NOT_ACTIVE, DO_NOT_GIVE)


def _by_status(r: Resource) -> tuple[str, str]:
    status = r.get("status") if isinstance(r.get("status"), str) else ""
    if r.get("doNotPerform") is True:
        return NOT_ACTIVE, DO_NOT_GIVE
    if r.get("resourceType") == "MedicationAdministration":
        return NOT_ACTIVE, "a dose given"
    if status in _CURRENT:
        return ACTIVE, ""
    if status in _ENDED:
        return NOT_ACTIVE, ""
    return UNKNOWN, ""


def drug_key(r: Resource, index: ChartIndex) -> str:
    """Which drug a record is about: its INN ingredients when the drug vocabulary knows the drug by a code or a
    name (a brand and its generic are one drug), else an RxNorm or ATC code when there is one, else the first
    word of its name (the ingredient of "metFORMIN hydrochloride 500 MG")."""
    concept = r.get("medicationCodeableConcept") \
        or obj(index.resolve(r.get("medicationReference"), within=r)).get("code")
    ingredients = vocabulary().identify([concept, drug_name(r, index)]).ingredients
    if ingredients:
        return "inn|" + "+".join(sorted(ingredients))
    for system, code, _ in codings(concept):
        if code and ("rxnorm" in system or "atc" in system):
            return f"{system}|{code}"
    words = re.findall(r"[a-zà-ÿ]{3,}", drug_name(r, index).lower())
    return words[0] if words else f"unnamed-{id(r)}"


def _when(r: Resource) -> datetime | None:
    return partial_timestamp(started(r)) if isinstance(started(r), str) else None


def _replaced_orders(resources: Iterable[Resource], index: ChartIndex) -> None:
    for r in resources:
        prior = index.resolve(r.get("priorPrescription"))
        if prior is not None and index.medication_state.get(id(prior), ("",))[0] == ACTIVE:
            index.medication_state[id(prior)] = (NOT_ACTIVE, f"replaced by a newer order of {as_written(started(r))}")


def _newest_ends_older(records: Sequence[Resource], index: ChartIndex, today: Today) -> None:
    """When the newest record of a drug says it ended, every older active record of that drug is not current (a
    record dated in the future is never the newest)."""
    dated = sorted((r for r in records if _when(r) is not None and not today.is_future(_when(r))),
                   key=lambda r: _when(r))  # type: ignore[arg-type,return-value]
    if not dated:
        return
    newest = dated[-1]
    status = newest.get("status")
    if index.medication_state[id(newest)][0] != NOT_ACTIVE or status not in ("stopped", "cancelled", "completed",
                                                                                  "not-taken"):
        return
    for r in dated[:-1]:
        if index.medication_state[id(r)][0] == ACTIVE and _when(r) != _when(newest):
            index.medication_state[id(r)] = (NOT_ACTIVE,
                                             f"{status} per a newer record of {as_written(started(newest))}")


def _is_medication_list(resource: Resource) -> bool:
    if resource.get("status") not in (None, "current"):
        return False
    concept = resource.get("code")
    if any(code in _list_codes() and "loinc" in system for system, code, _ in codings(concept)):
        return True
    words = f"{text_of(concept)} {resource.get('title') if isinstance(resource.get('title'), str) else ''}"
    return bool(re.search(r"\bmedicat|\bdrug|\bmedikament|\bmédicament|\bfarmac|\bgenees", words, re.IGNORECASE))


def _newest_list(lists: Sequence[Resource], today: Today) -> Resource | None:
    """The newest reconciled medication list by a trustworthy date (one dated in the future is not applied)."""
    candidates = [r for r in lists if _is_medication_list(r) and partial_timestamp(r.get("date")) is not None
                  and not today.is_future(partial_timestamp(r.get("date")))]
    return max(candidates, key=lambda r: partial_timestamp(r.get("date"))) if candidates else None  # type: ignore[arg-type,return-value]


def _apply_list(reconciled: Resource, resources: Sequence[Resource], index: ChartIndex) -> None:
    when = partial_timestamp(reconciled.get("date"))
    day = as_written(reconciled.get("date"))
    kept: set[int] = set()
    for entry in objects(reconciled.get("entry")):
        item = index.resolve(entry.get("item"), within=reconciled)
        if item is None:
            continue
        flag = text_of(entry.get("flag")) + " " + " ".join(c for _, c, _ in codings(entry.get("flag")))
        if entry.get("deleted") is True or _STOPPED_FLAGS.search(flag):
            index.medication_state[id(item)] = (NOT_ACTIVE, f"stopped at the medication reconciliation of {day}")
        else:
            kept.add(id(item))
    for r in resources:
        made = _when(r)
        state = index.medication_state[id(r)][0]
        if id(r) not in kept and state in (ACTIVE, UNKNOWN) and (made is None or when is None or made <= when):
            index.medication_state[id(r)] = (NOT_ACTIVE, f"not on the reconciled medication list of {day}")


def _document_entries(index: ChartIndex) -> set[int]:
    """id() of every resource a Composition's sections list (nested sections included)."""
    listed: set[int] = set()
    for composition in (r for r in index.unique() if r.get("resourceType") == "Composition"):
        sections, depth = objects(composition.get("section")), 0
        while sections and depth <= _MAX_SECTION_DEPTH:
            for section in sections:
                listed |= {id(found) for link in objects(section.get("entry"))
                           if (found := index.resolve(link, within=composition)) is not None}
            sections, depth = [s for section in sections for s in objects(section.get("section"))], depth + 1
    return listed


def _listed_by_documents(resources: Sequence[Resource], index: ChartIndex) -> None:
    """A record a document lists, ended by nothing but its own `completed` status, stays on the document's list
    with that status ("listed"), never among the ended records. One that says why it ended (`statusReason`:
    "discontinued at discharge") has ended for that reason."""
    candidates = [r for r in resources if r.get("status") in _LISTED_ENDED and index.medication_state[id(r)] ==
                  (NOT_ACTIVE, "") and r.get("resourceType") != "MedicationAdministration"
                  and not r.get("statusReason")]
    if not candidates:
        return
    listed = _document_entries(index)
    for r in candidates:
        if id(r) in listed:
            index.medication_state[id(r)] = (LISTED, f"listed by the chart's document with status {r['status']}; "
                                                     "whether it is taken now is not stated")


def _mark_stale(records: Sequence[Resource], index: ChartIndex, cutoff: datetime, today: Today) -> None:
    current = [r for r in records if index.medication_state[id(r)][0] == ACTIVE]
    newest = max((w for r in records if (w := _when(r)) is not None), key=today.rank, default=None)
    for r in current:
        made = _when(r)
        if made is not None and newest is not None and newest < cutoff and not index.medication_state[id(r)][1]:
            index.medication_state[id(r)] = (ACTIVE, f"not recently confirmed (last recorded {as_written(started(r))})")


_LEADING_RELEASE = re.compile(r"^\d+(?:\.\d+)?\s*(?:HR|H|ML|MG)\s+", re.IGNORECASE)  # "24 HR metoprolol ..."
_STRENGTH = re.compile(r"[\s,]\d+(?:[.,]\d+)?\s*(?:MG|ML|MCG|µG|UG|UNT|UNITS?|G|%|MEQ|IU|MMOL|MICROGRAMS?|"
                       r"MILLIGRAMS?)(?![A-Za-z])", re.IGNORECASE)


def short_name(name: str) -> str:
    """"Hydrochlorothiazide 25 MG Oral Tablet" -> "Hydrochlorothiazide": the face sheet lists drugs, the
    medication's own fragment keeps strength, dose and route."""
    body = _LEADING_RELEASE.sub("", name.strip())
    return _STRENGTH.split(body, maxsplit=1)[0].strip(" ,;-") or name


def current_names(resources: Sequence[Resource], index: ChartIndex) -> tuple[list[str], list[str]]:
    """(current drugs, drugs of unknown status) for the face sheet: one name each, a stale one marked; a drug a
    document lists with a status that ended it is among the second, named with its status ("Metformin (status
    completed)", `LISTED_STATUS`)."""
    current: dict[str, None] = {}
    unknown: dict[str, None] = {}
    for r in resources:
        state, why = index.medication_state.get(id(r), (NOT_ACTIVE, ""))
        if states_absence(r.get("medicationCodeableConcept"), "medication") or names_no_drug(r, index):
            continue
        name = short_name(drug_name(r, index))
        if state == ACTIVE:
            current[name + ("*" if why.startswith("not recently") else "")] = None
        elif state == UNKNOWN:
            unknown[name] = None
        elif state == LISTED:
            unknown[f"{name}{LISTED_STATUS}{r['status']})"] = None
    confirmed = [n for n in current if not n.endswith("*")]
    current_list = [n for n in current if not (n.endswith("*") and n[:-1] in confirmed)]  # one line per drug
    drugs = {n.split(LISTED_STATUS)[0]: n for n in unknown}
    return current_list, [n for drug, n in drugs.items() if drug not in current and f"{drug}*" not in current]
