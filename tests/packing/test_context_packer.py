"""End to end with the real bundled model and tokenizer on the shipped demo records."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ebmrag.demo import demo_query, demo_record_paths
from ebmrag.errors import RecordError
from ebmrag.evidence.tiering import Tiering
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.packing.packer import STRATEGIES, ContextPacker, make_packer
from ebmrag.packing.params import PackingParams
from ebmrag.packing.types import EvidenceItem, State
from ebmrag.records.fragment import PatientRecord, Tier
from ebmrag.records.loaders import load_record

pytestmark = pytest.mark.model
COLON = next(p for p in demo_record_paths() if "colon" in p.name)


def test_buried_allergy_and_biopsy_survive_256_while_fifo_loses_them(context_packer: ContextPacker,
                                                                     tiering: Tiering) -> None:
    record, query = tiering.run(load_record(COLON)), demo_query(COLON)
    candidates = context_packer.candidates(record, query)
    exact = make_packer("ebm-exact").pack(candidates, 256)
    fifo = make_packer("fifo").pack(candidates, 256)
    kept = {p.fragment_id: p.state for p in exact.packed}
    assert "pathology-2026-03-10" in kept
    assert kept.get("admission-2026-03-08") in (State.COMPRESSED, State.FACT, State.FULL), "the allergy is packed"
    assert "anaphylaxis to penicillin" in exact.context
    assert {"pathology-2026-03-10", "admission-2026-03-08"} <= {d.fragment_id for d in fifo.dropped}
    assert context_packer.token_counter.count(exact.context) <= 256


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("window", [64, 256, 1024])
def test_every_strategy_respects_the_window_in_real_tokens(
    context_packer: ContextPacker, tiering: Tiering, strategy: str, window: int
) -> None:
    for path in demo_record_paths():
        candidates = context_packer.candidates(tiering.run(load_record(path)), demo_query(path))
        result = make_packer(strategy, context_packer.token_counter).pack(candidates, window)
        assert context_packer.token_counter.count(result.context) <= window
        assert len(result.packed) + len(result.dropped) == len(candidates)


def test_standing_facts_do_not_decay(context_packer: ContextPacker, tiering: Tiering) -> None:
    record, query = tiering.run(load_record(COLON)), demo_query(COLON)
    now = context_packer.candidates(record, query)
    later = context_packer.candidates(record, query, as_of=datetime(2036, 3, 14, tzinfo=UTC))
    utility = {c.fragment.id: c.full.utility for c in now}
    aged = {c.fragment.id: c.full.utility for c in later}
    assert aged["admission-2026-03-08"] == pytest.approx(utility["admission-2026-03-08"])
    assert aged["pathology-2026-03-10"] == pytest.approx(utility["pathology-2026-03-10"])
    assert aged["labs-2026-03-13"] < utility["labs-2026-03-13"] * 1e-6, "episodic labs fade over ten years"


def test_compressed_state_only_for_objective_tiers(context_packer: ContextPacker, tiering: Tiering) -> None:
    for path in demo_record_paths():
        for candidate in context_packer.candidates(tiering.run(load_record(path)), demo_query(path)):
            states = [o.state for o in candidate.options]
            assert states[0] is State.FULL
            if State.COMPRESSED in states:
                assert candidate.tier in (Tier.T1, Tier.T2)
                assert candidate.options[1].tokens < candidate.full.tokens


def test_empty_query_is_an_error(context_packer: ContextPacker, tiering: Tiering) -> None:
    with pytest.raises(ValueError, match="query is empty"):
        context_packer.run(tiering.run(load_record(COLON)), "  ", 256)


def test_the_packer_packs_what_it_is_given_and_refuses_untiered_input(context_packer: ContextPacker,
                                                                       tiering: Tiering) -> None:
    """Tiering is the step before packing: a fragment or evidence item without a decision is an error naming it,
    never tiered on the side."""
    record = load_record(COLON)
    for packs in (lambda: context_packer.run(record, "antibiotic?", 256),
                  lambda: context_packer.candidates(record, "antibiotic?"), lambda: context_packer.prepare(record)):
        with pytest.raises(RecordError, match=r"have no tier decision \('.+'.*\); .*Tiering"):
            packs()
    half = tiering.run(PatientRecord(record.patient_id, record.fragments[:2])).fragments + record.fragments[2:]
    with pytest.raises(RecordError, match=rf"{len(record.fragments) - 2} of {len(record.fragments)} fragments"):
        context_packer.run(PatientRecord(record.patient_id, half), "antibiotic?", 256)
    with pytest.raises(ValueError, match="evidence items without a tier decision: 'kb:1'"):
        context_packer.run(None, "antibiotic?", 256, evidence=[EvidenceItem("kb:1", "Amoxicillin is first line.")])
    assert context_packer.run(tiering.run(record), "antibiotic?", 256).packed


def test_embedding_cache_persists(tmp_path: Path) -> None:
    embedder = SentenceEmbedder(cache_dir=tmp_path)
    first = embedder.embed(["penicillin anaphylaxis", "creatinine 2.8 mg/dL", "penicillin anaphylaxis"])
    assert first.shape == (3, 384)
    assert abs(float(first[0] @ first[0]) - 1.0) < 1e-5, "normalized"
    assert (first[0] == first[2]).all()
    reopened = SentenceEmbedder(cache_dir=tmp_path)
    again = reopened.embed(["creatinine 2.8 mg/dL"])
    assert reopened._model is None, "served from the disk cache without loading the model"
    assert (again[0] == first[1]).all()


def test_local_model_path_loads(tmp_path: Path) -> None:
    from ebmrag.models.tokens import bundled_model_dir

    embedder = SentenceEmbedder(model_path=bundled_model_dir())
    assert embedder.embed(["hello"]).shape == (1, 384)


def test_packer_round_trips(context_packer: ContextPacker) -> None:
    packer = context_packer.with_params(PackingParams(strategy="ebm-greedy", k_min=2))
    assert context_packer.with_params(PackingParams(**packer.to_dict())).to_dict() == packer.to_dict()
    with pytest.raises(ValueError, match="unknown packing strategy"):
        context_packer.with_params(PackingParams(strategy="random"))


@pytest.mark.slow
def test_bf16_and_int8_profiles_stay_close_to_fp32_and_cache_apart(tmp_path: Path) -> None:
    texts = ["Biopsy of the cervical node shows diffuse large B-cell lymphoma.", "Penicillin causes anaphylaxis."]
    fp32 = SentenceEmbedder(max_tokens=128, precision="fp32", cache_dir=tmp_path)
    bf16 = SentenceEmbedder(max_tokens=128, precision="bf16", cache_dir=tmp_path)
    int8 = SentenceEmbedder(max_tokens=128, precision="int8", cache_dir=tmp_path)
    reference = fp32.embed(texts)
    assert len({fp32.model_name, bf16.model_name, int8.model_name}) == 3, "profiles never share cache entries"
    assert (reference * bf16.embed(texts)).sum(axis=1).min() > 0.999
    assert (reference * int8.embed(texts)).sum(axis=1).min() > 0.9
    assert SentenceEmbedder.from_dict(bf16.to_dict()).model_name == bf16.model_name
    with pytest.raises(ValueError, match="precision must be one of"):
        SentenceEmbedder(precision="fp8")
