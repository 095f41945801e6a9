"""A sentence-transformers BERT (the bundled all-MiniLM-L6-v2, a delta over it, a user's BERT folder) on ONNX
Runtime, without torch.

The weights are read from `model.safetensors` as numpy arrays, a low-rank delta is merged into them exactly as
`LowRankDelta.apply` merges it into the torch module (W += B @ A, whole tensors replaced), and the encoder graph is
written node by node with `onnx.helper`: embeddings, self-attention with the padding mask, the erf GELU of BERT,
post-LayerNorm, then the folder's pooling (mean or CLS over the attention mask) and L2 normalisation, so the session's
output is the finished sentence vector. The graph is built from what the folder says (config.json, 1_Pooling), not
by a torch export, so torch is needed neither to build nor to run it.

Building and quantizing take a few seconds; the result is cached as a file named by the weights' and the delta's
digests (and this builder's version), written atomically, so later starts only load it. The cache is disposable: a
file that does not load (truncated, corrupt) is removed and rebuilt, and a cache folder that cannot be written gets a
graph built in a temporary folder (`cached_session`). int8 is ONNX Runtime's dynamic quantization (per-channel int8
weights) of the attention's four projections; the feed-forward products stay fp32, because quantizing them too took
the minimum cosine to the fp32 vectors down to 0.97 on real MTSamples and CEHRNER sentences (0.994 without them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ModelUnavailableError
from ebmrag.models.adapters import LowRankDelta

log = logging.getLogger(__name__)

ONNX_PRECISIONS = ("fp32", "int8")
GRAPH_VERSION = 1  # bump when the graph below changes: old cache files are then never loaded
_OPSET = 17  # LayerNormalization
_WEIGHTS = "model.safetensors"
_TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class BertShape:
    """What config.json, sentence_bert_config.json and 1_Pooling say about a folder's encoder."""

    hidden: int
    heads: int
    layers: int
    eps: float
    max_positions: int
    max_seq_length: int
    pooling: str  # "mean" or "cls"

    @classmethod
    def of(cls, folder: Path) -> BertShape:
        config = _json(folder / "config.json")
        st_config = _json(folder / "sentence_bert_config.json", required=False)
        max_positions = int(config.get("max_position_embeddings", 512))
        return cls(hidden=int(config["hidden_size"]), heads=int(config["num_attention_heads"]),
                   layers=int(config["num_hidden_layers"]), eps=float(config.get("layer_norm_eps", 1e-12)),
                   max_positions=max_positions,
                   max_seq_length=min(int(st_config.get("max_seq_length", max_positions)), max_positions),
                   pooling=pooling_mode(folder) or "")


def _json(path: Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelUnavailableError(f"{path} is missing: not a BERT model folder")
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def pooling_mode(folder: Path) -> str | None:
    """'mean' or 'cls' when the folder's pooling is one of those alone (None: something this graph does not do)."""
    pooling = _json(folder / "1_Pooling" / "config.json", required=False)
    if not pooling:
        return "mean"  # sentence-transformers' default for a plain transformer folder
    modes = {k.removeprefix("pooling_mode_").removesuffix("_tokens") for k, v in pooling.items()
             if k.startswith("pooling_mode_") and v is True}
    return modes.pop() if len(modes) == 1 and modes <= {"mean", "cls", "cls_token"} and modes else None


def onnx_capable(folder: Path) -> bool:
    """True when `folder` is a sentence-transformers BERT this module can build: safetensors weights, a fast
    tokenizer, mean or CLS pooling, and no module after pooling but normalisation."""
    try:
        config = _json(folder / "config.json")
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8")) \
            if (folder / "modules.json").is_file() else []
    except (OSError, ValueError, ModelUnavailableError):
        return False
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)}
    return (config.get("model_type") == "bert" and (folder / _WEIGHTS).is_file() and (folder / _TOKENIZER).is_file()
            and kinds <= {"Transformer", "Pooling", "Normalize"} and pooling_mode(folder) is not None)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def load_weights(folder: Path, delta: LowRankDelta | None) -> dict[str, np.ndarray]:
    """The encoder's tensors by their torch parameter name (a `bert.` prefix dropped), the delta merged in."""
    from safetensors.numpy import load_file

    weights = {name.removeprefix("bert."): np.asarray(value, dtype=np.float32) if value.dtype.kind == "f" else value
               for name, value in load_file(str(folder / _WEIGHTS)).items()}
    if delta is not None:
        merge_delta(weights, delta)
    return weights


