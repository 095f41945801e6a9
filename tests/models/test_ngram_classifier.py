"""The hashed n-gram classifier: fit, save, load, predict; features that never drift; the shipped tier model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ebmrag.errors import ConfigError
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL
from ebmrag.models.ngram_classifier import HashedNgramClassifier, NgramFeatures, fit_ngram_classifier

SHIPPED = BUNDLED_TIER_MODEL.with_name("tier_ngram.npz")

LAB = [
    "Hemoglobin 9.8 g/dL, white cell count 14,200.",
    "Serum sodium 128 mmol/L and potassium 5.9 mmol/L.",
    "Creatinine 2.1 mg/dL, up from 1.2 last month.",
    "Platelets 85,000 per microliter.",
    "TSH 0.01 mIU/L with free T4 3.2 ng/dL.",
    "Lactate 4.1 mmol/L on the arterial gas.",
    "Glucose 312 mg/dL and bicarbonate 14 mmol/L.",
    "INR 3.4, prothrombin time 38 seconds.",
    "Troponin I 2.3 ng/mL at six hours.",
    "Urine protein 3.5 g per 24 hours.",
    "血常规：白细胞12.5×10^9/L，中性粒细胞85%。",
    "肝功能：ALT 156 U/L，AST 98 U/L。",
    "血钾5.9mmol/L，血钠128mmol/L。",
    "尿常规：尿蛋白3+，潜血2+。",
    "血糖15.2mmol/L，糖化血红蛋白9.1%。",
]
HISTORY = [
    "She says the pain started three days ago and gets worse after meals.",
    "He has smoked a pack a day for thirty years.",
    "Her mother had breast cancer and her father had a stroke.",
    "He reports feeling tired and short of breath on stairs.",
    "She lives alone and works as a teacher.",
    "He drinks two beers most evenings and denies drug use.",
    "She has had headaches on and off since her teens.",
    "He was told he had asthma as a child.",
    "She feels anxious and has trouble sleeping at night.",
    "He noticed blood in his stool last week.",
    "患者3天前无明显诱因出现发热，伴咳嗽、咳痰。",
    "既往有高血压病史10年，规律服药。",
    "自述近一月体重下降约5公斤。",
    "患者诉头晕乏力半月余。",
    "否认吸烟饮酒史，家族中无类似疾病。",
]
SMALL = NgramFeatures(buckets=2**12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> HashedNgramClassifier:
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("ngram") / "tiny.npz"
    texts = LAB + HISTORY
    return fit_ngram_classifier(texts, ["T2"] * len(LAB) + ["T4"] * len(HISTORY), out, c=10.0, features=SMALL,
                                extra_meta={"trained_on": "test sentences"})


def test_round_trip_keeps_labels_meta_and_probabilities(tiny: HashedNgramClassifier) -> None:
    loaded = HashedNgramClassifier(tiny.path)
    assert loaded.labels == ["T2", "T4"] and loaded.spec == SMALL
    assert loaded.meta["trained_on"] == "test sentences" and loaded.meta["trained"]
    texts = ["Potassium 6.1 mmol/L.", "She says she feels fine."]
    np.testing.assert_allclose(loaded.probabilities(texts), tiny.probabilities(texts))
    with np.load(tiny.path, allow_pickle=False) as data:  # plain arrays only
        assert set(data.files) == {"columns", "weights", "bias", "meta"}
        assert data["weights"].dtype == np.float16


def test_predicts_the_obvious_class(tiny: HashedNgramClassifier) -> None:
    predictions = tiny.predict(["Sodium 131 mmol/L and creatinine 1.9 mg/dL.", "He says he has felt tired for weeks."])
    assert [label for label, _ in predictions] == ["T2", "T4"]
    assert all(0.5 < p <= 1.0 for _, p in predictions)


def test_chinese_text_is_classified(tiny: HashedNgramClassifier) -> None:
    assert [label for label, _ in tiny.predict(["血钾6.1mmol/L。", "患者诉咳嗽一周。"])] == ["T2", "T4"]


def test_empty_list_and_empty_text(tiny: HashedNgramClassifier) -> None:
    assert tiny.predict([]) == []
    label, p = tiny.predict([""])[0]
    assert label in tiny.labels and 0.0 < p <= 1.0


def test_numbers_collapse_to_their_shape() -> None:
    spec = NgramFeatures()
    assert spec.features("Hb 6.8 g/dL") == spec.features("Hb 7.2 g/dL")
    assert "w0.0" in spec.features("Hb 6.8") and "wg" in spec.features("6 g/L")


def test_cjk_runs_give_character_ngrams() -> None:
    features = NgramFeatures(char_ngrams=3).features("血钾高")
    assert {"c血", "c钾", "c高", "c血钾", "c钾高", "c血钾高"} <= set(features)


@pytest.mark.integration
def test_buckets_are_stable_across_processes() -> None:
    """crc32, not hash(): a fresh interpreter with another hash seed finds the same buckets, and the values are
    pinned, so a change to the features (which would silently break a shipped model) fails here."""
    texts = ["Hemoglobin 9.8 g/dL.", "患者诉头痛。", "She denies chest pain."]
    here = [NgramFeatures().buckets_of(t) for t in texts]
    code = ("import json, sys; from ebmrag.models.ngram_classifier import NgramFeatures; "
            "print(json.dumps([NgramFeatures().buckets_of(t) for t in json.loads(sys.argv[1])]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code, json.dumps(texts)], capture_output=True, text=True,
                           check=True, env=env)
    assert json.loads(other.stdout) == here
    assert NgramFeatures().buckets_of("Na 140") == [43440, 45088, 50310, 52578, 65259]


def _write(path: Path, **arrays: object) -> Path:
    with path.open("wb") as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]
    return path


def test_bad_files_raise_config_error_naming_the_path(tmp_path: Path, tiny: HashedNgramClassifier) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a model")
    missing = _write(tmp_path / "missing.npz", weights=np.zeros((2, 3)))
    with np.load(tiny.path, allow_pickle=False) as data:
        good = {name: data[name] for name in data.files}
    shape = _write(tmp_path / "shape.npz", **{**good, "bias": np.zeros(3)})
    meta = json.loads(str(good["meta"]))
    spec = _write(tmp_path / "spec.npz", **{**good, "meta": np.array(json.dumps({**meta, "features": {
        **meta["features"], "buckets": 1000}}))})
    foreign = _write(tmp_path / "foreign.npz", **{**good, "meta": np.array("[1, 2]")})
    columns = _write(tmp_path / "columns.npz", **{**good, "columns": good["columns"][::-1].copy()})
    nan = _write(tmp_path / "nan.npz", **{**good, "bias": np.array([np.nan, 0.0], np.float32)})
    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for bad in (garbage, missing, shape, spec, foreign, columns, nan, pickled, tmp_path / "absent.npz"):
        with pytest.raises(ConfigError, match=str(bad.name)):
            HashedNgramClassifier(bad)


def test_fit_rejects_mismatched_labels(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    with pytest.raises(ValueError, match="as many labels"):
        fit_ngram_classifier(["a", "b"], ["T1"], tmp_path / "x.npz")


def test_shipped_tier_model_loads_and_tiers_obvious_sentences() -> None:
    assert SHIPPED.stat().st_size < 1_000_000
    model = HashedNgramClassifier(SHIPPED)
    assert model.labels == ["T1", "T2", "T3", "T4"]
    predictions = model.predict([
        "Her hemoglobin was 8.2 g/dL and the platelet count 95,000 per microliter.",
        "She says she has felt tired for about two weeks and has been sleeping poorly.",
    ])
    assert [label for label, _ in predictions] == ["T2", "T4"]
