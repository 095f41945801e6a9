"""Fine-tune the recogniser of critical facts: a small multilingual encoder (bench/build_recogniser_base.py) with two
heads, trained on the licensed examples of bench/recogniser_data.py.

    python bench/train_recogniser.py --base build/recogniser_base --data build/recogniser_data \\
        --out build/recogniser [--epochs 2 --max-tokens 96]

For a sentence or clause the model says which kinds of critical fact it states (allergy, adverse reaction,
pathology, genetic result, critical result: one sigmoid each, on the mean of the token states) and, per token,
whether it lies inside a DRUG, REACTION, GENE, VARIANT, ANALYTE or VALUE span (one sigmoid per type).

Why one sigmoid per span type rather than BIO tags: the corpora annotate different things (TAC 2017 marks
reactions but not drugs; cEHRNER marks drugs and tests but not reactions; PsyTAR marks nothing), so a type a source
does not annotate must not be learned as "outside" from it. The loss of a span type counts only on examples whose
source annotates it (`ANNOTATED`). Kinds are learned from every example, weighted by its `weight` (gold above
silver above weak).

CPU, a plain PyTorch loop, examples bucketed by length so a batch pads little; the word embeddings stay frozen
(most of the parameters, and the part a small corpus would most easily spoil). What it writes: `model.safetensors`
(encoder and heads), `config.json`, `tokenizer.json` and `card.json` (the data's sources and licences, the
epochs, the dev measures and the thresholds chosen on dev).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

KINDS = ("allergy", "adr", "pathology", "genetic", "critical_result")
SPAN_TYPES = ("DRUG", "REACTION", "GENE", "VARIANT", "ANALYTE", "VALUE")
EVERYWHERE = ("ANALYTE", "VALUE", "GENE", "VARIANT")  # recognised by the builder's vocabularies on every example
ANNOTATED = {  # source -> the span types its annotation marks (beyond EVERYWHERE)
    "tac2017": ("REACTION",),
    "bc5cdr": ("DRUG", "REACTION"),
    "cehrner": ("DRUG",),
    "cmedqaner": ("DRUG",),
    "authored": ("DRUG", "REACTION"),  # bench/recogniser_authored.py marks every slot it fills
}
log = logging.getLogger("train_recogniser")


@dataclass(frozen=True)
class Example:
    ids: list[int]
    kinds: list[float]
    tags: list[list[float]]  # per token, per span type: 1 inside, 0 outside
    tag_mask: list[float]  # per span type: 1 when the source annotates it
    weight: float


def annotated(source: str) -> tuple[str, ...]:
    key = next((k for k in ANNOTATED if k in source.lower()), "")
    return EVERYWHERE + ANNOTATED.get(key, ())


def encode(tokenizer: Tokenizer, item: dict[str, Any], max_tokens: int) -> Example:
    encoding = tokenizer.encode(item["text"])
    ids, offsets = encoding.ids[:max_tokens], encoding.offsets[:max_tokens]
    tags = [[0.0] * len(SPAN_TYPES) for _ in ids]
    for span in item.get("spans", []):
        column = SPAN_TYPES.index(span["type"])
        for i, (start, end) in enumerate(offsets):
            if end > start and start < span["end"] and end > span["start"]:
                tags[i][column] = 1.0
    marked = annotated(str(item.get("source", "")))
    return Example(ids, [1.0 if k in item.get("kinds", []) else 0.0 for k in KINDS], tags,
                   [1.0 if t in marked else 0.0 for t in SPAN_TYPES], float(item.get("weight", 1.0)))


def read_examples(path: Path, tokenizer: Tokenizer, max_tokens: int) -> list[Example]:
    with path.open(encoding="utf-8") as handle:
        return [encode(tokenizer, json.loads(line), max_tokens) for line in handle if line.strip()]


def batches(examples: Sequence[Example], size: int, rng: random.Random | None) -> Iterator[list[Example]]:
    """Examples of like length together (little padding); the batches in random order when training."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    chunks = [[examples[i] for i in order[at:at + size]] for at in range(0, len(order), size)]
    if rng is not None:
        rng.shuffle(chunks)
    yield from chunks


