"""Sentence embeddings for similarity: the bundled all-MiniLM-L6-v2, a delta over it, or a user's local model,
cached by content hash.

`model_path` is empty (the bundled MiniLM), a named profile such as `minilm-medquad` or a `.npz` low-rank delta
(the bundled MiniLM with that delta merged, `adapters.py`), or a local sentence-transformers folder. The model
loads lazily in `warm_up()` (a few seconds), never at import, and never from a hub: a path that is not local is
an error, not a download. Vectors are L2-normalized, so
cosine similarity is a dot product. The cache key is sha256(model name + text), in memory and,
when `cache_dir` is given, in a SQLite file shared across runs.

Two runtimes compute the same vectors: "onnx" (`onnx_bert.py`: ONNX Runtime over a graph built from the
safetensors weights, fp32 or dynamic int8, no torch) and "torch" (sentence-transformers, fp32 / bf16 / int8, the
`[train]` extra). "auto" takes onnx for the bundled model, its deltas and any local BERT folder it can build, and
torch for other folders. The model name carries the runtime and the precision (`vector_profile` reads them back),
so caches and knowledge bases never mix vectors of two of them; torch names are those from before runtimes existed.

One embedder serves every thread of a service: the model loads once, and its forward passes take turns one batch
at a time in order of arrival (two passes at once only compete for the same cores, and a turn per batch lets a small
request's batch in between a large one's), with a `protocols.checkpoint()` between batches so that a long embedding
can be stopped or paused; each batch is cached as it is computed, so a stopped embedding keeps its finished batches.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ModelUnavailableError
from ebmrag.kvcache import KeyValueCache
from ebmrag.models.adapters import delta_digest, load_delta, resolve_delta
from ebmrag.models.onnx_bert import ONNX_PRECISIONS, onnx_capable
from ebmrag.models.tokens import bundled_model_dir
from ebmrag.observe.tracing import span
from ebmrag.protocols import Vectors, checkpoint

EMBEDDING_PRECISIONS = ("auto", "fp32", "bf16", "int8")  # auto: onnx fp32; torch bf16 where the CPU has it natively
EMBEDDING_RUNTIMES = ("auto", "onnx", "torch")  # auto: onnx wherever the model is a BERT it can build
_TRAIN_HINT = "pip install 'ebmrag[train]'"
# padded tokens per forward pass at most (length_batches), per runtime: the fastest on 1,000 MTSamples sentences and on
# 150 texts of 10 of them (200 to 256 tokens), 2 cores; ONNX Runtime's attention slows with the batch's size
BATCH_TOKENS = {"onnx": 512, "torch": 1024}
_TOKENIZE_SLICE = 2048  # texts tokenized between two checkpoints


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ebmrag"


class _VectorCache:
    """float32 vectors in the shared key-value cache (table `vectors`). The cache is disposable (kvcache.py): a
    damaged file or value is a miss and the vector is computed again."""

    def __init__(self, path: Path) -> None:
        self._store = KeyValueCache(path, "vectors", column="vector")

    def get_many(self, keys: Sequence[str]) -> dict[str, Vectors]:
        found = {key: _vector(blob) for key, blob in self._store.get_many(keys).items()}
        return {key: vector for key, vector in found.items() if vector is not None}

    def put_many(self, items: dict[str, Vectors]) -> None:
        self._store.put_many({k: v.astype(np.float32).tobytes() for k, v in items.items()})

    def forget(self, keys: list[str]) -> int:
        return self._store.forget(keys)


def _vector(blob: bytes) -> Vectors | None:
    """A stored unit vector, or None for bytes that cannot be one: rows from before checksums are unverified, and
    a damaged one must not reach a cosine."""
    if not blob or len(blob) % 4:
        return None
    vector = np.frombuffer(blob, dtype=np.float32)
    norm = float(np.linalg.norm(vector))
    return vector if np.isfinite(norm) and abs(norm - 1.0) < 0.02 else None


class TurnLock:
    """A lock taken in order of arrival. `threading.Lock` is not fair: a thread that releases it and asks again at
    once (a large chart's next batch) usually wins over one that has been waiting (another request's one batch)."""

    def __init__(self) -> None:
        self._turns = threading.Condition()
        self._issued = 0  # tickets handed out
        self._serving = 0  # the ticket whose turn it is

    def __enter__(self) -> None:
        with self._turns:
            ticket = self._issued
            self._issued += 1
            self._turns.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._turns:
            self._serving += 1
            self._turns.notify_all()


def native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slow."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_precision(precision: str, runtime: str = "torch") -> str:
    """The precision "auto" means on `runtime`: fp32 on onnx (int8 is asked for: 1.7x faster on 2 cores, at a
    minimum cosine of 0.995 to fp32 that depends slightly on the batch, onnx_bert.py), bf16 on torch where the CPU
    has it natively."""
    if runtime == "onnx":
        if precision == "bf16":
            raise ValueError(f"precision bf16 runs on the torch runtime only; onnx has {ONNX_PRECISIONS}")
        return "fp32" if precision == "auto" else precision
    return ("bf16" if native_bf16() else "fp32") if precision == "auto" else precision


def resolve_runtime(runtime: str, folder: Path | None, precision: str = "auto") -> str:
    """The runtime "auto" means for a user's `folder` (None: the bundled model or a delta over it); bf16 exists
    on torch only, so asking for it picks torch."""
    if runtime != "auto":
        if runtime == "onnx" and folder is not None and not onnx_capable(folder):
            raise ModelUnavailableError(f"{folder} is not a BERT folder with model.safetensors and tokenizer.json "
                                        "and mean or CLS pooling: the onnx runtime cannot build it; use torch")
        return runtime
    return "onnx" if precision != "bf16" and (folder is None or onnx_capable(folder)) else "torch"


def vector_profile(model_name: str) -> tuple[str, str, str]:
    """(model, runtime, precision) of an embedder's `model_name` as a manifest records it; names from before
    runtimes existed are torch, and a name without a precision suffix is fp32."""
    base, *suffixes = model_name.split("|")
    runtime = "onnx" if "onnx" in suffixes else "torch"
    precision = next((p for p in suffixes if p in EMBEDDING_PRECISIONS), "fp32")
    return base, runtime, precision


def vectors_mismatch(built: str, ours: str) -> str | None:
    """Why vectors of the embedder named `built` cannot be searched with those of `ours` (None: they can).
    torch fp32 and bf16 are one family: "auto" picks between them per machine over the same weights."""
    (built_model, built_runtime, built_precision), (our_model, our_runtime, our_precision) = (
        vector_profile(built), vector_profile(ours))
    if built_model != our_model:
        return f"was embedded with {built_model}; this embedder is {our_model}"
    family = {"bf16": "fp32"} if built_runtime == our_runtime == "torch" else {}
    if (built_runtime, family.get(built_precision, built_precision)) != (our_runtime,
                                                                         family.get(our_precision, our_precision)):
        return (f"was embedded by runtime {built_runtime} at {built_precision}; this embedder is runtime "
                f"{our_runtime} at {our_precision}")
    return None


def float32_weights() -> dict[str, Any]:
    """`from_pretrained` keywords that load a model's parameters as float32 whatever its file stores (the bundled
    weights are float16, which transformers 5 would keep): `dtype` from transformers 4.56, `torch_dtype` before.
    Every torch loader of the bundled model passes them (here, the reranker, the training scripts)."""
    import re
    from importlib.metadata import version

    import torch

    found = re.match(r"(\d+)\.(\d+)", version("transformers"))
    keyword = "dtype" if found and (int(found[1]), int(found[2])) >= (4, 56) else "torch_dtype"
    return {keyword: torch.float32}


def _quantized(model: Any) -> Any:
    """Dynamic int8 weights for every Linear layer: ~2x faster on CPU at a measured retrieval cost."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)  # type: ignore[no-untyped-call]


