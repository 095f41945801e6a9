"""What a fragment says and how much it matters: tier rules and the tiering step, the ADR, result and question
recognisers, and entity-preserving compression (the fragment types themselves live in records.fragment)."""

from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision

__all__ = ["Fragment", "PatientRecord", "Tier", "TierDecision"]
