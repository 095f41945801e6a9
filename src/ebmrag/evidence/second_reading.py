"""Where the tier rules are unsure: the shapes of a critical fact, and the learned recogniser's answer merged in.

A rule that fires is sure of what its vocabulary names; a text it does not make T1 may still state a critical fact
in words no list holds. Such a text usually keeps a shape that cheap readers see: a drug beside a clinical event
(evidence.adr.scan), a gene (vocab.genes), a stage or grade (the grammar in the rule file), an analyte with a value
(evidence.results), an allergy word. Those texts, and only those (the model costs milliseconds a sentence, the
rules a tenth of one), go to the recogniser (evidence.recogniser). Merging is protective:

- a kind the model confirms is decided as the rule the rule file names for that kind decides (same tier, level and
  flags), recorded as ``model:recogniser:<kind> p=0.93`` with the model's spans as the finding; an allergy or a
  reaction that the negation grammar takes back is never confirmed (vocab.negation: a de-labelled allergy stays
  what the rules made it);
- a shape the model does not confirm, on a text the rules left at T3 or T4, is a *possible critical* fact (a drug
  beside an event only when a reader gives a reaction some weight: `possible_min`): the
  rule file's `possible_tier`, so it is never T4 filler; a drug event, a gene or a stage is standing too (it does
  not expire, so an old one still ranks above the utility pool), an analyte's value is not (a result within its
  range competes by utility; a critical one is the rules' or the model's);
- a rule's T1 is never taken back by the model.

The table lives in the tier rule file (`[recogniser]`), so what each kind means for packing is said once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.adr import AdrMention, Unlinked, allergy_taken_back, link_probability, linked_or_modelled, scan
from ebmrag.evidence.recogniser import Recognition
from ebmrag.evidence.results import ResultMention, result_mentions
from ebmrag.records.fragment import Tier, TierDecision
from ebmrag.text.injection import fold
from ebmrag.vocab.genes import GeneMention, gene_mentions

KINDS = ("allergy", "adr", "pathology", "genetic", "critical_result")
TAKEN_BACK_KINDS = ("allergy", "adr")  # what the negation grammar can take back
POSSIBLE_SHAPES = ("drug_event", "gene", "stage_grade", "analyte_value")  # an allergy word alone is not a fact
LASTING_SHAPES = ("drug_event", "gene", "stage_grade")  # a reaction, a genotype, a cancer's stage do not expire
UNSURE_TIERS = (Tier.T3, Tier.T4)
POSSIBLE_CRITICAL = "possible_critical."  # the rule id prefix of a possible critical fact: "possible_critical.gene"
SHAPE_KINDS = {  # the kinds a text of each shape may state: the model reads it only if it may confirm one of them
    "allergy_word": ("allergy", "adr"), "drug_event": ("adr", "allergy"), "gene": ("genetic", "pathology"),
    "stage_grade": ("pathology",), "analyte_value": ("critical_result",),
}


@dataclass(frozen=True)
class SecondReading:
    """The `[recogniser]` table of the tier rule file: per kind, the decision a confirmed kind takes (the named
    rule's), the tier of a possible critical fact, and the grammars of the shapes the file holds."""

    decisions: Mapping[str, TierDecision]
    possible_tier: Tier
    possible_min: float  # a drug beside an event is possible critical when a reader gives it at least this
    stage_grade: tuple[re.Pattern[str], ...]
    allergy_words: tuple[re.Pattern[str], ...]

    @classmethod
    def parse(cls, table: Any, rules: Mapping[str, TierDecision], path: str) -> SecondReading:
        """`rules`: every rule's decision by id (its flags, no finding)."""
        if not isinstance(table, Mapping):
            raise ConfigError(f"tier rule file {path}: [recogniser] must be a table")
        decisions = {}
        for kind in KINDS:
            rule_id = str(table.get(kind))
            if rule_id not in rules:
                raise ConfigError(f"tier rule file {path}: [recogniser] {kind} must name a rule of the file, "
                                  f"got {rule_id!r}")
            decisions[kind] = rules[rule_id]
        try:
            possible = Tier(table.get("possible_tier", "T2"))
        except ValueError:
            raise ConfigError(f"tier rule file {path}: [recogniser] possible_tier must be T1..T4") from None
        possible_min = table.get("possible_min", 0.2)
        if not isinstance(possible_min, (int, float)) or not 0 <= possible_min <= 1:
            raise ConfigError(f"tier rule file {path}: [recogniser] possible_min must be a probability")
        return cls(decisions, possible, float(possible_min), _patterns(table, "stage_grade", path),
                   _patterns(table, "allergy_words", path))

    def shape(self, text: str) -> str:
        """The first shape of a critical fact the text has ("" for none): what sends it to the model."""
        lowered = fold(text).lower()
        if any(p.search(lowered) for p in self.allergy_words):
            return "allergy_word"
        found, unlinked = drug_events(text)
        if found or unlinked:
            return "drug_event"
        if genes_in(text):
            return "gene"
        if any(p.search(lowered) for p in self.stage_grade):
            return "stage_grade"
        return "analyte_value" if results_in(text) else ""

    def merge(self, text: str, decision: TierDecision, shape: str, recognition: Recognition | None) -> TierDecision:
        """The more protective of the rules' decision and the model's reading (module docstring)."""
        confirmed = [k for k in (recognition.kinds if recognition is not None else ())
                     if k not in TAKEN_BACK_KINDS or not allergy_taken_back(text)]
        if confirmed and recognition is not None:
            kind = min(confirmed, key=lambda k: _rank(self.decisions[k]))
            if _rank(self.decisions[kind]) >= _rank(decision):
                return decision
            return replace(self.decisions[kind], finding=recognition.describe(),
                           rule_id=f"model:recogniser:{kind} p={recognition.probabilities[kind]:.2f}")
        if shape in POSSIBLE_SHAPES and decision.tier in UNSURE_TIERS and self.possible_tier < decision.tier \
                and (shape != "drug_event" or self._doubted(text, recognition)):
            return TierDecision(self.possible_tier, f"{POSSIBLE_CRITICAL}{shape}", standing=shape in LASTING_SHAPES,
                                finding=recognition.describe() if recognition is not None else "")
        return decision

    def _doubted(self, text: str, recognition: Recognition | None) -> bool:
        """A drug beside a clinical event is most often a medication and its indication: possible critical only
        when a reader gives a reaction at least `possible_min` (the recogniser, or without it the ADR model)."""
        if recognition is not None:
            return max(recognition.probabilities.get(k, 0.0) for k in TAKEN_BACK_KINDS) >= self.possible_min
        return link_probability(fold(text).lower()) >= self.possible_min


def worth_reading(shape: str, confirmable: Sequence[str]) -> bool:
    """Whether the model, which may confirm `confirmable` kinds, has anything to say of a text of this shape."""
    return any(kind in confirmable for kind in SHAPE_KINDS.get(shape, ()))


def unsure(decisions: Sequence[TierDecision]) -> list[int]:
    """The decisions the model may still change: every one that is not a rule's T1."""
    return [i for i, d in enumerate(decisions) if d.tier is not Tier.T1]


def _rank(decision: TierDecision) -> tuple[int, int, int]:
    """Lower is more protective: level-1 facts first, then must-keep or critical, then the tier."""
    return (0 if decision.always else 1, 0 if decision.must_keep or decision.critical else 1,
            int(decision.tier.value[1]))


# The readers the tier rules' detectors and the shapes share, memoised per text: the rules read a text first,
# the shape of the same text right after (evidence.tiers), so each reader runs once for it.
@lru_cache(maxsize=4096)
def drug_events(text: str) -> tuple[tuple[AdrMention, ...], tuple[Unlinked, ...]]:
    """evidence.adr.scan: the reactions the grammar links, and the drug-and-reaction clauses it could not."""
    found, unlinked = scan(text)
    return tuple(found), tuple(unlinked)


@lru_cache(maxsize=4096)
def adr_in(text: str) -> tuple[AdrMention, ...]:
    """evidence.adr.adr_mentions (the grammar, then the ADR model on what it could not link)."""
    return tuple(linked_or_modelled(*drug_events(text)))


@lru_cache(maxsize=4096)
def genes_in(text: str) -> tuple[GeneMention, ...]:
    return tuple(gene_mentions(text))


@lru_cache(maxsize=4096)
def results_in(text: str) -> tuple[ResultMention, ...]:
    return tuple(result_mentions(text))


def _patterns(table: Mapping[str, Any], key: str, path: str) -> tuple[re.Pattern[str], ...]:
    raw = table.get(key, [])
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise ConfigError(f"tier rule file {path}: [recogniser] {key} must be a list of regular expressions")
    try:
        return tuple(re.compile(fold(p)) for p in raw)
    except re.error as exc:
        raise ConfigError(f"tier rule file {path}: [recogniser] {key}: {exc}") from None
