"""A sentence-transformers BERT (the bundled all-MiniLM-L6-v2, a delta over it, a user's BERT folder) on ONNX
Runtime, without torch.

The weights are read from `model.safetensors` as numpy arrays (float16 or float32 files, float32 arrays), a low-rank
delta is merged into them exactly as `LowRankDelta.apply` merges it into the torch module (W += B @ A, whole tensors
replaced), and the encoder graph is written node by node with `onnx.helper`: embeddings, self-attention as ONNX
Runtime's fused `Attention` operator with the padding mask, the erf GELU of BERT as its `BiasGelu`, post-LayerNorm,
then the folder's pooling (mean or CLS over the attention mask) and L2 normalisation, so the session's output is the
finished sentence vector. The graph is built from what the folder says (config.json, 1_Pooling), not by a torch
export, so torch is needed neither to build nor to run it. The same encoder in standard ONNX operators only
(`build_graph(fused=False)`, and the recogniser's `build_tagger_graph`) is kept: the fused one is checked against it.

Building takes a second (int8: five, its smoothing measured on random token sequences); the result is cached as a file
named by the weights' and the delta's digests (and this builder's version), written atomically, so later starts only
load it (~0.1 s; ONNX Runtime's optimisation at load is part of that, and saving its optimised graph did not start
faster). The cache is disposable: a file that does not load (truncated, corrupt) is removed and rebuilt, and a cache
folder that cannot be written gets a graph built in a temporary folder (`cached_session`).

int8 is ONNX Runtime's dynamic quantization (int8 weights per output channel, each batch's activations with one
scale) of the attention (QAttention: query/key/value; the output projection), the first feed-forward product, and the
second in the later half of the layers, after SmoothQuant smoothing of the attention's and the first product's inputs
(`smoothing_scales`). On the 1,000 MTSamples sentences of bench/embed_runtime.py its minimum cosine to torch fp32 is
0.9955 at 1.8x fp32's speed; other variants measured there: attention only 0.994 (1.25x), attention and
first product 0.983 unsmoothed and 0.997 smoothed (1.5x), every product 0.972 unsmoothed and 0.988 smoothed (2.1x).
Its vectors depend slightly on the rest of their batch (the activation scale is the batch's): a sentence alone and in
a batch agree to ~1e-2 per component; fp32's agree to float noise (1e-7).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ModelUnavailableError
from ebmrag.models.adapters import LowRankDelta

log = logging.getLogger(__name__)

ONNX_PRECISIONS = ("fp32", "int8")
GRAPH_VERSION = 3  # bump when the graph below changes: old cache files are then never loaded
INT8_GROUPS: tuple[str, ...] = ("attention", "ffn_in", "ffn_out_late")  # the products int8 quantizes (module doc)
_SMOOTHED: tuple[str, ...] = ("attention", "ffn_in")  # the products whose inputs int8 smooths (smoothing_scales)
_ALPHA = 0.65  # SmoothQuant's migration strength
_CALIBRATION = (8, 32, 8, 128)  # batches, rows, shortest and longest random sequence of smoothing_scales
_OPSET = 17  # LayerNormalization
_WEIGHTS = "model.safetensors"
_TOKENIZER = "tokenizer.json"
_CONTRIB = "com.microsoft"
# ORT fusions left out: its SkipLayerNormalization took 351 ms of a 2.5 s run where Add + LayerNormalization took
# 97 ms (profiled on the 1,000 MTSamples sentences of bench/embed_runtime.py, 2 cores)
_SLOWER_FUSIONS = ["SkipLayerNormFusion"]


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
        self.quantizable: dict[str, list[str]] = {}  # the products int8 may quantize, by group
        self.activations: dict[str, str] = {}  # the input tensor of each smoothable product, by smoothing_key
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, hint: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def tensor(self, key: str) -> np.ndarray:
        value = self.weights.get(key)
        if value is None:
            raise ModelUnavailableError(f"the model's weights have no tensor {key!r}: not a BERT encoder")
        return value

    def weight(self, key: str, transpose: bool = False) -> str:
        value = self.tensor(key)
        return self.const(key.replace(".", "_"), value.T if transpose else value)

    def op(self, kind: str, *inputs: str, hint: str = "", domain: str = "", **attrs: Any) -> str:
        from onnx import helper

        out = self._name(hint or kind.lower())
        self.nodes.append(helper.make_node(kind, list(inputs), [out], name=out, domain=domain or None, **attrs))
        return out

    def contrib(self, kind: str, *inputs: str, hint: str = "", **attrs: Any) -> str:
        """One of ONNX Runtime's fused transformer operators (domain com.microsoft)."""
        return self.op(kind, *inputs, hint=hint, domain=_CONTRIB, **attrs)

    def mark(self, group: str, node: str) -> str:
        self.quantizable.setdefault(group, []).append(node)
        return node

    def matmul(self, x: str, prefix: str, group: str = "") -> str:
        """x @ W.T of the torch Linear `prefix`, without its bias."""
        product = self.op("MatMul", x, self.weight(f"{prefix}.weight", transpose=True), hint=prefix)
        return self.mark(group, product) if group else product

    def linear(self, x: str, prefix: str, group: str = "attention") -> str:
        return self.op("Add", self.matmul(x, prefix, group), self.weight(f"{prefix}.bias"))

    def layer_norm(self, x: str, prefix: str, eps: float) -> str:
        return self.op("LayerNormalization", x, self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias"),
                       axis=-1, epsilon=eps)

    def residual_norm(self, x: str, skip: str, prefix: str, bias: str, eps: float) -> str:
        """LayerNorm(x + bias + skip): the adds and ONNX's LayerNormalization, not ONNX Runtime's fused
        SkipLayerNormalization, which took 3.6x as long here (351 against 97 ms in one profiled run; `open_session`
        keeps ORT from fusing them)."""
        return self.op("LayerNormalization", self.op("Add", self.op("Add", x, bias), skip),
                       self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias"), axis=-1, epsilon=eps,
                       hint=prefix)


