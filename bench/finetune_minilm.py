"""Adapt the bundled all-MiniLM-L6-v2 to consumer medical questions: MedQuAD question -> answer pairs, in-batch
negatives (multiple-negatives ranking loss, scale 20), CPU, a plain PyTorch loop (no `datasets`/`accelerate`).

    python bench/finetune_minilm.py --data-root ../shared/data --out /tmp/minilm-medquad [--epochs 1]

Writes a sentence-transformers model folder usable as `[kb] embedding_model`. LiveQA questions are never read.
Pairs whose answer belongs to a document of the held-back hash half are kept out, so a knowledge base evaluation
can tell memorised answers from adapted ones (`--holdout-share`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformer

from ebmrag.evidence.tokens import bundled_model_dir


def pairs(path: Path, holdout_share: float) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        if int(hashlib.sha256(str(doc["doc_key"]).encode()).hexdigest(), 16) % 100 < holdout_share * 100:
            continue
        for qa in doc["qa"]:
            question, answer = str(qa.get("question", "")).strip(), str(qa.get("answer", "")).strip()
            if question and len(answer) > 40:
                out.append((question, f"{doc.get('focus', '')}. {answer}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--holdout-share", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(13)
    data = pairs(args.data_root / "medquad" / "medquad_docs.jsonl", args.holdout_share)
    model = SentenceTransformer(str(bundled_model_dir()), device="cpu", local_files_only=True)
    model.max_seq_length = args.max_tokens
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = args.epochs * (len(data) // args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(1.0, (s + 1) / (0.1 * steps + 1)))
    model.train()
    started, step = time.perf_counter(), 0
    for _ in range(args.epochs):
        random.Random(13 + step).shuffle(data)
        for start in range(0, len(data) - args.batch + 1, args.batch):
            batch = data[start:start + args.batch]
            queries = model(model.tokenize([q for q, _ in batch]))["sentence_embedding"]
            answers = model(model.tokenize([a for _, a in batch]))["sentence_embedding"]
            scores = 20.0 * torch.nn.functional.normalize(queries, dim=-1) @ \
                torch.nn.functional.normalize(answers, dim=-1).T
            loss = torch.nn.functional.cross_entropy(scores, torch.arange(len(batch)))
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
            schedule.step()
            optimiser.zero_grad()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{steps} loss {loss.item():.3f} {time.perf_counter() - started:.0f} s", flush=True)
    model.eval()
    model.save(str(args.out))
    print(f"{len(data)} pairs, {step} steps, {time.perf_counter() - started:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
