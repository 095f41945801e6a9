"""The tiering step: one patient's fragments in, the same fragments with their tier decisions out.

    chart -> fragments -> tiers (and their findings) -> gate -> retrieve -> pack -> generate

Each fragment leaves with a `TierDecision`: its tier, the rule (or model) that decided it, and what a detector
found (`finding`: an adverse reaction, a result, a critical value), which the gate, the packer's levels and the
brief read from the fragment. Tiering is a step of its own, not something the packer does on the side: the
composition root builds it once (`compose.build_tiering`) and hands it to every caller that needs tiers (the
answer engine, `ebmrag pack`, the framework drop-ins, the evaluation, the service), and the packer refuses a
fragment that has not been through it.

A fragment that already carries a decision keeps it: a record tiered once (at the gate) is not tiered again, and
a decision the caller made (a knowledge-base chunk graded by its authority) stands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import PatientRecord, TierDecision


class Tiering:
    """Pipeline step: `run(record)` -> the record with every fragment's tier decision and finding set.

    It receives the tier classifier (rules, the optional learned model and the on-disk store of decisions) from
    the composition root (`compose.Resources.tier_classifier`); it never builds one of its own."""

    def __init__(self, classifier: TierClassifier) -> None:
        if classifier is None:
            raise ValueError("Tiering needs a TierClassifier (the composition root's: compose.Resources)")
        self.classifier = classifier

    def run(self, record: PatientRecord) -> PatientRecord:
        """Decisions for the fragments that have none yet, in one batch; the record itself when all have one."""
        todo = [f for f in record.fragments if f.decision is None]
        if not todo:
            return record
        decided = dict(zip((f.id for f in todo), self.decide([(f.text, f.section) for f in todo]), strict=True))
        return record.replace_fragments(f.with_decision(decided[f.id]) if f.id in decided else f
                                        for f in record.fragments)

    def decide(self, items: Sequence[tuple[str, str | None]]) -> list[TierDecision]:
        """One decision per (text, section): for text that is not a chart's fragment (the research agent's
        observations), which the packer takes beside the record."""
        return self.classifier.classify_many(items)

    def to_dict(self) -> dict[str, Any]:
        """The classifier's rule file and model (`TierClassifier.to_dict`)."""
        return {"classifier": self.classifier.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], classifier: TierClassifier | None = None) -> Tiering:
        """`classifier`: built by the caller when `data` names a model (a model may need the embedder: see
        compose.resources); one of rules only is rebuilt here from its rule file."""
        spec = data.get("classifier") or {}
        if classifier is None:
            if spec.get("model_path"):
                raise ValueError(f"a tier classifier with a model ({spec['model_path']}) must be passed in built "
                                 "(it may need the embedder)")
            classifier = TierClassifier.from_dict(spec)
        return cls(classifier)