def length_batches(lengths: Sequence[int], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """The indexes of texts of token counts `lengths` in the batches they are embedded in: longest first (equal
    counts in their given order), a batch ending at `batch_size` texts or where one more text would take its padded
    size (texts x its longest, the first) over `batch_tokens`; a text longer than that is a batch of its own. A
    short chart's 256-token note then pads a few texts, not all of them."""
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        batch = batches[-1] if batches else []
        if not batch or len(batch) >= batch_size or (len(batch) + 1) * lengths[batch[0]] > batch_tokens:
            batches.append([index])
        else:
            batch.append(index)
    return batches


class SentenceEmbedder:
    """Batched, normalized, cached sentence embeddings."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        device: str = "cpu",
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        max_tokens: int | None = None,
        precision: str = "auto",
        runtime: str = "auto",
        threads: int = 0,
        batch_tokens: int | None = None,
    ) -> None:
        """`runtime`: "onnx", "torch" or "auto" (module doc); `threads`: ONNX Runtime's intra-op threads (0: one
        per core); `batch_size` texts and `batch_tokens` padded tokens (None: the runtime's BATCH_TOKENS) per
        forward pass at most."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_tokens is not None and batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
        if max_tokens is not None and not 8 <= max_tokens <= 512:
            raise ValueError(f"max_tokens must be in [8, 512], got {max_tokens}")
        if precision not in EMBEDDING_PRECISIONS:
            raise ValueError(f"precision must be one of {EMBEDDING_PRECISIONS}, got {precision!r}")
        if runtime not in EMBEDDING_RUNTIMES:
            raise ValueError(f"runtime must be one of {EMBEDDING_RUNTIMES}, got {runtime!r}")
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        self._delta = resolve_delta(model_path) if model_path else None  # its weights load in warm_up()
        digest = delta_digest(self._delta) if self._delta else ""
        if model_path and not self._delta and not Path(model_path).is_dir():
            raise ModelUnavailableError(f"embedding model is not a local directory, a .npz delta or a named "
                                        f"profile: {model_path}")
        self.model_path = Path(model_path) if model_path else None
        self.device = device
        self.batch_size = batch_size
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.max_tokens = max_tokens
        self.threads = threads
        own_folder = self.model_path if self.model_path and not self._delta else None
        self.runtime = resolve_runtime(runtime, own_folder, precision)
        self.precision = resolve_precision(precision, self.runtime)
        self.batch_tokens = batch_tokens or BATCH_TOKENS[self.runtime]
        base = str(self.model_path) if own_folder else "bundled:all-MiniLM-L6-v2"
        base += f"+delta:{digest}" if digest else ""
        profile = ("|onnx" if self.runtime == "onnx" else "") + (f"|max_tokens={max_tokens}" if max_tokens else "") \
            + ("" if self.precision == "fp32" else f"|{self.precision}")
        self.model_name = base + profile
        self._model: Any = None
        self._loading = threading.Lock()  # one model, however many threads ask for it first
        self._forward = TurnLock()  # one forward pass at a time, in order of arrival
        self._memory: dict[str, Vectors] = {}
        self._disk = _VectorCache(self.cache_dir / "embeddings.sqlite") if self.cache_dir else None

    def warm_up(self) -> None:
        if self._model is not None:
            return
        with self._loading:
            if self._model is None:
                self._model = self._load()

    def _load(self) -> Any:
        """The model, complete (delta merged, quantized) before any thread sees it."""
        path = bundled_model_dir() if self._delta or not self.model_path else self.model_path
        if self.runtime == "onnx":
            from ebmrag.models.onnx_bert import OnnxSentenceModel

            return OnnxSentenceModel(path, load_delta(self._delta) if self._delta else None, self.precision,
                                     self.cache_dir or default_cache_dir(), self.max_tokens, self.threads)
        return self._load_torch(path)

    def _load_torch(self, path: Path) -> Any:
        """The sentence-transformers model from the local folder only (`local_files_only`: never a hub), its
        parameters float32 whatever the file stores (the bundled weights are fp16; transformers 5 would keep them
        fp16); how quiet the libraries are is the host's choice (the CLI sets it: cli.MODEL_LIBRARY_ENVIRONMENT)."""
        try:
            import torch  # noqa: F401  (the runtime needs it: a clear error when it is missing)
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelUnavailableError(f"the torch embedding runtime needs torch and sentence-transformers: "
                                        f"{_TRAIN_HINT}, or runtime = \"onnx\"") from exc
        try:
            model = SentenceTransformer(str(path), device=self.device, local_files_only=True,
                                        model_kwargs=float32_weights())
        except Exception as exc:  # the library raises many types for a bad folder
            raise ModelUnavailableError(f"could not load the embedding model from {path}: {exc}") from exc
        if self._delta:
            load_delta(self._delta).apply(model[0].auto_model)
        if self.max_tokens:
            model.max_seq_length = self.max_tokens
        return _quantized(model) if self.precision == "int8" else model

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.model_name}\x00{text}".encode()).hexdigest()

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One normalized row per text; each distinct text is computed once and then served from the cache.
        The rows come from this call's own lookups, so another thread's erasure cannot pull one out from under it."""
        keys = [self._key(t) for t in texts]
        known = {k: v for k in dict.fromkeys(keys) if (v := self._memory.get(k)) is not None}
        missing = [k for k in dict.fromkeys(keys) if k not in known]
        if missing and self._disk is not None:
            stored = self._disk.get_many(missing)
            self._memory.update(stored)
            known.update(stored)
            missing = [k for k in missing if k not in known]
        if missing:
            text_of = dict(zip(keys, texts, strict=True))
            for computed in self._encode({k: text_of[k] for k in missing}):
                self._memory.update(computed)
                known.update(computed)
                if self._disk is not None:
                    self._disk.put_many(computed)
        if not keys:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([known[k] for k in keys])

    def cached(self, texts: Sequence[str]) -> int:
        """How many of `texts` have a vector already, in memory or on disk: how far a chart's preparation got."""
        keys = list(dict.fromkeys(self._key(t) for t in texts))
        missing = [k for k in keys if k not in self._memory]
        on_disk = len(self._disk.get_many(missing)) if missing and self._disk is not None else 0
        return len(keys) - len(missing) + on_disk

    def forget(self, texts: Sequence[str]) -> int:
        """Erase these texts' vectors from memory and disk (a patient's erasure); returns the disk rows removed."""
        keys = [self._key(t) for t in texts]
        for key in keys:
            self._memory.pop(key, None)
        return self._disk.forget(keys) if self._disk is not None else 0

    def _encode(self, texts: dict[str, str]) -> Iterator[dict[str, Vectors]]:
        """Key -> vector, batch by batch (`length_batches`: longest first by token count, a batch ending at
        `batch_size` texts or at `batch_tokens` padded tokens), one forward pass at a time, a checkpoint before each.
        A large chart's embedding can be stopped or paused between batches and keeps what it computed (the caller
        caches each batch), and another request's batch waits for at most one of its batches. bf16 runs under
        autocast: weights stay fp32, matrix products use the CPU's bf16 units."""
        self.warm_up()
        keys = list(texts)
        tokens = self._tokens([texts[k] for k in keys])
        for batch in length_batches([len(t) for t in tokens], self.batch_size, self.batch_tokens):
            checkpoint()
            with span("embed", {"ebmrag.embed.texts": len(batch)}, detail=True):
                if self.runtime == "onnx":
                    with self._forward:
                        rows = self._model.run([tokens[i] for i in batch])
                else:
                    rows = self._torch_batch([texts[keys[i]] for i in batch])
            yield {keys[i]: row for i, row in zip(batch, rows, strict=True)}

    def _tokens(self, texts: list[str]) -> list[Sequence[int]]:
        """Each text's token ids as the model reads them (special tokens, truncation), in slices with a checkpoint
        before each: onnx runs on these ids, torch batches by the counts of its own tokenizer."""
        tokens: list[Sequence[int]] = []
        for start in range(0, len(texts), _TOKENIZE_SLICE):
            checkpoint()
            chunk = texts[start : start + _TOKENIZE_SLICE]
            if self.runtime == "onnx":
                tokens.extend(self._model.tokenize(chunk))
            else:
                tokens.extend(self._model.tokenizer([t.strip() for t in chunk], truncation=True,
                                                    max_length=self._model.max_seq_length)["input_ids"])
        return tokens

    def _torch_batch(self, batch: list[str]) -> np.ndarray:
        import torch

        with self._forward, torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            vectors = self._model.encode(batch, batch_size=len(batch), normalize_embeddings=True,
                                         convert_to_numpy=False, convert_to_tensor=True, show_progress_bar=False)
            return np.asarray(vectors.float().numpy(), dtype=np.float32)

    @property
    def dimension(self) -> int:
        self.warm_up()
        if self.runtime == "onnx":
            return int(self._model.dimension)
        getter = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        return int(getter())

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_path": str(self.model_path) if self.model_path else None,
            "device": self.device,
            "batch_size": self.batch_size,
            "batch_tokens": self.batch_tokens,
            "cache_dir": str(self.cache_dir) if self.cache_dir else None,
            "max_tokens": self.max_tokens,
            "precision": self.precision,
            "runtime": self.runtime,
            "threads": self.threads,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SentenceEmbedder:
        return cls(**data)