def merge_delta(weights: dict[str, np.ndarray], delta: LowRankDelta) -> None:
    """`LowRankDelta.apply` on numpy weights: whole tensors replaced first, then W += B @ A per layer."""
    for name, value in delta.tensors.items():
        if name not in weights:
            raise ModelUnavailableError(f"{delta.path}: the base model has no parameter {name!r}; "
                                        "the delta was trained on a different model")
        if weights[name].shape != value.shape:
            raise ModelUnavailableError(f"{delta.path}: parameter {name} is {weights[name].shape}, "
                                        f"the delta is {value.shape}")
        weights[name] = value.astype(np.float32)
    for name, (a, b) in delta.layers.items():
        key = f"{name}.weight"
        if key not in weights:
            raise ModelUnavailableError(f"{delta.path}: the base model has no layer {name!r}; "
                                        "the delta was trained on a different model")
        if weights[key].shape != (b.shape[0], a.shape[1]):
            raise ModelUnavailableError(f"{delta.path}: layer {name} is {weights[key].shape}, "
                                        f"the delta is {(b.shape[0], a.shape[1])}")
        weights[key] = weights[key] + b.astype(np.float32) @ a.astype(np.float32)


class _GraphWriter:
    """Nodes and initializers of one graph, with names made unique by a counter."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.quantizable: list[str] = []  # the matrix products int8 quantizes
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, hint: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, key: str, transpose: bool = False) -> str:
        value = self.weights.get(key)
        if value is None:
            raise ModelUnavailableError(f"the model's weights have no tensor {key!r}: not a BERT encoder")
        return self.const(key.replace(".", "_"), value.T if transpose else value)

    def op(self, kind: str, *inputs: str, hint: str = "", **attrs: Any) -> str:
        from onnx import helper

        out = self._name(hint or kind.lower())
        self.nodes.append(helper.make_node(kind, list(inputs), [out], name=out, **attrs))
        return out

    def linear(self, x: str, prefix: str, quantizable: bool = True) -> str:
        product = self.op("MatMul", x, self.weight(f"{prefix}.weight", transpose=True), hint=prefix)
        if quantizable:
            self.quantizable.append(product)
        return self.op("Add", product, self.weight(f"{prefix}.bias"))

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        return self.op("LayerNormalization", x, self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias"),
                       axis=-1, epsilon=eps)


def build_graph(weights: dict[str, np.ndarray], shape: BertShape) -> Any:
    """The ONNX model: (input_ids, attention_mask) int64 [batch, tokens] -> sentence_embedding float [batch, dim],
    L2-normalised."""
    from onnx import TensorProto

    g = _GraphWriter(weights)
    x, mask = _encoder(g, shape)
    pooled = _pool(g, x, mask, shape.pooling)
    norm = g.op("ReduceL2", pooled, axes=[-1], keepdims=1)  # axes an attribute until opset 18
    g.op("Div", pooled, g.op("Max", norm, g.const("tiny", np.array(1e-12, np.float32))))
    g.nodes[-1].output[0] = "sentence_embedding"
    return _model(g, "sentence_bert", [("sentence_embedding", TensorProto.FLOAT, ["batch", shape.hidden])])


def build_tagger_graph(weights: dict[str, np.ndarray], shape: BertShape) -> Any:
    """An encoder with two sigmoid heads (the critical-fact recogniser, evidence/recogniser.py): (input_ids,
    attention_mask) -> `kinds` [batch, K], one probability per kind on the mean of the token states (weights
    `kinds.weight` [K, hidden], `kinds.bias`), and `spans` [batch, tokens, T], one probability per span type and
    token (`spans.weight`, `spans.bias`). The heads are quantizable matrix products like the encoder's."""
    from onnx import TensorProto

    g = _GraphWriter(weights)
    x, mask = _encoder(g, shape)
    g.op("Sigmoid", g.linear(_pool(g, x, mask, "mean"), "kinds"))
    g.nodes[-1].output[0] = "kinds"
    g.op("Sigmoid", g.linear(x, "spans"))
    g.nodes[-1].output[0] = "spans"
    kinds, types = weights["kinds.weight"].shape[0], weights["spans.weight"].shape[0]
    return _model(g, "bert_tagger", [("kinds", TensorProto.FLOAT, ["batch", kinds]),
                                     ("spans", TensorProto.FLOAT, ["batch", "tokens", types])])


