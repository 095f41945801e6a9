"""bench/bundle_model.py on a small made-up model folder: float16 weights under the same names, the same bytes on a
second run, the licence checked, and a value float16 cannot hold refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ebmrag.models.tokens import bundled_model_dir
from tests.bench_scripts import load_script

bundle_model = load_script("bundle_model")


def source_folder(root: Path, weights: dict[str, np.ndarray]) -> Path:
    """The bundled folder's small files beside made-up fp32 weights."""
    folder = root / "source"
    for name in bundle_model.COPIED:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundled_model_dir() / name, folder / name)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_bundle_writes_float16_weights_the_same_bytes_each_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weights = {"b.weight": rng.normal(size=(4, 3)).astype(np.float32), "a.bias": rng.normal(size=3).astype(np.float32),
               "embeddings.position_ids": np.arange(5, dtype=np.int64)[None]}
    source, licence = source_folder(tmp_path, weights), bundled_model_dir() / "LICENSE"
    bundle_model.bundle(source, tmp_path / "out", licence, "")
    first = (tmp_path / "out" / "model.safetensors").read_bytes()
    bundle_model.bundle(source, tmp_path / "out", licence, "")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == first
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(written) == sorted(weights)
    assert written["b.weight"].dtype == np.float16
    assert (written["b.weight"] == weights["b.weight"].astype(np.float16)).all()
    assert (written["embeddings.position_ids"] == weights["embeddings.position_ids"]).all()
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []  # no temporary left
    attribution = (tmp_path / "out" / "ATTRIBUTION.md").read_text(encoding="utf-8")
    assert bundle_model.sha256(tmp_path / "out" / "model.safetensors") in attribution
    assert bundle_model.sha256(source / "model.safetensors") in attribution


def test_bundle_refuses_a_wrong_licence_and_values_float16_cannot_hold(tmp_path: Path) -> None:
    source = source_folder(tmp_path, {"w": np.array([1.0, 70000.0], np.float32)})
    with pytest.raises(SystemExit, match=r"not the Apache License 2\.0"):
        bundle_model.bundle(source, tmp_path / "out", source / "config.json", "")
    with pytest.raises(SystemExit, match="float16 cannot store"):
        bundle_model.bundle(source, tmp_path / "out", bundled_model_dir() / "LICENSE", "")
