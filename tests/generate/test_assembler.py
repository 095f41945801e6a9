from __future__ import annotations

import pytest

from ebmrag.generate.assembler import ContextAssembler, edges_first, jaccard, word_set
from ebmrag.index.types import SearchHit
from ebmrag.models.tokens import make_token_counter

COUNTER = make_token_counter("bundled")


def hit(chunk_id: str, text: str, score: float, doc_id: str | None = None) -> SearchHit:
    doc = doc_id or chunk_id.split("#")[0]
    return SearchHit(chunk_id, doc, score, "", text, "guides", "", 0, len(text), "", "")


SEPSIS = "Give broad-spectrum antibiotics within one hour of recognising septic shock."
SEPSIS_TWIN = "Give broad-spectrum antibiotics within one hour of recognising a septic shock."
AKI = "Stop metformin when the creatinine rises. Review contrast exposure. Repeat the creatinine in 48 hours."


def test_dedup_source_cap_and_the_fixed_shape() -> None:
    hits = [hit("a#0", SEPSIS, 0.9), hit("b#0", SEPSIS_TWIN, 0.8), hit("c#0", AKI, 0.7)]
    hits += [hit(f"d#{i}", f"Guideline point number {i} about fluids.", 0.5 - i / 100, "d") for i in range(5)]
    result = ContextAssembler(COUNTER, 1000).run(hits)
    assert [s.hit.chunk_id for s in result.selected] == ["a#0", "c#0", "d#0", "d#1", "d#2"]
    assert dict(result.skipped) == {"b#0": "near-duplicate of a#0", "d#3": "already 3 chunks from d",
                                    "d#4": "already 3 chunks from d"}
    data = result.to_json()
    assert set(data) == {"context_text", "metadata", "selected_chunks"}
    assert data["metadata"] == {"total_chunks_retrieved": 8, "unique_chunks_after_dedup": 7, "chunks_selected": 5,
                                "estimated_tokens": COUNTER.count(result.context_text),
                                "chunk_sources": {"a": 1, "c": 1, "d": 3}}
    assert result.context_text.startswith("[1] Give broad-spectrum")
    assert jaccard(word_set(SEPSIS), word_set(SEPSIS_TWIN)) >= 0.8


def test_budget_cuts_at_a_sentence_end_or_leaves_the_chunk_out() -> None:
    first = COUNTER.count(f"[1] {SEPSIS}")
    two_sentences = COUNTER.count("[2] Stop metformin when the creatinine rises. Review contrast exposure.")
    budget = first + two_sentences
    result = ContextAssembler(COUNTER, budget).run([hit("a#0", SEPSIS, 0.9), hit("c#0", AKI, 0.8)])
    cut = result.selected[1]
    assert cut.truncated and cut.text == "Stop metformin when the creatinine rises. Review contrast exposure."
    assert result.estimated_tokens <= budget
    # room for one short sentence only, far from the end of what fits: better left out than cut early
    tight = ContextAssembler(COUNTER, first + COUNTER.count("[2] Stop metformin when the creatinine") + 1)
    left_out = tight.run([hit("a#0", SEPSIS, 0.9), hit("c#0", AKI, 0.8)])
    assert [s.hit.chunk_id for s in left_out.selected] == ["a#0"]
    assert dict(left_out.skipped)["c#0"] == "no room left for a whole sentence"


def test_edges_first_ordering_and_validation() -> None:
    assert edges_first([1, 2, 3, 4, 5]) == [1, 3, 5, 4, 2]
    hits = [hit(f"x{i}#0", f"Distinct evidence sentence number {i} here.", 1 - i / 10) for i in range(4)]
    result = ContextAssembler(COUNTER, 500, ordering="edges_first").run(hits)
    assert [s.hit.chunk_id for s in result.selected] == ["x0#0", "x2#0", "x3#0", "x1#0"]
    assert [s.number for s in result.selected] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="ordering"):
        ContextAssembler(COUNTER, 100, ordering="middle")
    with pytest.raises(ValueError, match="budget_tokens"):
        ContextAssembler(COUNTER, 0)
