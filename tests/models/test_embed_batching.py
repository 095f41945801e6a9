"""How texts are batched for a forward pass: by token count, longest first, a batch ending at `batch_size` texts or
at its padded-token budget, so a short chart's one long note pads a few texts, not all of them."""

from __future__ import annotations

import random

import pytest

from ebmrag.models.embeddings import BATCH_TOKENS, SentenceEmbedder, length_batches


def padded(batch: list[int], lengths: list[int]) -> int:
    return len(batch) * max(lengths[i] for i in batch)


@pytest.mark.parametrize("seed", range(5))
def test_batches_cover_every_text_once_longest_first_within_both_limits(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([3, 5, 12, 40, 128, 256]) + rng.randrange(4) for _ in range(rng.randrange(1, 400))]
    batches = length_batches(lengths, batch_size=64, batch_tokens=512)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    order = [lengths[i] for batch in batches for i in batch]
    assert order == sorted(order, reverse=True)
    for batch in batches:
        assert len(batch) <= 64
        assert padded(batch, lengths) <= 512 or len(batch) == 1  # a text over the budget goes alone


def test_a_short_charts_long_note_pads_only_its_own_batch() -> None:
    """60 texts, one of 256 tokens: batched by characters into one batch of 64, every text padded to 256."""
    lengths = [256] + [12] * 59
    batches = length_batches(lengths, batch_size=64, batch_tokens=512)
    assert batches[0] == [0, 1]  # the note and one short text: 512 padded tokens
    assert sum(padded(b, lengths) for b in batches) <= 512 + 12 * 58
    assert sum(padded(b, lengths) for b in length_batches(lengths, 64, 10**6)) == 60 * 256  # no budget: all padded


def test_equal_lengths_keep_their_order_and_a_budget_below_one_text_still_embeds_it() -> None:
    assert length_batches([4, 4, 4, 4], batch_size=2, batch_tokens=100) == [[0, 1], [2, 3]]
    assert length_batches([30, 20], batch_size=8, batch_tokens=10) == [[0], [1]]
    assert length_batches([], batch_size=8, batch_tokens=10) == []


def test_the_budget_defaults_to_the_runtimes_and_is_checked() -> None:
    assert SentenceEmbedder(runtime="onnx").batch_tokens == BATCH_TOKENS["onnx"]
    assert SentenceEmbedder(runtime="torch", precision="fp32").batch_tokens == BATCH_TOKENS["torch"]
    assert SentenceEmbedder(runtime="onnx", batch_tokens=2048).to_dict()["batch_tokens"] == 2048
    with pytest.raises(ValueError, match="batch_tokens"):
        SentenceEmbedder(batch_tokens=0)
