"""The onnx runtime against the torch reference on real sentences, its fused graph against the same encoder in
standard operators, vectors that do not depend on their batch, float16 weights read as float32, its graph cache, and
the knowledge base's refusal to mix vectors of two runtimes or precisions."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ebmrag.errors import KnowledgeBaseError, ModelUnavailableError
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.ingest.documents import Document
from ebmrag.models.embeddings import SentenceEmbedder, vector_profile, vectors_mismatch
from ebmrag.models.onnx_bert import (
    BertShape,
    build_graph,
    build_tagger_graph,
    graph_path,
    load_weights,
    open_session,
    quantizable,
)
from ebmrag.models.tokens import bundled_model_dir

pytestmark = [pytest.mark.model, pytest.mark.data]


def sentences(path: Path, count: int) -> list[str]:
    """The first `count` texts in sha256 order of their ids: a fixed sample spread over the whole file."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda row: hashlib.sha256(row["id"].encode()).hexdigest())
    return [row["text"] for row in rows[:count]]


LONG = " ".join(["The patient was admitted with community-acquired pneumonia and treated with ceftriaxone."] * 60)
EDGE_CASES = ["", "   ", LONG, "高血压患者应定期监测血压,必要时调整降压药物。", "BP 120/80, HR 72, SpO2 98% on RA."]
FEW = ["Chest pain radiating to the left arm; troponin I 0.8 ng/mL at 02:00.",
       "Metformin held 48 hours before the contrast CT because of an eGFR of 38.",
       "Severe anaphylaxis to penicillin in 2015 requiring intramuscular epinephrine.",
       "Afebrile overnight.", LONG, "患者既往有青霉素过敏史,表现为皮疹和呼吸困难。",
       "Plan: repeat CBC in the morning, transfuse if Hb < 7 g/dL, and call the on-call resident with any bleeding."]


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


@pytest.fixture(scope="module")
def few_reference() -> np.ndarray:
    return torch_reference(FEW)


def token_batch(texts: list[str], max_length: int = 256) -> dict[str, np.ndarray]:
    """input_ids and attention_mask of `texts` right-padded to the longest, as OnnxSentenceModel.run pads them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.no_padding()
    rows = [e.ids for e in tokenizer.encode_batch(texts)]
    ids = np.zeros((len(rows), max(map(len, rows))), np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
    return {"input_ids": ids, "attention_mask": (np.arange(ids.shape[1]) < np.array([[len(r)] for r in rows]))
            .astype(np.int64)}


def test_the_fused_graph_matches_torch_fp32_on_a_few_sentences(few_reference: np.ndarray, onnx_cache: Path) -> None:
    vectors = SentenceEmbedder(runtime="onnx", precision="fp32", cache_dir=onnx_cache).embed(FEW)
    assert min_cosine(vectors, few_reference) >= 0.9999


def test_the_fused_graph_computes_what_the_standard_operators_compute(tmp_path: Path) -> None:
    """ONNX Runtime's Attention and BiasGelu against the same encoder written in standard operators, on one padded
    batch of short and long texts: the same vectors to float noise."""
    import onnx

    folder = bundled_model_dir()
    weights, shape = load_weights(folder, None), BertShape.of(folder)
    fused, plain = build_graph(weights, shape), build_graph(weights, shape, fused=False)
    ops = {node.op_type for node in fused.graph.node}
    assert {"Attention", "BiasGelu"} <= ops and not {"Softmax", "Erf"} & ops
    assert "Attention" not in {node.op_type for node in plain.graph.node}
    vectors = []
    for name, model in (("fused", fused), ("plain", plain)):
        onnx.save_model(model, str(tmp_path / f"{name}.onnx"))
        vectors.append(open_session(tmp_path / f"{name}.onnx", 0).run(["sentence_embedding"], token_batch(FEW))[0])
    assert np.abs(vectors[0] - vectors[1]).max() < 1e-5


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_a_texts_vector_does_not_depend_on_its_batch(runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded alone and in one padded batch with texts up to 256 tokens: padding is masked exactly. (No vector
    cache on disk: every text is computed; the graph is in the session's cache folder.)"""
    if runtime == "torch":
        pytest.importorskip("sentence_transformers")
    texts = [*FEW, "Afebrile.", "Lasix 40 mg IV given; urine output 1.2 L."]
    together = SentenceEmbedder(runtime=runtime, precision="fp32", batch_tokens=10**6)
    passes: list[int] = []
    forward = together._torch_batch if runtime == "torch" else None
    together.warm_up()
    if forward is None:
        run = together._model.run
        monkeypatch.setattr(together._model, "run", lambda rows: passes.append(len(rows)) or run(rows))
    else:
        monkeypatch.setattr(together, "_torch_batch", lambda batch: passes.append(len(batch)) or forward(batch))
    mixed = together.embed(texts)
    assert passes == [len(texts)]  # one forward pass: the short texts padded to the long one's 256 tokens
    single = SentenceEmbedder(runtime=runtime, precision="fp32")
    alone = np.stack([single.embed([text])[0] for text in texts])
    assert np.abs(mixed - alone).max() < 1e-5


