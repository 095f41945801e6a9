"""What the critical-fact recogniser's base encoder costs to run (issue 45): the trimmed multilingual-e5-small of
bench/build_recogniser_base.py at 12 and 6 layers, fp32 and int8, against the bundled MiniLM-L6 as the service
runs it, in one run.

Run: python bench/build_recogniser_base.py && python bench/recogniser_speed.py --data-root ../shared/data
     [--base build/recogniser_base] [--runs 5] [--out docs/benchmarks.md]

Texts: 256 clinical sentences, 128 English (MTSamples note sections) and 128 Chinese (cEHRNER record sentences) of
../shared/data/text_corpora, each file's first by sha256 of their ids. Every row embeds all of them through
`SentenceEmbedder.embed` (ONNX Runtime via models/onnx_bert.py, batches of 64, one intra-op thread per core) on a
fresh embedder, its graph built and loaded before the clock starts; the rows take turns run by run, so a change in
the machine's load falls on all of them alike. Reported: the median of `--runs`, its ratio to the MiniLM row, the
graph file's size, and for int8 the cosine of each sentence's vector to the same depth's fp32 vector. The 6-layer
model is the 12-layer build's first six layers (the same as `--layers 6`), written to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.models.onnx_bert import graph_path
from ebmrag.models.tokens import bundled_model_dir
from report import emit, machine, sentences  # bench/ is on sys.path when a script here runs

EN_FILE, ZH_FILE = "mtsamples_sections_shared.jsonl", "zh_cehrner_sentences_shared.jsonl"
COMMAND = "python bench/recogniser_speed.py --data-root ../shared/data"
_COPIED = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Variant:
    label: str
    folder: Path | None  # None: the bundled MiniLM, as SentenceEmbedder's defaults run it
    precision: str  # "auto": the service's default

    def embedder(self, batch_size: int) -> SentenceEmbedder:
        if self.folder is None:
            return SentenceEmbedder(batch_size=batch_size)
        return SentenceEmbedder(self.folder, runtime="onnx", precision=self.precision, batch_size=batch_size)


def shallower(base: Path, layers: int, into: Path) -> Path:
    """`base` with its first `layers` encoder layers only."""
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    if layers > int(config["num_hidden_layers"]):
        raise SystemExit(f"{base} has {config['num_hidden_layers']} layers, {layers} asked for")
    weights = {name: value for name, value in load_file(str(base / "model.safetensors")).items()
               if not name.startswith("encoder.layer.") or int(name.split(".")[2]) < layers}
    into.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(into / "model.safetensors"), metadata={"format": "pt"})
    (into / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=layers), indent=2), encoding="utf-8")
    for name in _COPIED:
        (into / name).write_bytes((base / name).read_bytes())
    return into


def mean_tokens(folder: Path, texts: list[str]) -> float:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return float(np.mean([len(e.ids) for e in tokenizer.encode_batch(texts)]))


def timed(variants: list[Variant], texts: list[str], runs: int,
          batch_size: int) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Seconds per run of each variant, the variants taking turns, and each one's vectors of the last run."""
    seconds: dict[str, list[float]] = {v.label: [] for v in variants}
    vectors: dict[str, np.ndarray] = {}
    for run in range(runs):
        for variant in variants:
            embedder = variant.embedder(batch_size)
            embedder.warm_up()
            start = time.perf_counter()
            vectors[variant.label] = embedder.embed(texts)
            seconds[variant.label].append(time.perf_counter() - start)
        print(f"run {run + 1}/{runs}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in seconds.items()), file=sys.stderr)
    return seconds, vectors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--base", type=Path, default=Path("build/recogniser_base"), help="a 12-layer build")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    default = SentenceEmbedder()
    args.default_runtime, args.default_precision = default.runtime, default.precision
    corpora = args.data_root / "text_corpora"
    english, chinese = sentences(corpora / EN_FILE, 128), sentences(corpora / ZH_FILE, 128)
    texts = [t for pair in zip(english, chinese, strict=True) for t in pair]
    with tempfile.TemporaryDirectory(prefix="recogniser-speed-") as scratch:
        os.environ["XDG_CACHE_HOME"] = scratch  # the graphs (hundreds of MB) go with the scratch folder
        six = shallower(args.base, 6, Path(scratch) / "layers6")
        variants = [Variant("MiniLM-L6 (service default)", None, "auto")] + [
            Variant(f"e5-small {n} layers {p}", folder, p)
            for n, folder in ((12, args.base), (6, six)) for p in ("fp32", "int8")]
        seconds, vectors = timed(variants, texts, args.runs, args.batch_size)
        sizes = {v.label: graph_path(v.folder, None, v.precision, Path(scratch) / "ebmrag").stat().st_size
                 for v in variants if v.folder is not None}
        tokens = {"MiniLM": mean_tokens(bundled_model_dir(), texts), "e5": mean_tokens(args.base, texts)}
    emit(args.out, "recogniser-speed", lines(variants, seconds, vectors, sizes, tokens, texts, args))
    return 0


def lines(variants: list[Variant], seconds: dict[str, list[float]], vectors: dict[str, np.ndarray],
          sizes: dict[str, int], tokens: dict[str, float], texts: list[str], args: argparse.Namespace) -> list[str]:
    baseline = statistics.median(seconds[variants[0].label])
    out = [f"{machine()} (nproc {len(os.sched_getaffinity(0))}). Date: {date.today().isoformat()}. "
           f"Command: `{COMMAND}`; {len(texts)} sentences (128 MTSamples EN, 128 cEHRNER ZH), batch "
           f"{args.batch_size}, median of {args.runs} runs, each on a fresh embedder loaded before the clock. "
           f"Tokens per sentence: MiniLM {tokens['MiniLM']:.1f}, e5-small {tokens['e5']:.1f}. The service default "
           f"is runtime {args.default_runtime}, precision {args.default_precision}.", "",
           "| encoder | seconds | sentences/s | time × MiniLM | graph MiB | int8 cosine to fp32, min | mean |",
           "|---|---|---|---|---|---|---|"]
    for v in variants:
        median = statistics.median(seconds[v.label])
        size = f"{sizes[v.label] / 2**20:.0f}" if v.label in sizes else "(bundled)"
        quality = " | "
        if v.precision == "int8":
            cosines = np.sum(vectors[v.label] * vectors[v.label.replace("int8", "fp32")], axis=1)
            quality = f"{cosines.min():.4f} | {cosines.mean():.4f}"
        out.append(f"| {v.label} | {median:.2f} | {len(texts) / median:.0f} | {median / baseline:.2f} | {size} | "
                   f"{quality} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
