"""The clinical order of critical facts: what the critical-first objective protects, and in which order when
the window cannot hold it all.

1. ALWAYS: drug allergies and serious adverse drug reactions, the face sheet with the allergy status, and what
   the question type needs (evidence.questions), whatever their age. Allergies come first within the level;
   when allergies alone overflow the window, the severe ones first, then the newest (packing.overflow).
2. CURRENT_ENCOUNTER: this visit's critical results, abnormal findings and must-keep facts (pathology,
   genetics, reactions, T1/T2 findings). A result within its reference range is not a finding: it competes by
   utility, so a morning's routine normal lines cannot outnumber one critical sentence.
3. STANDING_HISTORY: pathology, genetics and chronic diagnoses (must-keep or standing T1/T2 findings that are not
   normal results) and critical results from earlier encounters. They never decay and rank above everything that
   is not critical.
4. UTILITY: the rest, by tier weight x similarity x decay.

Within a level, fragments rank by criticality before they are counted (`Rank`): critical (a must-keep fact, a
critical result, a T1 finding) > abnormal (a result outside its range, a possible critical fact) > other. So the
solver never trades one critical fact for several routine ones of the same level.

The level is decided from the tier decision (the rule file says which facts are `always`, `must_keep`,
`standing`, `critical`) and from whether the fragment belongs to the current encounter (packing.utility). A
level is never promoted by the text's own wording beyond what the rules read in it.
"""

from __future__ import annotations

from enum import IntEnum

from ebmrag.evidence.result_flags import ABNORMAL, CRITICAL, NORMAL
from ebmrag.evidence.second_reading import POSSIBLE_CRITICAL
from ebmrag.records.fragment import Tier, TierDecision

FINDING_TIERS = (Tier.T1, Tier.T2)
ALLERGY = "allergy"  # TierDecision.always of a drug allergy or serious adverse reaction


class Level(IntEnum):
    ALWAYS = 1
    CURRENT_ENCOUNTER = 2
    STANDING_HISTORY = 3
    UTILITY = 4


class Rank(IntEnum):
    """Criticality inside a level: counted first, so no number of lower-ranked fragments outweighs one above."""

    OTHER = 0
    ABNORMAL = 1
    CRITICAL = 2


def level_of(decision: TierDecision | None, current: bool) -> Level:
    if decision is None:
        return Level.UTILITY
    if decision.always:
        return Level.ALWAYS
    protected = decision.must_keep or decision.critical
    finding = decision.tier in FINDING_TIERS and decision.flag != NORMAL
    if current and (protected or finding):
        return Level.CURRENT_ENCOUNTER
    if protected or (decision.standing and finding):
        return Level.STANDING_HISTORY
    return Level.UTILITY


def rank_of(decision: TierDecision | None) -> Rank:
    """Critical: a must-keep fact, a critical result, a T1 finding, what level 1 holds; abnormal: a result
    outside its range or a possible critical fact nobody confirmed (evidence.second_reading); other: the rest."""
    if decision is None:
        return Rank.OTHER
    if (decision.always or decision.must_keep or decision.critical or decision.flag == CRITICAL
            or decision.tier is Tier.T1):
        return Rank.CRITICAL
    if decision.flag == ABNORMAL or decision.rule_id.startswith(POSSIBLE_CRITICAL):
        return Rank.ABNORMAL
    return Rank.OTHER


def level_name(decision: TierDecision | None, current: bool) -> str:
    """What the trace calls the level: "allergy", "face_sheet" or "question_need" (level 1),
    "current_encounter", "standing_history", or "" for the rest."""
    level = level_of(decision, current)
    if level is Level.ALWAYS and decision is not None:
        return decision.always
    return {Level.CURRENT_ENCOUNTER: "current_encounter", Level.STANDING_HISTORY: "standing_history"}.get(level, "")
