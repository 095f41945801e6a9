"""What sharing one embedder between the packer and the knowledge base changes (structure issue, item 5).

The knowledge base embeds at its manifest's profile (all-MiniLM-L6-v2 cut at 128 tokens); the packer
alone embeds at the model's own limit (256). Sharing one instance means the packer's similarities
come from the 128-token profile. This measures, on real cases drowned in noise, how many fragments
are long enough to differ, how far their similarity moves, and the packing rows under each profile.

Run: python bench/shared_embedder.py --data-root ../shared/data --out docs/results/shared_embedder.md
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import date
from pathlib import Path

import numpy as np

from ebmrag.eval.cases import load_cases
from ebmrag.eval.noise import NoiseConfig
from ebmrag.eval.packing_eval import evaluate
from ebmrag.eval.packing_report import dataset_dir
from ebmrag.eval.packing_suite import NEUTRAL, Suite
from ebmrag.evidence.entities import EntityCompressor, default_extractor
from ebmrag.evidence.tiering import Tiering
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.models.text_classifier import load_text_classifier
from ebmrag.models.tokens import make_token_counter
from ebmrag.packing.packer import make_packer
from ebmrag.packing.utility import CandidateBuilder, UtilityParams
from report import write_section  # bench/ is on sys.path when a script here runs

STRATEGIES = ("fifo", "ebm-greedy", "ebm-exact")
WINDOWS = (256, 512, 1024)


def measure(dataset: str, data_root: Path, max_tokens: int | None, limit: int) -> tuple[list[dict[str, object]],
                                                                                        list[float]]:
    folder = dataset_dir(data_root, dataset)
    if folder is None:
        raise SystemExit(f"no {dataset} files under {data_root}")
    counter = make_token_counter("bundled")
    embedder = SentenceEmbedder(max_tokens=max_tokens)  # the profile under test, not the configured one
    tiering = Tiering(TierClassifier(model=load_text_classifier(BUNDLED_TIER_MODEL, embedder)))
    extractor = default_extractor()
    suite = Suite(CandidateBuilder(embedder, counter, NEUTRAL, compressor=EntityCompressor(extractor)), tiering,
                  extractor, counter, NoiseConfig())
    prepared = suite.prepare(load_cases(dataset, folder, limit))
    rows = evaluate(prepared, [make_packer(s, counter) for s in STRATEGIES], WINDOWS, UtilityParams())
    sims = [m.similarity for case in prepared for m in case.measured]
    return [{k: v for k, v in asdict(r).items() if k != "ms_per_pack"} for r in rows], sims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"# One embedder for packer and knowledge base ({date.today().isoformat()})", "",
             "Command: `python bench/shared_embedder.py --data-root ../shared/data`", "",
             "| dataset | fragments | similarity changed (> 1e-4) | max abs change | rows that differ |",
             "|---|---|---|---|---|"]
    detail = []
    for dataset in ("agentclinic", "medqa"):
        rows_own, sims_own = measure(dataset, args.data_root, None, args.limit)
        rows_kb, sims_kb = measure(dataset, args.data_root, 128, args.limit)
        delta = np.abs(np.asarray(sims_own) - np.asarray(sims_kb))
        differ = [(a, b) for a, b in zip(rows_own, rows_kb, strict=True) if a != b]
        lines.append(f"| {dataset} | {len(delta)} | {int((delta > 1e-4).sum())} | {delta.max():.4f} | "
                     f"{len(differ)} of {len(rows_own)} |")
        for a, b in differ:
            changes = ", ".join(f"{key} {a[key]:.3f} -> {b[key]:.3f}" for key in a
                                if isinstance(a[key], float) and a[key] != b[key])
            detail.append(f"- {dataset} {a['strategy']} W={a['window']}: {changes}")
    text = "\n".join([*lines, "", "Rows that differ (own profile -> knowledge-base profile):", "",
                       *(detail or ["none"]), ""])
    print(text)
    if args.out:
        write_section(args.out, "shared-embedder", text)


if __name__ == "__main__":
    main()
