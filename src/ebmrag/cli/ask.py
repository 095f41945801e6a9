"""`ebmrag ask`: the main job, a cited answer about one patient with its full trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ebmrag.answer.result import AskResult
from ebmrag.cli.common import (
    BaseUrlOption,
    ConfigOption,
    JsonOption,
    LlmOption,
    ModelOption,
    ModelPathOption,
    console,
    settings_from,
    stderr,
    user_errors,
)
from ebmrag.compose import build_engine, load_patient


def ask(
    question: Annotated[str, typer.Argument(help="The clinical question (English or Chinese).")],
    patient: Annotated[str, typer.Option("--patient", help="Record file (FHIR JSON/XML/NDJSON, C-CDA, ebmrag JSON, "
                                                           "text), or a bundled demo record: demo-colon.")],
    kb: Annotated[Path | None, typer.Option("--kb", help="Knowledge base; default: the bundled demo KB.")] = None,
    llm: LlmOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    window: Annotated[int | None, typer.Option(help="Whole prompt budget in tokens (default [answer] window).")] = None,
    retrieval: Annotated[str | None, typer.Option(help="auto (the gate decides), always or never.")] = None,
    patient_id: Annotated[str | None, typer.Option("--patient-id", help="One patient of a multi-record file.")] = None,
    model_path: ModelPathOption = None,
    expand: Annotated[int | None, typer.Option(help="Query expansion: the model rewords the question N times and "
                                                    "the rewordings vote too (default [retrieval] "
                                                    "query_variants).")] = None,
    hyde: Annotated[bool | None, typer.Option(help="HyDE: a model-written answer passage votes too (default "
                                                   "[retrieval] hyde).")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Answer a question about one patient from the record and the knowledge base, citing every claim."""
    with user_errors():
        settings = settings_from(config, llm=llm, base_url=base_url, model=model, model_path=model_path,
                                 retrieval={"query_variants": expand, "hyde": hyde},
                                 answer={"window": window, "retrieval": retrieval})
        record = load_patient(patient, patient_id, settings.chart)
        engine = build_engine(settings, kb)
        with stderr.status("loading the bundled embedding model..."):
            engine.warm_up()
        waiting = "retrieving, packing and asking the model (stages run in order)..." if engine.client \
            else "retrieving and packing..."
        with stderr.status(waiting):
            result = engine.ask(question, record)
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False, indent=1))
        return
    show(result)


def show(result: AskResult) -> None:
    d = result.decision
    colour = {"answer": "green", "retrieve": "yellow", "retrieve_warn": "red"}[d.action.value]
    console.rule(f"[bold]{escape(result.patient_id)}[/] · completeness {d.completeness:.2f} · "
                 f"[{colour}]{d.action.value}[/] · {result.backend}")
    if result.fault:
        console.print(f"[red]degraded:[/] {escape(result.fault)}", highlight=False)
    console.print(result.answer, highlight=False, markup=False)
    for s in result.unsupported:
        console.print(f"[red]unsupported:[/] {escape(s.sentence)} ({escape(s.reason or 'no similar context')})")
    console.print(trace_table(result))


def trace_table(result: AskResult) -> Table:
    trace = result.trace_json()
    table = Table(title="trace (--json for all of it)", title_justify="left", show_header=False)
    retrieved = ", ".join(f"{d['doc_id']} ({d['votes']})" for d in trace["retrieved"]) or "-"
    dropped = ", ".join(f"[{d['n']}] {d['id']}: {d['reason']}" for d in trace["dropped"]) or "none"
    rows = [("retrieval", f"{trace['retrieval']['reason']}"), ("documents (votes)", retrieved),
            ("budget", f"window {result.budget.window}: {result.budget.fixed} fixed, {result.budget.context} "
                       f"for context, {trace['tokens_used']} used"),
            ("packed", f"{len(trace['packed'])} items"), ("dropped", dropped),
            ("time", ", ".join(f"{k} {v:.0f} ms" for k, v in trace["timings_ms"].items()))]
    for name, value in rows:
        table.add_row(name, escape(value))
    return table
