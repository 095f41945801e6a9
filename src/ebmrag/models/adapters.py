"""Low-rank deltas over the bundled MiniLM: how an adapted embedding model ships in a few MB instead of 90.

A delta file (`.npz`) holds, for every adapted Linear layer of the encoder, `A` (rank x in) and `B` (out x rank,
already multiplied by the LoRA scale); loading adds `B @ A` to the layer's weight once, so encoding costs exactly
what the base model costs. `bench/finetune_minilm.py --lora-rank` writes them. The named profile
`minilm-medquad` is the bundled MiniLM plus the delta trained on MedQuAD's own question -> answer pairs
(docs/results/retrieval.md has how it was trained and measured; ATTRIBUTION.md beside it, the data's licence).
A file's sha256 is part of the embedder's name, so caches and knowledge bases never mix two deltas.
A delta may also carry whole tensors that replace the base model's (a reranker's new scoring head, its biases and
layer norms): small next to the layers, and not low-rank. That is how a cross-encoder trained from the bundled
MiniLM (`bench/train_reranker.py --compress`) travels as a few MB (`retrieve.rerank`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.errors import ModelUnavailableError

LORA_TARGETS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                "intermediate.dense", "output.dense")
_MODELS = Path(__file__).parent / "deltas"
NAMED_DELTAS = {"minilm-medquad": _MODELS / "minilm_medquad.npz"}


@dataclass(frozen=True)
class LowRankDelta:
    path: Path
    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # module name -> (A, scaled B)
    meta: dict[str, Any]
    digest: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # parameter name -> its whole new value

    def apply(self, encoder: Any) -> None:
        """Add B @ A to each named Linear's weight and set each whole tensor, in place (a torch module from the
        base model)."""
        import torch

        self._replace_tensors(encoder)
        modules = dict(encoder.named_modules())
        missing = sorted(set(self.layers) - set(modules))
        if missing:
            raise ModelUnavailableError(f"{self.path}: the base model has no layer {missing[0]!r}; "
                                        "the delta was trained on a different model")
        with torch.no_grad():
            for name, (a, b) in self.layers.items():
                weight = modules[name].weight
                if tuple(weight.shape) != (b.shape[0], a.shape[1]):
                    raise ModelUnavailableError(f"{self.path}: layer {name} is {tuple(weight.shape)}, "
                                                f"the delta is {(b.shape[0], a.shape[1])}")
                weight += torch.from_numpy(b.astype(np.float32) @ a.astype(np.float32))

    def _replace_tensors(self, encoder: Any) -> None:
        import torch

        parameters = dict(encoder.named_parameters())
        with torch.no_grad():
            for name, value in self.tensors.items():
                if name not in parameters:
                    raise ModelUnavailableError(f"{self.path}: the base model has no parameter {name!r}; "
                                                "the delta was trained on a different model")
                if tuple(parameters[name].shape) != value.shape:
                    raise ModelUnavailableError(f"{self.path}: parameter {name} is {tuple(parameters[name].shape)}, "
                                                f"the delta is {value.shape}")
                parameters[name].copy_(torch.from_numpy(value.astype(np.float32)))


def resolve_delta(spec: str | Path) -> Path | None:
    """A named profile or a `.npz` path -> the delta file; anything else (a model folder, empty) -> None."""
    if str(spec) in NAMED_DELTAS:
        return NAMED_DELTAS[str(spec)]
    return Path(spec) if str(spec).endswith(".npz") else None


def delta_digest(path: Path) -> str:
    """The short content hash that names a delta in cache keys and manifests (the file is read, not parsed)."""
    if not path.is_file():
        raise ModelUnavailableError(f"embedding delta file not found: {path}")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def load_delta(path: Path) -> LowRankDelta:
    if not path.is_file():
        raise ModelUnavailableError(f"embedding delta file not found: {path}")
    raw = path.read_bytes()
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            layers = {name: (archive[f"{name}:a"], archive[f"{name}:b"]) for name in meta["layers"]}
            tensors = {name: archive[f"{name}:full"] for name in meta.get("tensors", [])}
    except (OSError, ValueError, KeyError) as exc:
        raise ModelUnavailableError(f"{path} is not an ebmrag low-rank delta: {exc}") from exc
    return LowRankDelta(path, layers, meta, hashlib.sha256(raw).hexdigest()[:12], tensors)


def save_delta(path: Path, layers: dict[str, tuple[np.ndarray, np.ndarray]], meta: dict[str, Any],
               tensors: dict[str, np.ndarray] | None = None) -> None:
    """Write (A, scaled B) per layer and whole tensors as float16, atomically (a crash leaves the previous file)."""
    arrays = {f"{name}:{part}": array.astype(np.float16)
              for name, (a, b) in layers.items() for part, array in (("a", a), ("b", b))}
    arrays.update({f"{name}:full": value.astype(np.float16) for name, value in (tensors or {}).items()})
    arrays["meta"] = np.array(json.dumps({**meta, "layers": sorted(layers), "tensors": sorted(tensors or {})}))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a model file is read by every user of the package
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
