"""Knowledge-base commands: `ebmrag ingest`, `delete`, `search`, `kb stats`."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ebmrag.cli.common import (
    BaseUrlOption,
    ConfigOption,
    JsonOption,
    KbOption,
    LlmOption,
    ModelOption,
    console,
    progress_bar,
    progress_callback,
    settings_from,
    stderr,
    user_errors,
)
from ebmrag.compose import Resources, build_retriever, build_rewriter, build_voter, cache_dir_of, open_kb
from ebmrag.config import load_settings
from ebmrag.index.kb import IngestReport
from ebmrag.index.prepare import default_workers
from ebmrag.index.sync import ingest_paths
from ebmrag.index.types import Filters
from ebmrag.ingest.readers import FieldMap
from ebmrag.retrieve.query_rewrite import Rewrite
from ebmrag.retrieve.vote import DocumentHit
from ebmrag.text.sentences import split_sentences

kb_app = typer.Typer(help="Inspect a knowledge base.", no_args_is_help=True)


def report_table(report: IngestReport) -> Table:
    table = Table(title=f"generation {report.generation}", title_justify="left")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for name in ("added", "updated", "unchanged", "deleted", "errors"):
        table.add_row(name, str(len(getattr(report, name))))
    table.add_row("chunks written", str(report.chunks_written))
    table.add_row("chunks in knowledge base", str(report.chunks_total))
    table.caption = f"embedding {report.seconds_embedding:.1f} s, indexing {report.seconds_indexing:.1f} s"
    return table


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders: txt, md, html, pdf, jsonl.")],
    kb: KbOption,
    sync: Annotated[bool, typer.Option(help="Delete documents that came from these paths and are gone.")] = False,
    field: Annotated[list[str] | None, typer.Option("--field", help="JSONL mapping NAME=FIELD: text=body.")] = None,
    max_file_mb: Annotated[int, typer.Option(help="Refuse files larger than this.")] = 50,
    source: Annotated[str, typer.Option(help="Name this source: ids become NAME/<path>, so two folders of "
                                        "one name stay apart.")] = "",
    ray: Annotated[str | None, typer.Option(help="Read, chunk and embed on a Ray cluster: 'auto' or its "
                                            "address (the 'ray' extra; paths must be visible to every node).")] = None,
    ray_actors: Annotated[int, typer.Option(help="Embedding actors on the cluster (0: one per CPU).")] = 0,
    config: ConfigOption = None,
) -> None:
    """Add or update documents; unchanged ones are skipped by content hash. Bad files are reported, not fatal."""
    with user_errors():
        settings = load_settings(config)
        knowledge_base = open_kb(settings, kb)
        field_map = FieldMap.parse(field or [])
        cluster = None
        if ray:
            from ebmrag.index.distributed import RayPipeline

            cluster = RayPipeline(ray, knowledge_base.config, cache_dir_of(settings), ray_actors)
        with progress_bar() as bar:
            report = ingest_paths(knowledge_base, paths, sync, field_map, max_file_mb * 2**20, progress_callback(bar),
                                  source, cluster, settings.storage.workers or default_workers())
    console.print(report_table(report))
    for error in report.errors:
        stderr.print(f"[red]error[/] {escape(str(error))}", highlight=False, soft_wrap=True)
    if report.errors and not report.changed and not report.unchanged:
        raise typer.Exit(code=1)


def delete(
    doc_ids: Annotated[list[str], typer.Argument(help="Document ids to remove.")],
    kb: KbOption,
    config: ConfigOption = None,
) -> None:
    """Remove documents with all of their chunks, vectors and postings."""
    with user_errors():
        report = open_kb(load_settings(config), kb).apply([], doc_ids)
    console.print(report_table(report))
    for error in report.errors:
        stderr.print(f"[red]error[/] {escape(str(error))}", highlight=False, soft_wrap=True)
    if report.errors:
        raise typer.Exit(code=1)


def search(
    query: Annotated[str, typer.Argument(help="The question.")],
    kb: KbOption,
    k: Annotated[int | None, typer.Option("--k", help="Number of chunks.")] = None,
    mode: Annotated[str | None, typer.Option(help="bm25, dense or hybrid.")] = None,
    source: Annotated[str, typer.Option(help="Only chunks from this source.")] = "",
    section: Annotated[str, typer.Option(help="Only chunks of this section.")] = "",
    authority: Annotated[str, typer.Option(help="Only this authority level.")] = "",
    date_from: Annotated[str, typer.Option(help="ISO date prefix, inclusive.")] = "",
    date_to: Annotated[str, typer.Option(help="ISO date prefix, inclusive.")] = "",
    rerank_model: Annotated[str | None, typer.Option(help="Local cross-encoder folder to rerank chunks.")] = None,
    by_document: Annotated[bool, typer.Option(
        help="ICA-RAG: every sentence of the query votes with its chunks; prints documents.")] = False,
    expand: Annotated[int | None, typer.Option(help="Query expansion: a model rewords the query N times "
                                                    "(needs --llm openai).")] = None,
    hyde: Annotated[bool | None, typer.Option(help="HyDE: search with a model-written answer passage too "
                                                   "(needs --llm openai).")] = None,
    llm: LlmOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Search the knowledge base."""
    with user_errors():
        settings = settings_from(config, llm=llm, base_url=base_url, model=model, retrieval={
            "mode": mode, "rerank_model": rerank_model, "query_variants": expand, "hyde": hyde})
        if settings.llm.backend == "local":
            raise ValueError("this command needs an OpenAI-compatible endpoint (--llm openai); the local backend "
                             "answers `ask` and `eval generation`")
        resources = Resources.open(settings, kb)
        retriever = build_retriever(resources)
        filters = Filters(source, section, authority, date_from, date_to)
        rewriter = build_rewriter(resources)
        rewrite = rewriter.run(query) if rewriter else Rewrite()
        if rewrite.fault:
            stderr.print(f"[yellow]{rewrite.fault}; searching the query as written[/]")
        if by_document:
            voter = build_voter(retriever, replace(settings.retrieval, vote_documents=k if k is not None else
                                                     settings.retrieval.vote_documents))
            sentences = [s.text for s in split_sentences(query)] or [query]
            extra = [*rewrite.variants, *([rewrite.hypothesis] if rewrite.hypothesis else [])]
            documents = voter.run([*sentences, *extra], filters)
        else:
            hits = retriever.run(query, k if k is not None else settings.retrieval.k, filters, rewrite.variants,
                                 rewrite.hypothesis)
    if by_document:
        _print_documents(documents, as_json)
        return
    if as_json:
        typer.echo(json.dumps([h.to_json() for h in hits], ensure_ascii=False, indent=2))
        return
    table = Table(title=f"{retriever.mode} · {len(hits)} chunks", title_justify="left")
    for column in ("#", "score", "chunk", "section", "text"):
        table.add_column(column)
    for rank, hit in enumerate(hits, start=1):
        snippet = hit.text if len(hit.text) < 160 else hit.text[:157] + "..."
        table.add_row(str(rank), f"{hit.score:.4f}", escape(hit.chunk_id), escape(hit.section), escape(snippet))
    console.print(table)


