"""Knowledge-base commands: `ebmrag ingest`, `delete`, `search`, `kb stats`, `eval retrieval`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ebmrag.cli import ConfigOption, _fail, app, console, eval_app
from ebmrag.config import load_settings
from ebmrag.errors import EbmragError
from ebmrag.evidence.sentences import split_sentences
from ebmrag.factory import cache_dir, make_retriever, open_kb
from ebmrag.index.kb import IngestReport, KnowledgeBase, knowledge_base_stats
from ebmrag.index.rerank import DocumentHit, DocumentVoter
from ebmrag.index.search import Filters
from ebmrag.ingest.pipeline import ingest_paths
from ebmrag.ingest.readers import FieldMap

kb_app = typer.Typer(help="Inspect a knowledge base.", no_args_is_help=True)
app.add_typer(kb_app, name="kb")
KbOption = Annotated[Path, typer.Option("--kb", help="Knowledge-base directory.")]


@contextmanager
def progress_bar() -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        yield bar


def _progress_callback(bar: Progress) -> Callable[[str, int, int], None]:
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    return update


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


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders: txt, md, html, pdf, jsonl.")],
    kb: KbOption,
    sync: Annotated[bool, typer.Option(help="Delete documents that came from these paths and are gone.")] = False,
    field: Annotated[list[str] | None, typer.Option("--field", help="JSONL mapping NAME=FIELD: text=body.")] = None,
    max_file_mb: Annotated[int, typer.Option(help="Refuse files larger than this.")] = 50,
    config: ConfigOption = None,
) -> None:
    """Add or update documents; unchanged ones are skipped by content hash. Bad files are reported, not fatal."""
    try:
        settings = load_settings(config)
        knowledge_base = open_kb(settings, kb)
        field_map = FieldMap.parse(field or [])
        with progress_bar() as bar:
            report = ingest_paths(knowledge_base, paths, sync, field_map, max_file_mb * 2**20, _progress_callback(bar))
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None
    console.print(report_table(report))
    for error in report.errors:
        console.print(f"[red]error[/] {escape(str(error))}", highlight=False)
    if report.errors and not report.changed and not report.unchanged:
        raise typer.Exit(code=1)


@app.command()
def delete(
    doc_ids: Annotated[list[str], typer.Argument(help="Document ids to remove.")],
    kb: KbOption,
    config: ConfigOption = None,
) -> None:
    """Remove documents with all of their chunks, vectors and postings."""
    try:
        report = open_kb(load_settings(config), kb).apply([], doc_ids)
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None
    console.print(report_table(report))
    for error in report.errors:
        console.print(f"[red]error[/] {escape(str(error))}", highlight=False)
    if report.errors:
        raise typer.Exit(code=1)


@app.command()
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
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Search the knowledge base."""
    try:
        settings = load_settings(config)
        knowledge_base = KnowledgeBase(kb, cache_dir=cache_dir(settings))
        retriever = make_retriever(settings, knowledge_base, mode, rerank_model)
        filters = Filters(source, section, authority, date_from, date_to)
        if by_document:
            r = settings.retrieval
            voter = DocumentVoter(retriever, r.vote_chunks, k or r.vote_documents, r.vote_min_score)
            documents = voter.run([s.text for s in split_sentences(query)] or [query], filters)
        else:
            hits = retriever.run(query, k or settings.retrieval.k, filters)
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None
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


@kb_app.command("stats")
def kb_stats(kb: KbOption, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Documents, chunks, generation and size on disk."""
    try:
        stats = knowledge_base_stats(KnowledgeBase(kb))
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(asdict(stats), indent=2))
        return
    table = Table(title=str(kb), title_justify="left", show_header=False)
    for key, value in asdict(stats).items():
        table.add_row(key, escape(str(value)))
    console.print(table)


@eval_app.command("retrieval")
def eval_retrieval(
    dataset: Annotated[str, typer.Option(help="liveqa, pubmedqa or medquad.")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Folder with the questions / qrels files.")],
    kb: KbOption,
    corpus: Annotated[list[Path] | None, typer.Option("--corpus", help="Corpus files to ingest into a new KB.")] = None,
    limit: Annotated[int, typer.Option(help="Evaluate a deterministic sample of this many queries (0 = all).")] = 0,
    ablation: Annotated[bool, typer.Option(help="Also score the fusion variants.")] = False,
    out: Annotated[Path | None, typer.Option(help="Append the markdown table to this file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Recall@10, MRR and nDCG@10 of BM25, dense and hybrid retrieval on a public benchmark."""
    from ebmrag.eval.retrieval import evaluate_retrieval, load_queries, markdown_table

    try:
        settings = load_settings(config)
        knowledge_base = open_kb(settings, kb)
        if not knowledge_base.exists:
            if not corpus:
                raise ValueError(f"{kb} does not exist yet: give the corpus files with --corpus")
            with progress_bar() as bar:
                report = ingest_paths(knowledge_base, corpus, progress=_progress_callback(bar))
            console.print(report_table(report))
        queries = load_queries(dataset, data_dir, corpus or [], limit)
        r = settings.retrieval
        with console.status(f"retrieving for {len(queries)} queries..."):
            result = evaluate_retrieval(knowledge_base, dataset, queries, r.fusion, (r.bm25_weight, r.dense_weight),
                                        ablation)
    except (EbmragError, ValueError, OSError) as exc:
        raise _fail(exc) from None
    table = markdown_table(result)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as handle:
            handle.write(table + "\n")
    typer.echo(json.dumps(result.to_json(), indent=2) if as_json else table)