def _encoder(g: _GraphWriter, shape: BertShape) -> tuple[str, str]:
    """The token states [B, S, H] after every layer, and the attention mask as floats [B, S]."""
    from onnx import TensorProto

    x = _embeddings(g, shape)
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [B, S]
    blocked = g.op("Mul", g.op("Sub", g.const("one", np.array(1.0, np.float32)), mask),
                   g.const("blocked", np.array(np.finfo(np.float32).min, np.float32)))
    bias = g.op("Unsqueeze", blocked, g.const("axes", np.array([1, 2], np.int64)))  # [B, 1, 1, S]
    for layer in range(shape.layers):
        x = _encoder_layer(g, x, bias, f"encoder.layer.{layer}", shape)
    return x, mask


def _model(g: _GraphWriter, name: str, outputs: list[tuple[str, int, list[Any]]]) -> Any:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        g.nodes, name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info(*output) for output in outputs], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="ebmrag")
    model.ir_version = 8  # what every onnxruntime of opset 17 reads
    model.metadata_props.add(key="quantizable", value=",".join(g.quantizable))
    return model


def _embeddings(g: _GraphWriter, shape: BertShape) -> str:
    """word + position + token type 0 (one segment per sentence), then LayerNorm."""
    words = g.op("Gather", g.weight("embeddings.word_embeddings.weight"), "input_ids")
    # positions 0..S-1 as a running count along each row (ORT's optimizer mangles Shape -> Gather -> Range)
    ones = g.op("Add", g.op("Mul", "input_ids", g.const("zero", np.array(0, np.int64))),
                g.const("one", np.array(1, np.int64)))
    positions = g.op("Sub", g.op("CumSum", ones, g.const("axis", np.array(1, np.int64))),
                     g.const("one", np.array(1, np.int64)))
    placed = g.op("Gather", g.weight("embeddings.position_embeddings.weight"), positions)  # [B, S, H]
    segment = g.const("token_type_0", g.weights["embeddings.token_type_embeddings.weight"][0])
    summed = g.op("Add", g.op("Add", words, placed), segment)
    return g.layer_norm(summed, "embeddings.LayerNorm", shape.eps)


def _encoder_layer(g: _GraphWriter, x: str, bias: str, prefix: str, shape: BertShape) -> str:
    """Self-attention (scores masked by `bias`), residual + LayerNorm, erf GELU feed-forward, residual + LayerNorm."""
    head = shape.hidden // shape.heads
    split = g.const("split_heads", np.array([0, 0, shape.heads, head], np.int64))

    def heads(name: str, perm: list[int]) -> str:
        return g.op("Transpose", g.op("Reshape", g.linear(x, f"{prefix}.attention.self.{name}"), split), perm=perm)

    query, key, value = heads("query", [0, 2, 1, 3]), heads("key", [0, 2, 3, 1]), heads("value", [0, 2, 1, 3])
    scores = g.op("Add", g.op("Mul", g.op("MatMul", query, key),
                              g.const("scale", np.array(1.0 / np.sqrt(head), np.float32))), bias)
    context = g.op("MatMul", g.op("Softmax", scores, axis=-1), value)  # [B, heads, S, head]
    merged = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]),
                  g.const("merge_heads", np.array([0, 0, shape.hidden], np.int64)))
    attended = g.op("Add", g.linear(merged, f"{prefix}.attention.output.dense"), x)
    x = g.layer_norm(attended, f"{prefix}.attention.output.LayerNorm", shape.eps)
    inner = g.linear(x, f"{prefix}.intermediate.dense", quantizable=False)
    erf = g.op("Erf", g.op("Div", inner, g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))))
    gelu = g.op("Mul", g.op("Mul", inner, g.op("Add", erf, g.const("one", np.array(1.0, np.float32)))),
                g.const("half", np.array(0.5, np.float32)))
    out = g.op("Add", g.linear(gelu, f"{prefix}.output.dense", quantizable=False), x)
    return g.layer_norm(out, f"{prefix}.output.LayerNorm", shape.eps)


def _pool(g: _GraphWriter, x: str, mask: str, mode: str) -> str:
    """Mean of the unmasked tokens (sentence-transformers clamps the count at 1e-9), or the first token."""
    if mode in ("cls", "cls_token"):
        return g.op("Gather", x, g.const("first", np.array(0, np.int64)), axis=1)
    weights = g.op("Unsqueeze", mask, g.const("axes", np.array([-1], np.int64)))  # [B, S, 1]
    axis = g.const("axes", np.array([1], np.int64))
    total = g.op("ReduceSum", g.op("Mul", x, weights), axis, keepdims=0)
    count = g.op("Max", g.op("ReduceSum", weights, axis, keepdims=0), g.const("tiny", np.array(1e-9, np.float32)))
    return g.op("Div", total, count)


