"""The onnx runtime against the torch reference on real sentences, its graph cache, and the knowledge base's refusal
to mix vectors of two runtimes or precisions."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from ebmrag.errors import KnowledgeBaseError, ModelUnavailableError
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.ingest.documents import Document
from ebmrag.models.embeddings import SentenceEmbedder, vector_profile, vectors_mismatch
from ebmrag.models.tokens import bundled_model_dir

pytestmark = [pytest.mark.model, pytest.mark.data]


def sentences(path: Path, count: int) -> list[str]:
    """The first `count` texts in sha256 order of their ids: a fixed sample spread over the whole file."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda row: hashlib.sha256(row["id"].encode()).hexdigest())
    return [row["text"] for row in rows[:count]]


LONG = " ".join(["The patient was admitted with community-acquired pneumonia and treated with ceftriaxone."] * 60)
EDGE_CASES = ["", "   ", LONG, "高血压患者应定期监测血压,必要时调整降压药物。", "BP 120/80, HR 72, SpO2 98% on RA."]


@pytest.fixture(scope="module")
def corpus(shared_data: Path) -> list[str]:
    corpora = shared_data / "text_corpora"
    return (sentences(corpora / "mtsamples_sections_shared.jsonl", 150)
            + sentences(corpora / "zh_cehrner_sentences_shared.jsonl", 50) + EDGE_CASES)


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


def torch_reference(texts: list[str], model_path: str | None = None) -> np.ndarray:
    pytest.importorskip("sentence_transformers")
    return SentenceEmbedder(model_path, runtime="torch", precision="fp32").embed(texts)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a * b, axis=1)))  # rows are unit vectors


@pytest.fixture(scope="module")
def reference(corpus: list[str]) -> np.ndarray:
    return torch_reference(corpus)


@pytest.mark.slow
def test_onnx_fp32_matches_torch_on_every_sentence(corpus: list[str], reference: np.ndarray,
                                                   onnx_cache: Path) -> None:
    embedder = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=onnx_cache)
    vectors = embedder.embed(corpus)
    assert vectors.shape == reference.shape and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert min_cosine(vectors, reference) >= 0.999


@pytest.mark.slow
def test_onnx_int8_stays_within_a_percent_of_torch(corpus: list[str], reference: np.ndarray,
                                                   onnx_cache: Path) -> None:
    vectors = SentenceEmbedder(runtime="onnx", precision="int8", cache_dir=onnx_cache).embed(corpus)
    assert min_cosine(vectors, reference) >= 0.99


@pytest.mark.slow
def test_a_delta_profile_is_merged_as_torch_merges_it(corpus: list[str], reference: np.ndarray,
                                                      onnx_cache: Path) -> None:
    adapted_reference = torch_reference(corpus[:80], "minilm-medquad")
    adapted = SentenceEmbedder("minilm-medquad", runtime="onnx", cache_dir=onnx_cache).embed(corpus[:80])
    assert min_cosine(adapted, adapted_reference) >= 0.999
    assert min_cosine(adapted, reference[:80]) < 0.99  # the delta really changed the vectors


def test_long_text_is_truncated_at_the_models_length(onnx_cache: Path) -> None:
    """256 tokens by default (sentence_bert_config.json), `max_tokens` when set: what follows does not count."""
    embedder = SentenceEmbedder(runtime="onnx", cache_dir=onnx_cache)
    longer = embedder.embed([LONG, LONG + " Discharged on warfarin with an INR target of 2 to 3."])
    assert float(longer[0] @ longer[1]) > 0.99999
    short = SentenceEmbedder(runtime="onnx", cache_dir=onnx_cache, max_tokens=16)
    head = short.embed(["Severe sepsis with lactate 5 mmol/L, started on norepinephrine and piperacillin",
                        "Severe sepsis with lactate 5 mmol/L, started on norepinephrine and piperacillin "
                        "after cultures; family meeting held"])
    assert float(head[0] @ head[1]) > 0.99999


@pytest.mark.slow
def test_the_built_graph_is_reused_and_a_corrupt_one_rebuilt(tmp_path: Path, onnx_cache: Path) -> None:
    texts = ["Chest pain radiating to the left arm.", "Metformin held before contrast.", "Afebrile overnight."]
    expected = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=onnx_cache).embed(texts)
    SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=tmp_path).warm_up()
    (graph,) = (tmp_path / "onnx").glob("*.onnx")
    built = graph.stat().st_mtime_ns, graph.stat().st_ino

    second = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=tmp_path)
    assert np.allclose(second.embed(texts[:1]), expected[:1], atol=1e-6)  # computed: no vector was cached yet
    assert (graph.stat().st_mtime_ns, graph.stat().st_ino) == built  # its graph loaded, not rebuilt

    graph.write_bytes(graph.read_bytes()[:4096])  # a crash mid-copy, a full disk
    third = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=tmp_path)
    assert np.allclose(third.embed(texts[1:]), expected[1:], atol=1e-6)
    assert graph.stat().st_size > 1_000_000 and [p.name for p in (tmp_path / "onnx").iterdir()] == [graph.name]


