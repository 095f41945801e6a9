"""Evidence model: patient fragments, their tiers, entity-preserving compression, tokens and embeddings."""

from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision

__all__ = ["Fragment", "PatientRecord", "Tier", "TierDecision"]