def graph_path(folder: Path, delta: LowRankDelta | None, precision: str, cache_dir: Path) -> Path:
    """Where the graph of these weights, delta and precision is cached (named by their digests and GRAPH_VERSION)."""
    if precision not in ONNX_PRECISIONS:
        raise ValueError(f"onnx precision must be one of {ONNX_PRECISIONS}, got {precision!r}")
    name = f"bert-{file_digest(folder / _WEIGHTS)}-{delta.digest if delta else 'base'}-v{GRAPH_VERSION}-{precision}"
    return cache_dir / "onnx" / f"{name}.onnx"


def cached_session(folder: Path, delta: LowRankDelta | None, precision: str, cache_dir: Path, threads: int) -> Any:
    """A session over the cached graph, built first when it is missing. The cache is disposable: a graph that does
    not load (truncated, corrupt, a folder where the file belongs) is removed with one warning and built again, and
    a cache folder that cannot be written (another account's, a full disk) gets a graph built in a temporary folder
    for this process. It holds model weights only, no patient text."""
    path = graph_path(folder, delta, precision, cache_dir)
    if path.is_file():
        try:
            return open_session(path, threads)
        except Exception as exc:  # onnxruntime raises its own types for a truncated or corrupt file
            log.warning("the cached ONNX model %s does not load (%s); rebuilding it", path.name,
                        type(exc).__name__)
            with contextlib.suppress(OSError):
                path.unlink()
    elif os.path.lexists(path):
        log.warning("the cached ONNX model %s is not a file; moving it aside and rebuilding it", path.name)
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"))
    model = build_graph(load_weights(folder, delta), BertShape.of(folder))
    try:
        save_model(model, precision, path)
    except OSError as exc:
        log.warning("the ONNX model cache %s cannot be written (%s); building the graph in a temporary folder",
                    path.parent, exc.strerror or type(exc).__name__)
        with tempfile.TemporaryDirectory(prefix="ebmrag-onnx-") as scratch:
            built = Path(scratch) / path.name
            save_model(model, precision, built)
            return open_session(built, threads)  # the session holds the graph: the file may go
    return open_session(path, threads)


def build_model(folder: Path, delta: LowRankDelta | None, precision: str, path: Path) -> None:
    """Build (and for int8 quantize) the graph into `path`, atomically."""
    save_model(build_graph(load_weights(folder, delta), BertShape.of(folder)), precision, path)


def save_model(model: Any, precision: str, path: Path) -> None:
    """Write (and for int8 quantize) a built graph into `path`, atomically: a crash or a concurrent build leaves
    either no file or a whole one."""
    import onnx

    log.info("writing the ONNX %s graph %s", precision, path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.partial")
    os.close(fd)
    try:
        if precision == "int8":
            fp32 = tmp + ".fp32"
            try:
                onnx.save_model(model, fp32)
                _quantize(fp32, tmp, next(p.value for p in model.metadata_props if p.key == "quantizable"))
            finally:
                Path(fp32).unlink(missing_ok=True)
        else:
            onnx.save_model(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _quantize(source: str, target: str, quantizable: str) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic  # type: ignore[import-untyped]

    quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_quantize=quantizable.split(","))


def open_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime session over `path`: all graph optimisations, `threads` intra-op threads (0: one per
    core). Raises whatever onnxruntime raises for a file that is not a loadable model."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxSentenceModel:
    """Tokenizer + session: texts -> normalised vectors, for one folder, delta and precision."""

    def __init__(self, folder: Path, delta: LowRankDelta | None, precision: str, cache_dir: Path,
                 max_tokens: int | None = None, threads: int = 0) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelUnavailableError("the tokenizers library is missing: pip install 'ebmrag[embed]'") from exc
        shape = BertShape.of(folder)
        self.dimension = shape.hidden
        self.max_length = min(max_tokens or shape.max_seq_length, shape.max_positions)
        self.tokenizer = Tokenizer.from_file(str(folder / _TOKENIZER))
        self.tokenizer.enable_truncation(max_length=self.max_length)
        self.tokenizer.no_padding()  # tokenizer.json pads to a fixed 128; batches pad to their longest here
        self.session = cached_session(folder, delta, precision, cache_dir, threads)

    def encode(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised float32 row per text (texts stripped as sentence-transformers strips them)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        encodings = self.tokenizer.encode_batch([t.strip() for t in texts])
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        (vectors,) = self.session.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})
        return np.asarray(vectors, dtype=np.float32)