def build_graph(weights: dict[str, np.ndarray], shape: BertShape, fused: bool = True,
                smoothing: Mapping[str, np.ndarray] | None = None) -> Any:
    """The ONNX model: (input_ids, attention_mask) int64 [batch, tokens] -> sentence_embedding float [batch, dim],
    L2-normalised. `fused`: the encoder in ONNX Runtime's fused operators (`_fused_encoder`, `smoothing` its int8
    scales); False: the same arithmetic in standard ONNX operators only (`_encoder`), the graph before them, kept as
    the reference the fused one is checked against."""
    from onnx import TensorProto

    g = _GraphWriter(weights)
    x, mask = _fused_encoder(g, shape, smoothing) if fused else _encoder(g, shape)
    pooled = _pool(g, x, mask, shape.pooling)
    norm = g.op("ReduceL2", pooled, axes=[-1], keepdims=1)  # axes an attribute until opset 18
    g.op("Div", pooled, g.op("Max", norm, g.const("tiny", np.array(1e-12, np.float32))))
    g.nodes[-1].output[0] = "sentence_embedding"
    return _model(g, "sentence_bert", [("sentence_embedding", TensorProto.FLOAT, ["batch", shape.hidden])])


def build_tagger_graph(weights: dict[str, np.ndarray], shape: BertShape) -> Any:
    """An encoder with two sigmoid heads (the critical-fact recogniser, evidence/recogniser.py): (input_ids,
    attention_mask) -> `kinds` [batch, K], one probability per kind on the mean of the token states (weights
    `kinds.weight` [K, hidden], `kinds.bias`), and `spans` [batch, tokens, T], one probability per span type and
    token (`spans.weight`, `spans.bias`). The heads are quantizable matrix products like the encoder's. Its encoder
    is the standard-operator one: bench/export_recogniser.py picks the products to quantize by their MatMul nodes
    (the attention's among them), which the fused Attention operator would hide."""
    from onnx import TensorProto

    g = _GraphWriter(weights)
    x, mask = _encoder(g, shape)
    g.op("Sigmoid", g.linear(_pool(g, x, mask, "mean"), "kinds", group="head"))
    g.nodes[-1].output[0] = "kinds"
    g.op("Sigmoid", g.linear(x, "spans", group="head"))
    g.nodes[-1].output[0] = "spans"
    kinds, types = weights["kinds.weight"].shape[0], weights["spans.weight"].shape[0]
    return _model(g, "bert_tagger", [("kinds", TensorProto.FLOAT, ["batch", kinds]),
                                     ("spans", TensorProto.FLOAT, ["batch", "tokens", types])])


