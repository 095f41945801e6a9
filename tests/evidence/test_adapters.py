from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ebmrag.errors import ModelUnavailableError
from ebmrag.models.adapters import NAMED_DELTAS, load_delta, resolve_delta, save_delta
from ebmrag.models.embeddings import SentenceEmbedder


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3, bias=False)


def test_delta_round_trip_and_merge(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=(3, 2)).astype(np.float32)
    path = tmp_path / "d.npz"
    save_delta(path, {"proj": (a, b)}, {"rank": 2})
    delta = load_delta(path)
    assert delta.meta["rank"] == 2 and delta.meta["layers"] == ["proj"] and len(delta.digest) == 12
    module = Tiny()
    before = module.proj.weight.detach().clone()
    delta.apply(module)
    merged = before.numpy() + b.astype(np.float16).astype(np.float32) @ a.astype(np.float16).astype(np.float32)
    assert np.allclose(module.proj.weight.detach().numpy(), merged, atol=1e-5)
    assert not list(tmp_path.glob("*.partial"))


def test_wrong_model_or_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    save_delta(path, {"other": (np.zeros((2, 4)), np.zeros((3, 2)))}, {})
    with pytest.raises(ModelUnavailableError, match="no layer 'other'"):
        load_delta(path).apply(Tiny())
    save_delta(path, {"proj": (np.zeros((2, 5)), np.zeros((3, 2)))}, {})
    with pytest.raises(ModelUnavailableError, match="layer proj is"):
        load_delta(path).apply(Tiny())
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ModelUnavailableError, match="not an ebmrag low-rank delta"):
        load_delta(tmp_path / "bad.npz")
    with pytest.raises(ModelUnavailableError, match="not found"):
        SentenceEmbedder(tmp_path / "missing.npz")
    with pytest.raises(ModelUnavailableError, match="named profile"):
        SentenceEmbedder("no-such-profile")


def test_named_profile_resolves_to_the_shipped_file() -> None:
    assert resolve_delta("minilm-medquad") == NAMED_DELTAS["minilm-medquad"]
    assert NAMED_DELTAS["minilm-medquad"].is_file()
    assert resolve_delta("/models/folder") is None


@pytest.mark.model
def test_a_delta_changes_vectors_and_the_cache_name(tmp_path: Path) -> None:
    base = SentenceEmbedder(precision="fp32")
    zero = tmp_path / "zero.npz"
    save_delta(zero, {"encoder.layer.0.attention.self.query": (np.zeros((2, 384)), np.zeros((384, 2)))}, {})
    same = SentenceEmbedder(zero, precision="fp32")
    adapted = SentenceEmbedder("minilm-medquad", precision="fp32")
    texts = ["gout flare treatment", "sciatica symptoms"]
    assert np.allclose(base.embed(texts), same.embed(texts), atol=1e-6)
    assert not np.allclose(base.embed(texts), adapted.embed(texts), atol=1e-3)
    assert len({base.model_name, same.model_name, adapted.model_name}) == 3
    assert SentenceEmbedder.from_dict(adapted.to_dict()).model_name == adapted.model_name
