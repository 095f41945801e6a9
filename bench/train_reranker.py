"""Train a cross-encoder reranker for consumer medical questions from the bundled MiniLM, on this CPU.

Training groups come from MedQuAD only (LiveQA questions are never read): a MedQuAD question, its own answer section
as the positive and, as negatives, the sections the knowledge base's own hybrid retriever ranks highest for that
question that are not its answer (the confusions the reranker exists to fix: the right condition's other sections,
neighbouring conditions). Each chunk is shown the way the index sees it ("title — section" above the text). Loss:
softmax cross-entropy over each group (listwise), bf16 autocast where the CPU has it, a plain PyTorch loop.

    python bench/train_reranker.py --data-root ../shared/data --kb /tmp/kb-liveqa --out /tmp/reranker-medquad

The output folder is a sentence-transformers CrossEncoder (`[retrieval] rerank_model`, `--rerank-model`).
`--compress FOLDER --rank R --out F.npz` turns a trained folder into the small file that ships: every encoder Linear's
change as its best rank-R approximation (truncated SVD), the head, pooler, biases and layer norms whole; the
embedding tables are left as the bundled model has them (docs/results/retrieval.md measures what that costs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ebmrag.compose import Resources, build_retriever
from ebmrag.config import load_settings
from ebmrag.models.adapters import save_delta
from ebmrag.models.embeddings import float32_weights, native_bf16
from ebmrag.models.tokens import bundled_model_dir
from ebmrag.retrieve.search import HybridRetriever


@dataclass(frozen=True)
class Group:
    question: str
    positive: str
    negatives: tuple[str, ...]


def medquad_questions(path: Path, limit: int) -> list[tuple[str, str]]:
    """(question, answer id) for sections with a real answer; a deterministic hash sample of `limit`."""
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        for qa in json.loads(line).get("qa", []):
            if str(qa.get("question", "")).strip() and len(str(qa.get("answer", "")).strip()) > 40:
                pairs.append((str(qa["question"]).strip(), str(qa["answer_id"])))
    pairs.sort(key=lambda p: hashlib.sha256(p[1].encode()).hexdigest())
    return pairs[:limit] if limit else pairs


def words(text: str) -> set[str]:
    return set(text.lower().split())


def near_copy(a: str, b: str) -> bool:
    """Near-identical texts (MedQuAD repeats sections across pages and collections) are never negatives."""
    x, y = words(a), words(b)
    return bool(x and y) and len(x & y) / len(x | y) >= 0.8


def mine(retriever: HybridRetriever, pairs: list[tuple[str, str]], negatives: int, depth: int,
         seed: int) -> list[Group]:
    reader = retriever.kb.reader()
    titles = {d.doc_id: d.title for d in reader.documents().values()}
    shown: dict[str, str] = {}
    for c in reader.iter_chunks():  # a section is shown by its first chunk
        shown.setdefault(c.section_id, f"{titles.get(c.doc_id, '')} — {c.section}\n{c.text}")
    rng, groups = random.Random(seed), []
    for start in range(0, len(pairs), 256):
        batch = pairs[start:start + 256]
        for (question, answer_id), hits in zip(batch, retriever.run_many([q for q, _ in batch], depth), strict=True):
            positive = shown.get(answer_id)
            if positive is None:
                continue
            pool = [f"{titles.get(h.doc_id, '')} — {h.section}\n{h.text}" for h in hits
                    if h.section_id != answer_id]
            pool = [text for text in dict.fromkeys(pool) if not near_copy(text, positive)][:depth]
            if len(pool) >= negatives:
                groups.append(Group(question, positive, tuple(rng.sample(pool, negatives))))
    return groups


def train(groups: list[Group], out: Path, batch: int, lr: float, max_length: int, seed: int) -> None:
    torch.manual_seed(seed)
    base = str(bundled_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    # float32 parameters: the bundled weights are stored as float16, and transformers 5 would keep that dtype
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, local_files_only=True,
                                                               **float32_weights())
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    steps = len(groups) // batch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / (0.1 * steps + 1), max(0.0, (steps - s) / (0.9 * steps))))
    model.train()
    started = time.perf_counter()
    for step in range(steps):
        chunk = groups[step * batch:(step + 1) * batch]
        texts = [(g.question, t) for g in chunk for t in (g.positive, *g.negatives)]
        encoded = tokenizer([q for q, _ in texts], [t for _, t in texts], truncation="only_second",
                            max_length=max_length, padding=True, return_tensors="pt")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16()):
            logits = model(**encoded).logits.float().view(len(chunk), -1)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(chunk), dtype=torch.long))
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
        schedule.step()
        optimiser.zero_grad()
        if (step + 1) % 25 == 0:
            print(f"step {step + 1}/{steps} loss {loss.item():.3f} {time.perf_counter() - started:.0f} s", flush=True)
    model.eval()
    model.config.sbert_ce_default_activation_function = "torch.nn.modules.linear.Identity"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{len(groups)} groups, {steps} steps, {time.perf_counter() - started:.0f} s -> {out}")


def compress(folder: Path, rank: int, out: Path) -> None:
    """A trained cross-encoder folder -> a delta over the bundled MiniLM (`ebmrag.models.adapters`)."""
    base = AutoModelForSequenceClassification.from_pretrained(str(bundled_model_dir()), num_labels=1,
                                                              local_files_only=True, **float32_weights()).state_dict()
    tuned = AutoModelForSequenceClassification.from_pretrained(str(folder), local_files_only=True,
                                                               **float32_weights()).state_dict()
    layers, tensors = {}, {}
    for name, value in tuned.items():
        if "embeddings" in name or (name not in base and not name.startswith("classifier")):
            continue
        change = (value - base[name]).float() if name in base else value.float()
        if name.startswith(("classifier", "bert.pooler")) or value.dim() == 1:
            if name not in base or change.abs().max() > 0:
                tensors[name] = value.float().numpy()
            continue
        u, s, vh = torch.linalg.svd(change, full_matrices=False)
        root = s[:rank].sqrt()
        layers[name.removesuffix(".weight")] = ((root[:, None] * vh[:rank]).numpy(), (u[:, :rank] * root).numpy())
    save_delta(out, layers, {"rank": rank, "source": folder.name, "kind": "cross-encoder"}, tensors)
    print(f"{len(layers)} low-rank layers, {len(tensors)} whole tensors -> {out} ({out.stat().st_size:,} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--kb", type=Path, help="a knowledge base holding MedQuAD (where negatives come from)")
    parser.add_argument("--config", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=4000)
    parser.add_argument("--negatives", type=int, default=3)
    parser.add_argument("--depth", type=int, default=20, help="negatives are drawn from this many best hits")
    parser.add_argument("--batch", type=int, default=8, help="groups per step")
    parser.add_argument("--lr", type=float, default=4e-5)
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--compress", type=Path, help="a trained folder to write as a rank-R delta at --out")
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    if args.compress:
        compress(args.compress, args.rank, args.out)
        return
    if args.kb is None:
        parser.error("--kb is required for training")
    settings = load_settings(args.config)
    retriever = build_retriever(Resources.open(settings, args.kb))
    pairs = medquad_questions(args.data_root / "medquad" / "medquad_docs.jsonl", args.questions)
    started = time.perf_counter()
    groups = mine(retriever, pairs, args.negatives, args.depth, args.seed)
    print(f"mined {len(groups)} groups from {len(pairs)} questions in {time.perf_counter() - started:.0f} s",
          flush=True)
    random.Random(args.seed).shuffle(groups)
    train(groups, args.out, args.batch, args.lr, args.max_length, args.seed)


if __name__ == "__main__":
    main()