def _model(g: _GraphWriter, name: str, outputs: list[tuple[str, int, list[Any]]]) -> Any:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        g.nodes, name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info(*output) for output in outputs], g.initializers)
    opsets = [helper.make_opsetid("", _OPSET)]
    if any(node.domain == _CONTRIB for node in g.nodes):
        opsets.append(helper.make_opsetid(_CONTRIB, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ebmrag")
    model.ir_version = 8  # what every onnxruntime of opset 17 reads
    for group, nodes in g.quantizable.items():
        model.metadata_props.add(key=f"quantizable.{group}", value=",".join(nodes))
    for key, tensor in g.activations.items():
        model.metadata_props.add(key=f"activation.{key}", value=tensor)
    return model


def _positions(g: _GraphWriter) -> str:
    """0..S-1 along each row as a running count (ORT's optimizer mangles Shape -> Gather -> Range)."""
    ones = g.op("Add", g.op("Mul", "input_ids", g.const("zero", np.array(0, np.int64))),
                g.const("one", np.array(1, np.int64)))
    return g.op("Sub", g.op("CumSum", ones, g.const("axis", np.array(1, np.int64))),
                g.const("one", np.array(1, np.int64)))


def _fused_encoder(g: _GraphWriter, shape: BertShape, smoothing: Mapping[str, np.ndarray] | None) -> tuple[str, str]:
    """The token states [B, S, H] after every layer, and the attention mask as floats [B, S], in ONNX Runtime's
    fused operators where they are faster:

    - embeddings: word + position gathered, + token type 0, LayerNormalization;
    - self-attention: one `Attention` (com.microsoft) over the packed query/key/value weights [H, 3H] and biases
      [3H], masked by the raw 0/1 mask [B, S] as int32 (a padded key's score gets -10000 added: its exp underflows
      to exactly 0, so a text's vector does not depend on the padding of its batch), scale 1/sqrt(head size);
    - output projection, + bias + residual, LayerNormalization;
    - feed-forward: MatMul, `BiasGelu` (BERT's exact erf GELU of x + bias, not FastGelu's tanh approximation),
      MatMul, + bias + residual, LayerNormalization.

    `smoothing` (int8 only, `smoothing_scales`): per input channel scales s of the attention's and the first
    feed-forward product's input, keyed by `smoothing_key`: the input is multiplied by 1/s and the weights' rows
    by s, the same product in exact arithmetic with the activation outliers moved into the weights, which are
    quantized per channel. Quantizable groups: "attention" (Attention nodes and output projections), "ffn_in",
    "ffn_out" (the second feed-forward product of the first half of the layers) and "ffn_out_late" (of the second
    half); each smoothable product's input is recorded by its smoothing key."""
    from onnx import TensorProto

    def smoothed(x: str, key: str, matrix: np.ndarray) -> tuple[str, np.ndarray]:
        g.activations[key] = x
        scale = smoothing.get(key) if smoothing else None
        if scale is None:
            return x, matrix
        return (g.op("Mul", x, g.const(f"{key}.smooth".replace(".", "_"), (1.0 / scale).astype(np.float32))),
                (matrix * scale[:, None]).astype(np.float32))

    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [B, S]
    raw = g.op("Cast", "attention_mask", to=TensorProto.INT32)  # Attention's 2-D mask_index
    words = g.op("Gather", g.weight("embeddings.word_embeddings.weight"), "input_ids")
    placed = g.op("Gather", g.weight("embeddings.position_embeddings.weight"), _positions(g))  # [B, S, H]
    segment = g.const("token_type_0", g.tensor("embeddings.token_type_embeddings.weight")[0])
    x = g.residual_norm(words, placed, "embeddings.LayerNorm", segment, shape.eps)
    for layer in range(shape.layers):
        prefix = f"encoder.layer.{layer}"
        own = f"{prefix}.attention.self"
        source, packed = smoothed(x, smoothing_key(layer, "attention"), np.concatenate(
            [g.tensor(f"{own}.{n}.weight").T for n in ("query", "key", "value")], axis=1))
        packed_bias = np.concatenate([g.tensor(f"{own}.{n}.bias") for n in ("query", "key", "value")])
        attended = g.mark("attention", g.contrib(
            "Attention", source, g.const(f"{own}.qkv".replace(".", "_"), packed),
            g.const(f"{own}.qkv_bias".replace(".", "_"), packed_bias), raw, num_heads=shape.heads,
            hint=own.replace(".", "_")))
        projected = g.matmul(attended, f"{prefix}.attention.output.dense", "attention")
        x = g.residual_norm(projected, x, f"{prefix}.attention.output.LayerNorm",
                            g.weight(f"{prefix}.attention.output.dense.bias"), shape.eps)
        source, inner = smoothed(x, smoothing_key(layer, "ffn_in"), g.tensor(f"{prefix}.intermediate.dense.weight").T)
        product = g.mark("ffn_in", g.op("MatMul", source, g.const(f"{prefix}.intermediate.dense".replace(".", "_"),
                                                                  inner), hint=f"{prefix}.intermediate.dense"))
        gelu = g.contrib("BiasGelu", product, g.weight(f"{prefix}.intermediate.dense.bias"))
        late = "ffn_out_late" if layer >= shape.layers // 2 else "ffn_out"
        x = g.residual_norm(g.matmul(gelu, f"{prefix}.output.dense", late), x, f"{prefix}.output.LayerNorm",
                            g.weight(f"{prefix}.output.dense.bias"), shape.eps)
    return x, mask


def smoothing_key(layer: int, group: str) -> str:
    return f"layer{layer}.{group}"


def _encoder(g: _GraphWriter, shape: BertShape) -> tuple[str, str]:
    """The token states [B, S, H] after every layer, and the attention mask as floats [B, S], in standard ONNX
    operators."""
    from onnx import TensorProto

    x = _embeddings(g, shape)
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)  # [B, S]
    blocked = g.op("Mul", g.op("Sub", g.const("one", np.array(1.0, np.float32)), mask),
                   g.const("blocked", np.array(np.finfo(np.float32).min, np.float32)))
    bias = g.op("Unsqueeze", blocked, g.const("axes", np.array([1, 2], np.int64)))  # [B, 1, 1, S]
    for layer in range(shape.layers):
        x = _encoder_layer(g, x, bias, f"encoder.layer.{layer}", shape)
    return x, mask


def _embeddings(g: _GraphWriter, shape: BertShape) -> str:
    """word + position + token type 0 (one segment per sentence), then LayerNorm."""
    words = g.op("Gather", g.weight("embeddings.word_embeddings.weight"), "input_ids")
    placed = g.op("Gather", g.weight("embeddings.position_embeddings.weight"), _positions(g))  # [B, S, H]
    segment = g.const("token_type_0", g.tensor("embeddings.token_type_embeddings.weight")[0])
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
    inner = g.linear(x, f"{prefix}.intermediate.dense", group="ffn_in")
    erf = g.op("Erf", g.op("Div", inner, g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))))
    gelu = g.op("Mul", g.op("Mul", inner, g.op("Add", erf, g.const("one", np.array(1.0, np.float32)))),
                g.const("half", np.array(0.5, np.float32)))
    out = g.op("Add", g.linear(gelu, f"{prefix}.output.dense", group="ffn_out"), x)
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


