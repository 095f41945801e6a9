"""Adapt the bundled all-MiniLM-L6-v2 to consumer medical questions: MedQuAD question -> answer-section pairs,
multiple-negatives ranking loss (scale 20) over in-batch negatives plus, with `--hard-negatives`, another section
of the same MedQuAD page (the same condition, a different question type: what a consumer question must tell apart).
CPU, a plain PyTorch loop (no `datasets`/`accelerate`), bf16 autocast where the CPU has it.

    python bench/finetune_minilm.py --data-root ../shared/data --out /tmp/minilm-medquad             # full model
    python bench/finetune_minilm.py --data-root ../shared/data --lora-rank 16 --hard-negatives --scale 0.3 \\
        --out src/ebmrag/models/deltas/minilm_medquad.npz                                          # shipped delta

A full fine-tune writes a sentence-transformers folder usable as `[kb] embedding_model`; `--lora-rank` trains
low-rank adapters on every encoder Linear and writes them as the small delta file behind the named profile
`minilm-medquad` (`ebmrag.models.adapters`). Positives are written the way the knowledge base indexes a chunk
("focus — question type" above the text). LiveQA questions are never read.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from sentence_transformers import SentenceTransformer

from ebmrag.models.adapters import LORA_TARGETS, save_delta
from ebmrag.models.embeddings import float32_weights, native_bf16
from ebmrag.models.tokens import bundled_model_dir

Example = tuple[str, str, str]  # question, positive section, hard negative (another section of the page)


def examples(path: Path, seed: int) -> list[Example]:
    rng, out = random.Random(seed), []
    for line in path.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        sections = [(str(qa.get("question", "")).strip(), f"{doc.get('focus', '')} — {qa.get('qtype', '')}\n"
                     f"{str(qa.get('answer', '')).strip()}") for qa in doc["qa"]
                    if str(qa.get("question", "")).strip() and len(str(qa.get("answer", "")).strip()) > 40]
        for i, (question, positive) in enumerate(sections):
            others = [s for j, (_, s) in enumerate(sections) if j != i and s.split("\n", 1)[1] !=
                      positive.split("\n", 1)[1]]
            out.append((question, positive, rng.choice(others) if others else ""))
    return out


class LoraLinear(torch.nn.Module):
    """y = base(x) + scale * B(A(x)); the base stays frozen, B starts at zero so training starts from the model."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / base.in_features ** 0.5)
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + self.scale * (x @ self.a.T @ self.b.T)
        return out


def add_lora(encoder: Any, rank: int, alpha: float) -> dict[str, LoraLinear]:
    for parameter in encoder.parameters():
        parameter.requires_grad_(False)
    wrapped: dict[str, LoraLinear] = {}
    for name, module in list(encoder.named_modules()):
        if name.endswith(LORA_TARGETS) and isinstance(module, torch.nn.Linear):
            parent_name, _, child = name.rpartition(".")
            wrapped[name] = LoraLinear(module, rank, alpha)
            setattr(encoder.get_submodule(parent_name), child, wrapped[name])
    return wrapped


def loss_of(model: Any, batch: list[Example], hard: bool) -> torch.Tensor:
    def embed(texts: list[str]) -> torch.Tensor:
        vectors: torch.Tensor = model(model.tokenize(texts))["sentence_embedding"]
        return torch.nn.functional.normalize(vectors.float(), dim=-1)

    queries = embed([q for q, _, _ in batch])
    candidates = [p for _, p, _ in batch] + ([n for _, _, n in batch if n] if hard else [])
    scores = 20.0 * queries @ embed(candidates).T
    return torch.nn.functional.cross_entropy(scores, torch.arange(len(batch)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.0, help="default 2e-5 full, 3e-4 LoRA")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--hard-negatives", action="store_true")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="keep this share of the trained delta (weight-space interpolation with the base model: "
                             "the full delta over-fits MedQuAD's templated questions, docs/results/retrieval.md)")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    data = examples(args.data_root / "medquad" / "medquad_docs.jsonl", args.seed)
    # float32 parameters: the bundled weights are stored as float16, and transformers 5 would keep that dtype
    model = SentenceTransformer(str(bundled_model_dir()), device="cpu", local_files_only=True,
                                model_kwargs=float32_weights())
    model.max_seq_length = args.max_tokens
    lora = add_lora(model[0].auto_model, args.lora_rank, args.lora_alpha) if args.lora_rank else {}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trainable, lr=args.lr or (3e-4 if lora else 2e-5))
    steps = args.epochs * (len(data) // args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / (0.1 * steps + 1), max(0.0, (steps - s) / (0.9 * steps))))
    model.train()
    started, step = time.perf_counter(), 0
    for epoch in range(args.epochs):
        random.Random(args.seed + epoch).shuffle(data)
        for start in range(0, len(data) - args.batch + 1, args.batch):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
                loss = loss_of(model, data[start:start + args.batch], args.hard_negatives)
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
            schedule.step()
            optimiser.zero_grad()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{steps} loss {loss.item():.3f} {time.perf_counter() - started:.0f} s", flush=True)
    model.eval()
    if lora:
        save_delta(args.out, {name: (m.a.detach().float().numpy(), args.scale * m.scale * m.b.detach().float().numpy())
                              for name, m in lora.items()},
                  {"pairs": len(data), "steps": step, "rank": args.lora_rank, "alpha": args.lora_alpha,
                   "hard_negatives": args.hard_negatives, "lr": optimiser.defaults["lr"], "seed": args.seed,
                   "interpolation": args.scale})
    else:
        model.save(str(args.out))
    print(f"{len(data)} pairs, {step} steps, {time.perf_counter() - started:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