def test_a_graph_cache_that_cannot_be_written_builds_the_graph_for_this_process(
        tmp_path: Path, onnx_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    texts = ["Chest pain radiating to the left arm.", "Metformin held before contrast."]
    expected = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=onnx_cache).embed(texts)
    (tmp_path / "onnx").write_text("a file where the graph folder belongs")
    with caplog.at_level("WARNING", logger="ebmrag.models.onnx_bert"):
        vectors = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=tmp_path).embed(texts)
    assert np.allclose(vectors, expected, atol=1e-6) and "temporary folder" in caplog.text


def test_names_keep_runtimes_and_precisions_apart(tmp_path: Path) -> None:
    names = {SentenceEmbedder(runtime=r, precision=p, cache_dir=tmp_path).model_name
             for r, p in (("onnx", "fp32"), ("onnx", "int8"), ("torch", "fp32"), ("torch", "int8"))}
    assert len(names) == 4
    assert vector_profile(SentenceEmbedder(runtime="onnx", precision="int8").model_name)[1:] == ("onnx", "int8")
    assert vector_profile("bundled:all-MiniLM-L6-v2|max_tokens=128|bf16") == (
        "bundled:all-MiniLM-L6-v2", "torch", "bf16")  # a name written before runtimes existed
    assert vectors_mismatch("bundled:all-MiniLM-L6-v2|bf16", "bundled:all-MiniLM-L6-v2") is None


def test_auto_picks_onnx_for_the_bundled_model_and_its_deltas() -> None:
    assert SentenceEmbedder().runtime == "onnx" and SentenceEmbedder().precision == "fp32"
    assert SentenceEmbedder("minilm-medquad").runtime == "onnx"
    assert SentenceEmbedder(str(bundled_model_dir())).runtime == "onnx"  # a user's BERT folder it can build
    assert SentenceEmbedder(precision="bf16").runtime == "torch"  # bf16 exists on torch only
    with pytest.raises(ValueError, match="bf16 runs on the torch runtime only"):
        SentenceEmbedder(runtime="onnx", precision="bf16")


def test_a_folder_onnx_cannot_build_goes_to_torch(tmp_path: Path) -> None:
    folder = tmp_path / "roberta"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta"}), encoding="utf-8")
    assert SentenceEmbedder(str(folder)).runtime == "torch"
    with pytest.raises(ModelUnavailableError, match="cannot build it"):
        SentenceEmbedder(str(folder), runtime="onnx")


def test_torch_runtime_without_torch_is_a_one_line_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as in an install without the [train] extra
    with pytest.raises(ModelUnavailableError) as raised:
        SentenceEmbedder(runtime="torch", precision="fp32").warm_up()
    assert "pip install 'ebmrag[train]'" in str(raised.value) and "\n" not in str(raised.value)


GUIDE = Document("sepsis", "Start broad-spectrum antibiotics within one hour of recognising septic shock.",
                 "guides", "txt", title="sepsis")


def test_a_knowledge_base_refuses_another_runtime_or_precision(tmp_path: Path, onnx_cache: Path) -> None:
    config = KnowledgeBaseConfig(embedding_runtime="onnx", embedding_precision="fp32")
    kb = KnowledgeBase(tmp_path / "kb", config, cache_dir=onnx_cache)
    kb.apply([GUIDE])
    assert KnowledgeBase(tmp_path / "kb").config.embedding_runtime == "onnx"  # recorded in the manifest
    for runtime, precision in (("onnx", "int8"), ("torch", "fp32")):
        other = SentenceEmbedder(runtime=runtime, precision=precision, cache_dir=onnx_cache)
        opened = KnowledgeBase(tmp_path / "kb", embedder=other)
        with pytest.raises(KnowledgeBaseError) as raised:
            opened.reader()
        with pytest.raises(KnowledgeBaseError):  # and again: a refused generation never becomes the reader
            opened.reader()
        message = str(raised.value)
        assert "\n" not in message and "runtime onnx at fp32" in message
        assert f"runtime {runtime} at {precision}" in message
    with pytest.raises(KnowledgeBaseError, match="cannot be opened with"):
        KnowledgeBase(tmp_path / "kb", KnowledgeBaseConfig(embedding_runtime="onnx", embedding_precision="int8"))


def test_a_manifest_from_before_runtimes_was_torch() -> None:
    old = KnowledgeBaseConfig.from_manifest({"embedding_model": "", "embedding_precision": "bf16"}, Path("kb"))
    assert old.embedding_runtime == "torch"


def test_models_settings_choose_the_runtime_and_are_checked() -> None:
    from ebmrag.compose import Resources
    from ebmrag.config import settings_from_dict
    from ebmrag.errors import ConfigError

    settings = settings_from_dict({"models": {"embedding_runtime": "onnx", "embedding_precision": "int8",
                                              "embedding_threads": 1}})
    embedder = Resources(settings).embedder
    assert (embedder.runtime, embedder.precision, embedder.threads) == ("onnx", "int8", 1)
    for bad in ({"embedding_runtime": "gpu"}, {"embedding_runtime": "onnx", "embedding_precision": "bf16"},
                {"embedding_threads": -1}):
        with pytest.raises(ConfigError, match=r"\[models\]"):
            settings_from_dict({"models": bad})