def precision_graph(weights: dict[str, np.ndarray], shape: BertShape, precision: str, threads: int = 0) -> Any:
    """The graph `save_model` writes for `precision`: int8's with the smoothing its quantization needs."""
    return build_graph(weights, shape,
                       smoothing=smoothing_scales(weights, shape, threads=threads) if precision == "int8" else None)


def smoothing_scales(weights: dict[str, np.ndarray], shape: BertShape, groups: tuple[str, ...] = _SMOOTHED,
                     threads: int = 0) -> dict[str, np.ndarray]:
    """SmoothQuant's per-channel scales (Xiao et al. 2023) for the inputs of the `groups` products:
    s = max|x|^a / max|w|^(1-a) per input channel, a = 0.65. int8 quantizes an activation with one scale per batch,
    and a few channels of a LayerNorm's output are far larger than the rest; dividing them by s (and multiplying
    the weights' rows by s, quantized per channel anyway) evens them out. max|x| is measured on the fp32 graph over
    random token sequences from a fixed seed: no text needed, the same scales on every build, and on the 1,000
    MTSamples sentences of bench/embed_runtime.py about as good as scales measured on 300 MTSamples or CEHRNER
    sentences (minimum cosine 0.993 against 0.994 and 0.995 at a = 0.5, the attention and first product quantized)."""
    import onnxruntime as ort  # type: ignore[import-untyped]
    from onnx import TensorProto, helper

    model = build_graph(weights, shape)
    activations = {p.key.removeprefix("activation."): p.value for p in model.metadata_props
                   if p.key.startswith("activation.") and p.key.rsplit(".", 1)[-1] in groups}
    for tensor in activations.values():
        model.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    vocabulary = weights["embeddings.word_embeddings.weight"].shape[0]
    batches, rows, shortest, longest = _CALIBRATION
    peaks = {key: np.zeros(0, np.float32) for key in activations}
    for _ in range(batches):
        length = int(rng.integers(shortest, min(longest, shape.max_positions) + 1))
        ids = rng.integers(0, vocabulary, size=(rows, length), dtype=np.int64)
        outputs = session.run(list(activations.values()), {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        for key, value in zip(activations, outputs, strict=True):
            peak = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            peaks[key] = peak if not peaks[key].size else np.maximum(peaks[key], peak)
    scales = {}
    for key, peak in peaks.items():
        layer, group = key.removeprefix("layer").split(".")
        prefix = f"encoder.layer.{layer}"
        own = (f"{prefix}.attention.self.{n}.weight" for n in ("query", "key", "value")) if group == "attention" \
            else (f"{prefix}.intermediate.dense.weight",)
        reach = np.max([np.abs(weights[name]).max(axis=0) for name in own], axis=0)  # per input channel
        scales[key] = (np.maximum(peak, 1e-5) ** _ALPHA / np.maximum(reach, 1e-5) ** (1 - _ALPHA)).astype(np.float32)
    return scales


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
    model = precision_graph(load_weights(folder, delta), BertShape.of(folder), precision, threads)
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
    save_model(precision_graph(load_weights(folder, delta), BertShape.of(folder), precision), precision, path)


def save_model(model: Any, precision: str, path: Path, groups: tuple[str, ...] = INT8_GROUPS) -> None:
    """Write (and for int8 quantize `groups` of) a built graph into `path`, atomically: a crash or a concurrent
    build leaves either no file or a whole one."""
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
                _quantize(fp32, tmp, quantizable(model, groups))
            finally:
                Path(fp32).unlink(missing_ok=True)
        else:
            onnx.save_model(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def quantizable(model: Any, groups: tuple[str, ...]) -> list[str]:
    """The names of the nodes of `groups` (attention, ffn_in, ffn_out, ffn_out_late, head) the builder marked."""
    marked = {p.key.removeprefix("quantizable."): p.value.split(",") for p in model.metadata_props
              if p.key.startswith("quantizable.")}
    return [node for group in groups for node in marked.get(group, [])]


def _quantize(source: str, target: str, nodes: list[str]) -> None:
    """ONNX Runtime's dynamic quantization of `nodes`: int8 per-channel weights, activations quantized per batch
    (an Attention node becomes QAttention, a MatMul DynamicQuantizeMatMul)."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic  # type: ignore[import-untyped]

    # ONNX's shape inference does not know the contrib operators' output types: every tensor here is float
    quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul", "Attention"], nodes_to_quantize=nodes,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})


def open_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime session over `path`: all graph optimisations but the slower fusions (_SLOWER_FUSIONS),
    `threads` intra-op threads (0: one per core). Raises whatever onnxruntime raises for a file that is not a
    loadable model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=_SLOWER_FUSIONS)


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

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, special tokens included and truncated at the model's length (texts stripped as
        sentence-transformers strips them): `run` takes them, and their lengths are what a batch pads to."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch_fast([t.strip() for t in texts])]

    def run(self, rows: list[list[int]]) -> np.ndarray:
        """One L2-normalised float32 vector per row of token ids, padded to the longest row."""
        if not rows:
            return np.zeros((0, self.dimension), dtype=np.float32)
        width = max(len(row) for row in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = row
            mask[index, : len(row)] = 1
        (vectors,) = self.session.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})
        return np.asarray(vectors, dtype=np.float32)

    def encode(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised float32 row per text, all in one batch."""
        return self.run(self.tokenize(texts))
