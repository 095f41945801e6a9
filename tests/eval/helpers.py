"""Hand-built measured cases for packing-evaluation tests (no model, exact token costs)."""

from __future__ import annotations

from dataclasses import replace

from ebmrag.eval.cases import EvalCase
from ebmrag.eval.packing_eval import PreparedCase, entity_keys
from ebmrag.evidence.entities import default_extractor
from ebmrag.packing.utility import MeasuredFragment
from ebmrag.records.fragment import Fragment, PatientRecord, Tier, TierDecision


def measured(fid: str, tier: Tier, text: str, tokens: int, compressed: tuple[str, int] | None = None,
             similarity: float = 0.5) -> MeasuredFragment:
    fragment = Fragment(fid, "p", text, decision=TierDecision(tier, "test"))
    header = f"[{fid}]"
    item = MeasuredFragment(fragment, header, f"{header} {text}", tokens, similarity, 0.0)
    if compressed:
        item = replace(item, compressed_line=f"{header} {compressed[0]}", compressed_tokens=compressed[1],
                       compressed_similarity=similarity, fidelity_ratio=1.0)
    return item


def prepared_case(items: list[MeasuredFragment], gold: dict[str, Tier]) -> PreparedCase:
    record = PatientRecord("p", tuple(i.fragment for i in items))
    case = EvalCase("p", "toy", record, "q?", gold, "field")
    extractor = default_extractor()
    keys = {fid: entity_keys(next(i.fragment.text for i in items if i.fragment.id == fid), extractor)
            for fid, tier in gold.items() if tier in (Tier.T1, Tier.T2)}
    return PreparedCase(case, tuple(items), keys, extractor)