def collate(batch: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width))
    tags = torch.zeros((len(batch), width, len(SPAN_TYPES)))
    for row, example in enumerate(batch):
        ids[row, :len(example.ids)] = torch.tensor(example.ids)
        mask[row, :len(example.ids)] = 1
        tags[row, :len(example.ids)] = torch.tensor(example.tags)
    return {"ids": ids, "mask": mask, "tags": tags, "kinds": torch.tensor([e.kinds for e in batch]),
            "tag_mask": torch.tensor([e.tag_mask for e in batch]), "weight": torch.tensor([e.weight for e in batch])}


class Recogniser(torch.nn.Module):
    """The encoder with a kinds head on the mean of the token states and a span head on each token."""

    def __init__(self, base: Path, weights: bool = True) -> None:
        """`base`: a folder with config.json and, with `weights`, the base encoder's model.safetensors (a trained
        recogniser's own weights are loaded by its caller: bench/eval_recogniser.py)."""
        super().__init__()
        from transformers import BertConfig, BertModel

        self.encoder = BertModel(BertConfig(**json.loads((base / "config.json").read_text())), add_pooling_layer=False)
        if weights:
            missing, unexpected = self.encoder.load_state_dict(load_file(str(base / "model.safetensors")), strict=False)
            if [k for k in missing if "position_ids" not in k] or unexpected:
                raise SystemExit(f"{base}: weights do not fit the config (missing {missing}, unexpected {unexpected})")
        hidden = self.encoder.config.hidden_size
        self.kinds = torch.nn.Linear(hidden, len(KINDS))
        self.spans = torch.nn.Linear(hidden, len(SPAN_TYPES))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        states = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (states * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.kinds(pooled), self.spans(states)


def loss_of(model: Recogniser, batch: dict[str, torch.Tensor], kind_weight: torch.Tensor) -> torch.Tensor:
    kinds, spans = model(batch["ids"], batch["mask"])
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    kind_loss = (bce(kinds, batch["kinds"], pos_weight=kind_weight, reduction="none").mean(1) * batch["weight"]).mean()
    token_mask = batch["mask"].unsqueeze(-1) * batch["tag_mask"].unsqueeze(1)
    span_loss = (bce(spans, batch["tags"], reduction="none") * token_mask).sum() / token_mask.sum().clamp(min=1)
    return kind_loss + span_loss


@torch.no_grad()
def predict(model: Recogniser, examples: Sequence[Example], pad_id: int, size: int = 64) -> list[list[float]]:
    model.eval()
    out: dict[int, list[float]] = {}
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    for at in range(0, len(order), size):
        chunk = [examples[i] for i in order[at:at + size]]
        batch = collate(chunk, pad_id)
        probabilities = torch.sigmoid(model(batch["ids"], batch["mask"])[0]).tolist()
        out.update(zip(order[at:at + size], probabilities, strict=True))
    model.train()
    return [out[i] for i in range(len(examples))]


def measures(examples: Sequence[Example], probabilities: Sequence[Sequence[float]],
             thresholds: Sequence[float]) -> dict[str, dict[str, float]]:
    """Per kind: precision, recall and support at its threshold."""
    report = {}
    for k, kind in enumerate(KINDS):
        hits = [(p[k] >= thresholds[k], e.kinds[k] == 1.0) for e, p in zip(examples, probabilities, strict=True)]
        tp, fp = sum(a and b for a, b in hits), sum(a and not b for a, b in hits)
        positives = sum(b for _, b in hits)
        report[kind] = {"precision": round(tp / (tp + fp), 3) if tp + fp else float("nan"),
                        "recall": round(tp / positives, 3) if positives else float("nan"), "support": positives,
                        "threshold": thresholds[k]}
    return report


def recall_thresholds(examples: Sequence[Example], probabilities: Sequence[Sequence[float]],
                      recall: float) -> list[float]:
    """Per kind, the highest threshold that keeps `recall` of dev's positives (a missed critical fact costs more
    than a false alarm); 0.5 for a kind without positives."""
    chosen = []
    for k in range(len(KINDS)):
        scores = sorted((p[k] for e, p in zip(examples, probabilities, strict=True) if e.kinds[k] == 1.0), reverse=True)
        chosen.append(round(scores[max(0, math.ceil(recall * len(scores)) - 1)], 4) if scores else 0.5)
    return chosen


def train(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    tokenizer = Tokenizer.from_file(str(args.base / "tokenizer.json"))
    pad_id = int(json.loads((args.base / "config.json").read_text()).get("pad_token_id", 0))
    train_set = read_examples(args.data / "train.jsonl", tokenizer, args.max_tokens)
    for extra in getattr(args, "extra", []):  # authored examples: training only, never dev
        train_set += read_examples(extra, tokenizer, args.max_tokens)
    dev_set = read_examples(args.data / "dev.jsonl", tokenizer, args.max_tokens)
    model = Recogniser(args.base)
    model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
    positives = torch.tensor([sum(e.kinds[k] for e in train_set) for k in range(len(KINDS))])
    kind_weight = ((len(train_set) - positives) / positives.clamp(min=1)).sqrt().clamp(1, 20)
    heads = [*model.kinds.parameters(), *model.spans.parameters()]
    encoder = [p for p in model.encoder.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW([{"params": encoder, "lr": args.lr}, {"params": heads, "lr": args.lr * 20}],
                                  weight_decay=0.01)
    steps = args.epochs * math.ceil(len(train_set) / args.batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=[args.lr, args.lr * 20], total_steps=steps,
                                                   pct_start=0.06)
    log.info("train %d, dev %d examples; %d steps", len(train_set), len(dev_set), steps)
    started = time.monotonic()
    with Progress() as progress:
        task = progress.add_task("training", total=steps)
        for _ in range(args.epochs):
            for chunk in batches(train_set, args.batch, rng):
                loss = loss_of(model, collate(chunk, pad_id), kind_weight)
                loss.backward()  # type: ignore[no-untyped-call]
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimiser.step()
                schedule.step()
                optimiser.zero_grad()
                progress.update(task, advance=1, description=f"training (loss {loss.item():.3f})")
    dev_probabilities = predict(model, dev_set, pad_id)
    thresholds = recall_thresholds(dev_set, dev_probabilities, args.dev_recall)
    return {"minutes": round((time.monotonic() - started) / 60, 1), "train_examples": len(train_set),
            "extra_training_data": [str(path) for path in getattr(args, "extra", [])],
            "dev": measures(dev_set, dev_probabilities, thresholds),
            "thresholds": dict(zip(KINDS, thresholds, strict=True)),
            "dev_at_half": measures(dev_set, dev_probabilities, [0.5] * len(KINDS)), "model": model}


def save(model: Recogniser, args: argparse.Namespace, card: dict[str, Any]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    weights = {f"encoder.{k}": v.contiguous() for k, v in model.encoder.state_dict().items() if "position_ids" not in k}
    weights |= {f"kinds.{k}": v for k, v in model.kinds.state_dict().items()}
    weights |= {f"spans.{k}": v for k, v in model.spans.state_dict().items()}
    save_file(weights, str(args.out / "model.safetensors"))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(args.base / name, args.out / name)
    manifest = args.data / "manifest.json"
    card["data"] = json.loads(manifest.read_text()) if manifest.exists() else str(args.data)
    card |= {"kinds": KINDS, "span_types": SPAN_TYPES, "max_tokens": args.max_tokens, "epochs": args.epochs,
             "lr": args.lr, "seed": args.seed}
    (args.out / "card.json").write_text(json.dumps(card, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=Path("build/recogniser_base"))
    parser.add_argument("--data", type=Path, default=Path("build/recogniser_data"))
    parser.add_argument("--out", type=Path, default=Path("build/recogniser"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--dev-recall", type=float, default=0.95, help="the recall on dev each kind's threshold keeps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--extra", type=Path, action="append", default=[],
                        help="more JSONL examples for training only (bench/recogniser_authored.py); repeatable")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = train(args)
    model = result.pop("model")
    save(model, args, result)
    log.info("%s", json.dumps({k: v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