def _print_documents(documents: list[DocumentHit], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([d.to_json() for d in documents], ensure_ascii=False, indent=2))
        return
    table = Table(title=f"documents by sentence votes · {len(documents)}", title_justify="left")
    for column in ("#", "votes", "document", "best chunk"):
        table.add_column(column)
    for rank, doc in enumerate(documents, start=1):
        best = doc.chunks[0].text
        table.add_row(str(rank), str(doc.votes), escape(doc.doc_id), escape(best[:157] + "..." if len(best) > 160
                                                                             else best))
    console.print(table)


@kb_app.command("compact")
def kb_compact(kb: KbOption, config: ConfigOption = None) -> None:
    """Merge every segment into one without deleted rows (also converts a knowledge base of an older format)."""
    with user_errors():
        knowledge_base = open_kb(load_settings(config), kb)
        with progress_bar() as bar:
            report = knowledge_base.compact(progress_callback(bar))
    console.print(f"generation {report.generation}: {report.chunks_total} chunks in one segment"
                  + (f" (merged {report.segments_merged})" if report.segments_merged else " (already compact)"))


@kb_app.command("stats")
def kb_stats(kb: KbOption, as_json: JsonOption = False, config: ConfigOption = None) -> None:
    """Documents, chunks, segments, deleted chunks awaiting a merge, generation and size on disk."""
    with user_errors():
        stats = open_kb(load_settings(config), kb).stats()
    if as_json:
        typer.echo(json.dumps(asdict(stats), indent=2))
        return
    table = Table(title=str(kb), title_justify="left", show_header=False)
    for key, value in asdict(stats).items():
        table.add_row(key, escape(str(value)))
    console.print(table)
