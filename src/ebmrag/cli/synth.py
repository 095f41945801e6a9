"""`ebmrag synth questions`: KISA multi-hop questions from a knowledge base (research.synthesis)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ebmrag.cli.common import (
    BaseUrlOption,
    ConfigOption,
    KbOption,
    LlmOption,
    ModelOption,
    settings_from,
    stderr,
    user_errors,
    write_jsonl,
)

synth_app = typer.Typer(help="Synthesize training and evaluation data from a knowledge base.", no_args_is_help=True)


@synth_app.command("questions")
def questions(
    kb: KbOption,
    out: Annotated[Path, typer.Option(help="JSONL of questions (replaced atomically).")],
    n: Annotated[int, typer.Option("--n", help="How many questions.")] = 100,
    min_hops: Annotated[int, typer.Option("--min-hops", help="Shortest path kept.")] = 3,
    max_hops: Annotated[int, typer.Option("--max-hops", help="Longest path searched.")] = 6,
    rare_max: Annotated[int, typer.Option("--rare-max", help="Seeds: entities in at most this many chunks.")] = 3,
    hub_max: Annotated[int, typer.Option("--hub-max", help="Entities in more chunks never sit inside a path.")] = 150,
    bridge_max: Annotated[int, typer.Option("--bridge-max", help="Walk back from an entity to a condition only "
                                            "through entities in at most this many chunks.")] = 3,
    seed: Annotated[int, typer.Option(help="Random seed (ties among equally rare seeds).")] = 13,
    measure: Annotated[bool, typer.Option("--measure", help="Also report the hop distribution and how often the "
                                          "retriever finds each hop's chunk in its top 10.")] = False,
    llm: LlmOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    config: ConfigOption = None,
) -> None:
    """Rare entities -> the longest valid chunk-backed path -> a question, its gold answer and chunk chain."""
    from ebmrag.compose import Resources, build_retriever
    from ebmrag.research.synthesis import EntityGraph, chain_coverage, synthesize

    with user_errors():
        resources = Resources.open(settings_from(config, llm=llm, base_url=base_url, model=model), kb)
        retriever = build_retriever(resources)
        client = resources.chat_client
        with stderr.status("building the entity graph..."):
            graph = EntityGraph.from_kb(retriever.kb, resources.extractor)
        with stderr.status("searching paths..."):
            made = synthesize(graph, n, min_hops, max_hops, rare_max, hub_max, seed=seed, bridge_max=bridge_max,
                              client=client)
        write_jsonl(out, (q.to_json() for q in made))
        stderr.print(f"{len(made)} questions ({len(graph.adjacent)} nodes, {graph.edges} edges) -> {out}")
        if measure:
            with stderr.status("retrieving every hop..."):
                typer.echo(json.dumps(chain_coverage(made, retriever).to_json()))
