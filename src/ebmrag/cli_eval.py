"""Packing evaluation commands: `ebmrag eval packing` (one dataset) and `ebmrag eval packing-suite` (all)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ebmrag.cli import ConfigOption, _fail, console, eval_app
from ebmrag.cli_kb import _progress_callback, progress_bar
from ebmrag.config import Settings, load_settings
from ebmrag.errors import EbmragError
from ebmrag.eval.cases import DATASETS
from ebmrag.eval.noise import NoiseConfig
from ebmrag.eval.packing_suite import Suite, rows_table
from ebmrag.evidence.embeddings import SentenceEmbedder, default_cache_dir
from ebmrag.evidence.tokens import make_token_counter
from ebmrag.packing.packer import STRATEGIES
from ebmrag.packing.utility import CandidateBuilder, TierWeights, UtilityParams

NoiseRatio = Annotated[int, typer.Option(help="Noise fragments per signal fragment (the paper: 12).")]
RecentShare = Annotated[float, typer.Option(help="Share of the noise dated on the encounter day (paper: 0).")]
Seed = Annotated[int, typer.Option(help="Seed of the noise generator.")]


def make_suite(settings: Settings, noise: NoiseConfig) -> Suite:
    """Measures with neutral utility parameters; each experiment applies its own when it scores."""
    m = settings.models
    embedder = SentenceEmbedder(m.embedding_model or None, cache_dir=m.cache_dir or default_cache_dir())
    token_counter = make_token_counter(m.tokenizer)
    neutral = UtilityParams(TierWeights(1.0, 1.0, 1.0), 0.0, 0.0)
    return Suite(CandidateBuilder(embedder, token_counter, neutral), token_counter, noise)


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--{name} needs positive integers, got {text!r}")
    return values


@eval_app.command("packing")
def eval_packing(
    dataset: Annotated[str, typer.Option(help=f"One of {', '.join(DATASETS)}.")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Folder with the dataset's files.")],
    out: Annotated[Path, typer.Option(help="Folder for results.json and results.md.")],
    windows: Annotated[str, typer.Option(help="Token windows, comma-separated.")] = "256,512,1024,2048",
    strategies: Annotated[str, typer.Option(help="Packing strategies, comma-separated.")] = ",".join(STRATEGIES),
    limit: Annotated[int, typer.Option(help="Use the first N cases (0 = all).")] = 0,
    k_min: Annotated[int, typer.Option(help="Minimum fragments per tier for the EBM packers.")] = 1,
    noise_ratio: NoiseRatio = 12,
    recent_share: RecentShare = 0.0,
    seed: Seed = 0,
    config: ConfigOption = None,
) -> None:
    """RRCE, entity RRCE and its ceiling, T1 retention, utility ratio and time per pack on real cases."""
    from ebmrag.eval.packing_report import run_packing

    try:
        settings = load_settings(config)
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        unknown = sorted(set(names) - set(STRATEGIES))
        if unknown or not names:
            raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
        suite = make_suite(settings, NoiseConfig(ratio=noise_ratio, recent_share=recent_share, seed=seed))
        p = settings.packing
        params = UtilityParams(TierWeights(p.alpha, p.beta, p.gamma), p.decay_lambda, p.epsilon, p.similarity_floor)
        with progress_bar() as bar:
            rows = run_packing(suite, dataset, data_dir, _ints(windows, "windows"), names, out, limit, k_min, params,
                               _progress_callback(bar))
    except (EbmragError, ValueError, OSError, json.JSONDecodeError) as exc:
        raise _fail(exc) from None
    typer.echo(rows_table("results", f"{dataset}: packing results", rows).markdown())
    console.print(f"wrote {out / 'results.json'}")


@eval_app.command("packing-suite")
def eval_packing_suite(
    data_root: Annotated[Path, typer.Option("--data-root", help="Folder holding the MIRAGE, AgentClinic and "
                                            "CMB-Clin files (found by pattern, in subfolders too).")],
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("docs/results/packing"),
    limit: Annotated[int, typer.Option(help="Use the first N cases of each dataset (0 = all).")] = 0,
    sweep_cases: Annotated[int, typer.Option(help="Cases per dataset in the noise sweep.")] = 60,
    seed: Seed = 0,
    config: ConfigOption = None,
) -> None:
    """All EBM-Pack experiments (windows, noise, k_min, tier weights, ε × λ, greedy vs exact) with plots."""
    from ebmrag.eval.packing_report import run_suite

    try:
        suite = make_suite(load_settings(config), NoiseConfig(seed=seed))
        with progress_bar() as bar:
            seconds = run_suite(suite, data_root, out, limit, sweep_cases, _progress_callback(bar))
    except (EbmragError, ValueError, OSError, json.JSONDecodeError) as exc:
        raise _fail(exc) from None
    timing = ", ".join(f"{step} {value:.0f} s" for step, value in seconds.items())
    console.print(f"wrote {out}: {timing}")