def test_each_forward_pass_stays_within_its_token_budget(onnx_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of at most `batch_size` texts and `batch_tokens` padded tokens, longest first, each after a
    checkpoint, each cached as it is computed."""
    import ebmrag.models.embeddings as embeddings

    texts = [LONG, *FEW[:4], *[f"Potassium {k / 10:.1f} mmol/L on day {k}." for k in range(30, 60)]]
    embedder = SentenceEmbedder(runtime="onnx", cache_dir=onnx_cache, batch_size=8, batch_tokens=256)
    embedder.warm_up()
    shapes: list[tuple[int, int]] = []
    run = embedder._model.run
    monkeypatch.setattr(embedder._model, "run", lambda rows: shapes.append((len(rows), max(map(len, rows))))
                        or run(rows))
    checkpoints: list[int] = []
    monkeypatch.setattr(embeddings, "checkpoint", lambda: checkpoints.append(len(shapes)))
    cached_after: list[int] = []
    embedder_disk = embedder._memory
    batches = embedder._encode(dict(zip(map(str, range(len(texts))), texts, strict=True)))
    for batch in batches:
        embedder_disk.update(batch)
        cached_after.append(len(embedder_disk))
    assert shapes[0] == (1, 256)  # the long text alone: two rows would be 512 padded tokens
    assert all(rows <= 8 and (rows * width <= 256 or rows == 1) for rows, width in shapes)
    assert [w for _, w in shapes] == sorted((w for _, w in shapes), reverse=True)
    assert sum(rows for rows, _ in shapes) == len(texts) and cached_after == list(np.cumsum([r for r, _ in shapes]))
    assert checkpoints[-len(shapes):] == list(range(len(shapes)))  # a checkpoint before each pass


@pytest.mark.slow
def test_int8_stays_within_a_percent_on_clinical_sentences(few_reference: np.ndarray, onnx_cache: Path) -> None:
    """The smoothed int8 graph: attention and the first feed-forward product quantized, the second in the later
    half of the layers only."""
    import onnx

    embedder = SentenceEmbedder(runtime="onnx", precision="int8", cache_dir=onnx_cache)
    assert min_cosine(embedder.embed(FEW), few_reference) >= 0.99
    graph = onnx.load(str(graph_path(bundled_model_dir(), None, "int8", onnx_cache)))
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("QAttention") == 6 and "Attention" not in ops
    assert ops.count("MatMul") == 3  # the second feed-forward product of layers 0 to 2
    assert sum(node.op_type == "Mul" and "smooth" in node.input[1] for node in graph.graph.node) == 12  # 1/s


@pytest.mark.slow
def test_float16_weights_load_as_float32_on_both_runtimes(tmp_path: Path, few_reference: np.ndarray) -> None:
    """A folder whose safetensors are float16 (as the bundled model's are): torch gets float32 parameters (the
    library would keep float16 and run slowly), onnx float32 arrays; both agree and stay near the reference."""
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "minilm-fp16"
    shutil.copytree(bundled_model_dir(), folder)
    with safe_open(str(folder / "model.safetensors"), "np") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in tensors.items()},
              str(folder / "model.safetensors"), metadata=metadata)
    on_torch = SentenceEmbedder(str(folder), runtime="torch", precision="fp32")
    on_torch.warm_up()
    assert {p.dtype for p in on_torch._model.parameters()} == {torch.float32}
    vectors = on_torch.embed(FEW)
    assert min_cosine(SentenceEmbedder(str(folder), runtime="onnx", cache_dir=tmp_path).embed(FEW), vectors) >= 0.9999
    assert min_cosine(vectors, few_reference) >= 0.999  # the float16 rounding of the weights only


def test_the_recognisers_tagger_graph_keeps_its_standard_operators(tmp_path: Path) -> None:
    """build_tagger_graph (bench/export_recogniser.py) is not fused: the export picks the products it quantizes by
    their MatMul nodes, the attention's among them. Its outputs are probabilities, and padding is masked."""
    import onnx

    folder = bundled_model_dir()
    weights, shape = load_weights(folder, None), BertShape.of(folder)
    rng = np.random.default_rng(0)
    for head, size in (("kinds", 5), ("spans", 3)):
        weights[f"{head}.weight"] = rng.normal(0, 0.1, (size, shape.hidden)).astype(np.float32)
        weights[f"{head}.bias"] = np.zeros(size, np.float32)
    model = build_tagger_graph(weights, shape)
    products = [n.name for n in model.graph.node if n.op_type == "MatMul"
                and any(i.startswith("encoder_layer") for i in n.input[1:])]
    assert len([n for n in products if "attention" in n]) == 4 * shape.layers
    assert "Attention" not in {n.op_type for n in model.graph.node} and quantizable(model, ("head",))
    onnx.save_model(model, str(tmp_path / "tagger.onnx"))
    session = open_session(tmp_path / "tagger.onnx", 0)
    texts = ["Anaphylaxis to peanuts.", FEW[1]]
    kinds, spans = session.run(["kinds", "spans"], token_batch(texts))
    assert kinds.shape == (2, 5) and spans.shape[::2] == (2, 3) and kinds.min() > 0 and kinds.max() < 1
    alone_kinds, alone_spans = session.run(["kinds", "spans"], token_batch(texts[:1]))
    assert np.abs(kinds[:1] - alone_kinds).max() < 1e-5
    assert np.abs(spans[:1, : alone_spans.shape[1]] - alone_spans).max() < 1e-5


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
