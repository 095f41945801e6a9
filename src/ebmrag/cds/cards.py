"""CDS Hooks cards that state what the chart says and cite it: the allergy of the ordered drug's class, the renal
function for a renally cleared drug, a current pregnancy, critical results of the last hours.

A card never says what the chart does not: every value, date and word it shows is the chart's (or the
clinician-readable tables' of ehr/data), every fact names its resource and record fragment, and no card advises a
dose or a choice. Chart text is quoted as data: markdown and HTML characters are escaped, control characters and
line breaks folded, long text cut, so an allergy's free text cannot format, link or instruct anything in the EHR.
The summary is plain text under 140 characters (CDS Hooks 2.0, "Card Attributes"). A date the chart wrote after
the present is shown flagged ("date in the future: 2062-03-01"), and such a fact is never the one a card calls the
newest (cds.facts).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.cds.facts import AllergyFact, Cited, LabFact, PregnancyFact
from ebmrag.rules import rule_file
from ebmrag.vocab.drugs import DrugVocabulary, Identity, Relation, RenalGroup, Uncompared

SOURCE_LABEL = "ebmrag chart review"
TOPICS = "https://ebmrag.dev/cds-hooks/topics"
MAX_SUMMARY = 139  # "<140-character summary"
MAX_QUOTE = 300  # characters of one quoted chart text
_CARD_NAMESPACE = uuid.UUID("6f1c9a52-3f0e-4a55-9d7b-3c2d1e0a8b17")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&])")
_FOLD = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\s]+")
FOOTER = "_This card repeats what the chart records; it gives no dosing or prescribing advice._"


@dataclass(frozen=True)
class Order:
    """One drug order of the hook's context: its reference (`MedicationRequest/7`), its name as the order says it,
    and what it names."""

    reference: str
    name: str
    identity: Identity


@dataclass(frozen=True)
class Card:
    kind: str  # "allergy", "related-allergy", "renal", "pregnancy", "critical-result"
    indicator: str  # info | warning | critical
    summary: str
    detail: str
    cited: tuple[Cited, ...]
    uuid: str

    def to_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "summary": self.summary, "detail": self.detail, "indicator": self.indicator,
                "source": {"label": SOURCE_LABEL, "topic": {"system": TOPICS, "code": self.kind,
                                                            "display": _TOPIC_NAMES[self.kind]}}}

    @property
    def fragments(self) -> tuple[str, ...]:
        return tuple(c.fragment for c in self.cited if c.fragment)


_TOPIC_NAMES = {"allergy": "Allergy to the ordered drug or its class",
                "related-allergy": "Allergy to a related drug class",
                "renal": "Renal function for a renally cleared drug", "pregnancy": "Pregnancy recorded",
                "critical-result": "Critical result", "left-out": "Chart data not read: not this patient's",
                "uncompared-allergy": "Allergy check not possible (codes not recognised)"}
_KIND_WORDS = {"AllergyIntolerance": ("allergy record", "allergy records"), "Observation": ("observation",
               "observations"), "Condition": ("condition", "conditions")}


def quote(text: str, limit: int = MAX_QUOTE) -> str:
    """Chart text as inert markdown: one line, every markdown and HTML character escaped, cut at `limit`."""
    folded = _FOLD.sub(" ", text).strip()
    if len(folded) > limit:
        folded = folded[:limit - 1].rstrip() + "…"
    return _MARKDOWN.sub(r"\\\1", folded)


def code(text: str) -> str:
    """An id as a markdown code span: taken literally by the reader, so only backticks (which would end the span)
    and line breaks are taken out."""
    return "`" + _FOLD.sub(" ", text.replace("`", "'")).strip()[:200] + "`"


def plain(text: str, limit: int = MAX_SUMMARY) -> str:
    """A summary: one line of plain text under 140 characters."""
    folded = _FOLD.sub(" ", text).strip()
    return folded if len(folded) <= limit else folded[:limit - 1].rstrip(" ,;:-—") + "…"


def card_id(*parts: str) -> str:
    """The same call and the same facts give the same uuid (feedback names cards by it); another call, another."""
    return str(uuid.uuid5(_CARD_NAMESPACE, "\x1f".join(parts)))


def source_line(cited: Cited) -> str:
    where = code(cited.label)
    when = f", {quote(cited.shown_date)}" if cited.date else ""
    fragment = f"; record fragment {code(cited.fragment)}" if cited.fragment else ""
    return f"Source: {where}{when}{fragment}."


# ------------------------------------------------------------------------------------------------ allergy
@dataclass(frozen=True)
class AllergyRisk:
    """rules/records/allergy_risk.toml: what makes a recorded allergy one whose re-exposure may be life-threatening."""

    criticality: frozenset[str]
    severity: frozenset[str]
    reactions: re.Pattern[str]


@rule_file("records/allergy_risk.toml")
def allergy_risk(raw: Mapping[str, Any]) -> AllergyRisk:
    if not raw["reactions"]:
        raise ValueError("`reactions` must list at least one pattern")
    return AllergyRisk(frozenset(raw["criticality"]), frozenset(raw["severity"]),
                       re.compile("|".join(f"(?:{p})" for p in raw["reactions"]), re.IGNORECASE))


def life_threatening(fact: AllergyFact, *, by_severity: bool = True) -> str:
    """Why re-exposure after this allergy may be life-threatening, in the chart's terms ("criticality high",
    "reaction: Anaphylaxis"), or "" when the chart says nothing of the kind. `by_severity`: whether a severe
    reaction alone counts (it does for the ordered drug's own allergy, not for a related class's)."""
    risk, entry = allergy_risk(), fact.entry
    reaction = next((r for r in entry.reactions if risk.reactions.search(r)), "")
    said = [f"criticality {entry.criticality}" if entry.criticality in risk.criticality else "",
            f"{entry.severity} reaction" if by_severity and entry.severity in risk.severity else "",
            f"reaction: {reaction}" if reaction else ""]
    return ", ".join(s for s in said if s)


def allergy_card(instance: str, order: Order, found: Sequence[tuple[AllergyFact, Relation]],
                 vocabulary: DrugVocabulary, left_out: int = 0) -> Card | None:
    """One card per order: a warning when a current allergy names the ordered drug, its class or a family that
    holds it, critical when that allergy's re-exposure may be life-threatening (`life_threatening`: anaphylaxis, a
    severe reaction, high criticality); else an info card for an allergy to a related class (a warning after
    anaphylaxis or with high criticality), or one marked resolved or inactive (info).
    `left_out`: allergy records of the hook's data that were not read (not this patient's by reference); the
    card says so beside what it claims the chart does not record."""
    if not found:
        return None
    same = [(a, r) for a, r in found if r.same and a.current]
    shown = same or list(found)
    allergy, relation = shown[0]
    warning = bool(same)
    kind = "allergy" if warning else "related-allergy"
    dangers = [(fact, danger) for fact, _ in shown
               if fact.current and (danger := life_threatening(fact, by_severity=warning))]
    indicator = ("critical" if dangers else "warning") if warning else ("warning" if dangers else "info")
    reaction = ", ".join(allergy.entry.reactions[:2]) or "allergy"
    extra = " (high criticality)" if allergy.entry.criticality == "high" else ""
    when = f" recorded {_on(allergy.cited)}" if allergy.cited.date else ""
    more = f" (+{len(shown) - 1} more)" if len(shown) > 1 else ""
    if warning:
        summary = f"Allergy: {relation.shared} — {reaction}{extra}{when}{more}"
    elif relation.kind == "related":
        summary = f"Related allergy: {relation.allergy_class} recorded; {order.name} is in the {relation.order_class}"
    else:
        summary = f"Allergy marked {allergy.entry.clinical_status}: {relation.shared} — {reaction}{when}{more}"
    lines = [f"**Ordered:** {quote(order.name)} ({code(order.reference)})", ""]
    for fact, why in shown:
        lines += [f"**The chart records:** {_allergy_words(fact)}", "", f"**Why this card:** "
                  f"{_why(why, order, vocabulary)}", "", source_line(fact.cited), ""]
    if dangers:
        lines += [f"**Why {indicator}:** the chart records {quote(dangers[0][1])} for this allergy: re-exposure may "
                  "be life-threatening.", ""]
    if left_out:
        lines += [f"**Not read:** {_counted(left_out, 'AllergyIntolerance')} of the hook's data that do not name "
                  "this patient by reference; the chart may record more than this card shows.", ""]
    lines.append(FOOTER)
    cited = tuple(a.cited for a, _ in shown)
    return Card(kind, indicator, plain(summary), "\n".join(lines), cited,
                card_id(instance, kind, order.reference, *(c.label for c in cited)))


def uncompared_card(instance: str, order: Order, unread: Sequence[tuple[AllergyFact, Uncompared]]) -> Card:
    """An info card when an order and a current allergy could not be compared: one of them is written only in codes
    ebmrag's drug tables do not hold. Silence would read as "no allergy to this drug"; the card says the check
    was not done and cites what could not be read."""
    side, codes = unread[0][1].side, [c for _, why in unread for c in why.codes]
    shown = ", ".join(f"{system} {value}" for system, value in dict.fromkeys(codes))
    count = f"{len(unread)} recorded allerg{'y' if len(unread) == 1 else 'ies'}"
    if side == "order":
        summary = f"Allergy check not done: {order.name} is coded only ({shown}); compare with {count}"
    else:
        summary = f"Allergy check not done: {count} coded only ({shown}) for {order.name}"
    what = {"order": "the order names", "allergy": "the recorded allergy names", "both": "the order and the allergy "
            "name"}
    lines = [f"**Ordered:** {quote(order.name)} ({code(order.reference)})", ""]
    for fact, why in unread:
        written = ", ".join(f"{system} {value}" for system, value in why.codes)
        lines += [f"**The chart records:** {_allergy_words(fact)}", "",
                  f"**Why this card:** {what.get(why.side, 'the entries name')} no drug, only {code(written)}, which "
                  "ebmrag's drug tables do not hold; compare them by hand.", "", source_line(fact.cited), ""]
    lines.append(FOOTER)
    cited = tuple(fact.cited for fact, _ in unread)
    return Card("uncompared-allergy", "info", plain(summary), "\n".join(lines), cited,
                card_id(instance, "uncompared-allergy", order.reference, *(c.label for c in cited)))


def _allergy_words(fact: AllergyFact) -> str:
    parts = [f"allergy or intolerance to “{quote(fact.entry.substance or 'an unnamed substance')}”"]
    if fact.entry.reactions:
        parts.append("reaction: " + "; ".join(quote(r) for r in fact.entry.reactions[:4])
                     + (f" ({quote(fact.entry.severity)})" if fact.entry.severity else ""))
    parts += [f"{label}: {quote(value)}" for label, value in (
        ("criticality", fact.entry.criticality), ("clinical status", fact.entry.clinical_status or "not recorded"),
        ("verification", fact.entry.verification or "not recorded")) if value]
    return "; ".join(parts) + "."


def _why(relation: Relation, order: Order, vocabulary: DrugVocabulary) -> str:
    if relation.kind == "ingredient":
        return f"the ordered drug contains {quote(relation.shared)}, which the recorded allergy names."
    if relation.kind == "name":
        return f"the order and the recorded allergy name the same drug, {quote(relation.shared)}."
    groups = ", ".join(_atc_of(order.identity, vocabulary)) or "see ebmrag's drug class table"
    drug = ", ".join(sorted(order.identity.ingredients)) or "the ordered drug"
    if relation.kind == "class":
        return (f"{quote(drug)} is in the {quote(relation.order_class)} (WHO ATC {groups}); the recorded allergy "
                f"names the {quote(relation.shared)}.")
    return (f"{quote(drug)} is in the {quote(relation.order_class)} (WHO ATC {groups}) and the recorded allergy is "
            f"to the {quote(relation.allergy_class)}; both are {quote(relation.shared)}. The chart records no "
            f"current allergy to the {quote(relation.order_class)} itself.")


def _atc_of(identity: Identity, vocabulary: DrugVocabulary) -> list[str]:
    return sorted({group for c in identity.classes for group in vocabulary.classes[c].atc})


def _on(cited: Cited) -> str:
    """"2024-05-01", or "(date in the future: 2062-05-01)" after a word such as "recorded"."""
    return f"({cited.shown_date})" if cited.future else cited.date


# ------------------------------------------------------------------------------------------------ renal
def renal_card(instance: str, order: Order, group: RenalGroup, results: Sequence[LabFact],
               left_out: int = 0) -> Card:
    """The chart's newest renal results for a drug of the renal list: `warning` when the laboratory flags one
    outside its range, `info` otherwise, and `info` saying so when the chart holds none. `left_out`: observations
    of the hook's data that were not read (not this patient's by reference): then the card claims no absence and
    no "newest", it says what was read and what was left out. Results dated in the future are listed apart,
    flagged; they speak for the card only when the chart holds no other."""
    drug = group.ingredient
    not_read = _counted(left_out, "Observation")
    trusted = [r for r in results if not r.future]
    ahead = [r for r in results if r.future]
    shown = trusted or ahead
    if not results and left_out:
        summary = f"Renal function for {drug}: no creatinine or eGFR read; {not_read} not read (not this patient's)"
        detail = [f"**Ordered:** {quote(order.name)} ({code(order.reference)})", "",
                  "**Of what was read,** no result is a creatinine, eGFR or creatinine clearance.", ""]
    elif not results:
        summary = f"Renal function for {drug}: no creatinine or eGFR in the chart"
        detail = [f"**Ordered:** {quote(order.name)} ({code(order.reference)})", "",
                  "**The chart holds** no creatinine, eGFR or creatinine clearance result.", ""]
    else:
        said = "; ".join(f"{r.result.name} {r.result.value}" + (f" ({r.cited.shown_date})" if r.cited.date else "")
                         for r in shown)
        summary = f"Renal function for {drug}: {said}"
        detail = [f"**Ordered:** {quote(order.name)} ({code(order.reference)})", ""]
        if trusted:
            detail += ["**The chart's newest renal results:**", ""] + [_result_line(r) for r in trusted] + [""]
        if ahead:
            detail += ["**Dated in the future** (a date after today: not taken as the newest; check the date):",
                       ""] + [_result_line(r) for r in ahead] + [""]
    if left_out:
        detail += [f"**Not read:** {not_read} of the hook's data that do not name this patient by reference; a "
                   "renal result, or a newer one, may be among them.", ""]
    detail += [f"**Why this card:** {quote(drug)} is on ebmrag's list of drugs whose labelling ties use or dose to "
               f"renal function ({quote(group.name)}).", "", FOOTER]
    flagged = any(r.result.abnormal for r in shown)
    cited = tuple(r.cited for r in results)
    return Card("renal", "warning" if flagged else "info", plain(summary), "\n".join(detail), cited,
                card_id(instance, "renal", order.reference, *(c.label for c in cited)))


def _result_line(r: LabFact) -> str:
    flags = f"; laboratory flag: {quote(r.result.flags)}" if r.result.flags else ""
    ranges = f"; reference range {quote(r.result.reference_range)}" if r.result.reference_range else ""
    written = r.result.time or r.cited.date
    when = f" ({quote(r.cited.shown_date)})" if r.future else f" on {quote(written)}" if written else " (undated)"
    critical = f"; {quote(r.critical)}" if r.critical else ""
    return (f"- {quote(r.result.test)}: **{quote(r.result.value)}**{when}{flags}{ranges}{critical}. "
            + source_line(r.cited))


# ------------------------------------------------------------------------------------------------ pregnancy
def pregnancy_card(instance: str, orders: Sequence[Order], fact: PregnancyFact) -> Card:
    due = f"; estimated due date {fact.due_date}" if fact.due_date else ""
    when = f" ({fact.cited.shown_date})" if fact.cited.date else ""
    summary = f"Pregnancy recorded: {fact.said}{when}{due}"
    names = ", ".join(f"{quote(o.name)} ({code(o.reference)})" for o in orders)
    detail = [f"**Ordered:** {names}", "", f"**The chart records:** {quote(fact.said)}{quote(when)}.",
              source_line(fact.cited), ""]
    cited = [fact.cited]
    if fact.due_date and fact.due_cited is not None:
        detail += [f"**Estimated due date:** {quote(fact.due_date)}.", source_line(fact.due_cited), ""]
        cited.append(fact.due_cited)
    if fact.ahead is not None:
        later, words = fact.ahead
        detail += [f"**Dated in the future** (a date after today: not taken as current; check the date): "
                   f"{quote(words)}.", source_line(later), ""]
        cited.append(later)
    detail += ["**Why this card:** a medication is being ordered and the chart records a current pregnancy.", "",
               FOOTER]
    return Card("pregnancy", "warning", plain(summary), "\n".join(detail), tuple(cited),
                card_id(instance, "pregnancy", *(o.reference for o in orders), *(c.label for c in cited)))


# ------------------------------------------------------------------------------------------------ critical
def critical_card(instance: str, results: Sequence[LabFact], hours: float) -> Card:
    first = results[0]
    span = f"{hours:g} h"
    if len(results) == 1:
        summary = f"Critical result in the last {span}: {first.result.test} {first.result.value} ({first.critical})"
    else:
        summary = f"{len(results)} critical results in the last {span}: " + "; ".join(
            f"{r.result.test} {r.result.value}" for r in results)
    detail = [f"**Critical results the chart holds from the last {span}:**", ""]
    detail += [_result_line(r) for r in results] + ["", FOOTER]
    cited = tuple(r.cited for r in results)
    return Card("critical-result", "critical", plain(summary), "\n".join(detail), cited,
                card_id(instance, "critical-result", *(c.label for c in cited)))


# ------------------------------------------------------------------------------------------------ left out
def left_out_card(instance: str, left_out: Mapping[str, int], read: Sequence[str]) -> Card | None:
    """A warning that the review is incomplete, when resources of a type this hook's cards read (`read`) were
    left out for not naming the patient by reference: the other cards are silent about what those hold, and an
    allergy or result given with an identifier alone may well be this patient's. Counts only, no chart text."""
    shown = {kind: n for kind, n in sorted(left_out.items()) if kind in read}
    if not shown:
        return None
    counted = ", ".join(_counted(n, kind) for kind, n in shown.items())
    everything = ", ".join(f"{n} {code(kind)}" for kind, n in sorted(left_out.items()))
    detail = [f"**Not read:** {everything}.", "",
              "**Why:** ebmrag reads a resource of the hook's data only when its patient (or subject) is a "
              "reference to this patient on the hook's FHIR server. These name another patient, only an identifier "
              "or a name, another server, or no one. The other cards say nothing of what they hold: no allergy, "
              "result or condition among them was checked.", "", FOOTER]
    return Card("left-out", "warning", plain(f"Not checked: {counted} that do not name this patient by reference"),
                "\n".join(detail), (), card_id(instance, "left-out", *(f"{k}:{n}" for k, n in shown.items())))


def _counted(number: int, kind: str) -> str:
    one, many = _KIND_WORDS.get(kind, (kind, kind))
    return f"{number} {one if number == 1 else many}"
