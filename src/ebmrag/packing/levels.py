"""The clinical order of critical facts: what the critical-first objective protects, and in which order when
the window cannot hold it all.

1. ALWAYS: drug allergies and serious adverse drug reactions, the face sheet with the allergy status, and what
   the question type needs (evidence.questions), whatever their age. Allergies come first within the level;
   when allergies alone overflow the window, the severe ones first, then the newest (packing.overflow).
2. CURRENT_ENCOUNTER: this visit's T1/T2 findings (pathology, genetics, labs, imaging) and critical results.
3. STANDING_HISTORY: pathology, genetics and chronic diagnoses (must-keep or standing T1/T2) and critical
   results from earlier encounters. They never decay and rank above everything that is not critical.
4. UTILITY: the rest, by tier weight x similarity x decay.

The level is decided from the tier decision (the rule file says which facts are `always`, `must_keep`,
`standing`, `critical`) and from whether the fragment belongs to the current encounter (packing.utility). A
level is never promoted by the text's own wording beyond what the rules read in it.
"""

from __future__ import annotations

from enum import IntEnum

from ebmrag.records.fragment import Tier, TierDecision

FINDING_TIERS = (Tier.T1, Tier.T2)
ALLERGY = "allergy"  # TierDecision.always of a drug allergy or serious adverse reaction


class Level(IntEnum):
    ALWAYS = 1
    CURRENT_ENCOUNTER = 2
    STANDING_HISTORY = 3
    UTILITY = 4


def level_of(decision: TierDecision | None, current: bool) -> Level:
    if decision is None:
        return Level.UTILITY
    if decision.always:
        return Level.ALWAYS
    protected = decision.must_keep or decision.critical
    if current and (protected or decision.tier in FINDING_TIERS):
        return Level.CURRENT_ENCOUNTER
    if protected or (decision.standing and decision.tier in FINDING_TIERS):
        return Level.STANDING_HISTORY
    return Level.UTILITY


def level_name(decision: TierDecision | None, current: bool) -> str:
    """What the trace calls the level: "allergy", "face_sheet" or "question_need" (level 1),
    "current_encounter", "standing_history", or "" for the rest."""
    level = level_of(decision, current)
    if level is Level.ALWAYS and decision is not None:
        return decision.always
    return {Level.CURRENT_ENCOUNTER: "current_encounter", Level.STANDING_HISTORY: "standing_history"}.get(level, "")
