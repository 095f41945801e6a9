"""`ebmrag ddx`: the Bayesian differential diagnosis from findings; `ddx eval` on a DDXPlus patients file;
`ddx build-kb` converts DDXPlus release files into a condition knowledge base."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ebmrag.cli.common import ConfigOption, JsonOption, console, progress_bar, progress_callback, stderr, user_errors
from ebmrag.config import load_settings

ddx_app = typer.Typer(help="Bayesian differential diagnosis over a condition knowledge base (DDXPlus by default).",
                      invoke_without_command=True)


@ddx_app.callback()
def ddx(
    ctx: typer.Context,
    finding: Annotated[list[str] | None, typer.Option("--finding", help="A finding in words or an evidence code; "
                                                      "repeat for several. 'no fever' counts as absent.")] = None,
    age: Annotated[int | None, typer.Option(help="Age in years (context).")] = None,
    sex: Annotated[str | None, typer.Option(help="F or M (context).")] = None,
    closed_world: Annotated[bool, typer.Option("--closed-world", help="Count every finding not given as absent "
                                               "(the findings are the complete history).")] = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Rank the knowledge base's conditions by posterior given the findings."""
    if ctx.invoked_subcommand is not None:
        return
    if not finding:
        stderr.print(ctx.get_help())
        raise typer.Exit(code=2)
    from ebmrag.compose import Resources, build_diagnoser, build_finding_mapper
    from ebmrag.ddx.engine import complete_findings

    with user_errors():
        settings = load_settings(config)
        diagnoser = build_diagnoser(settings)
        mapped = build_finding_mapper(Resources(settings), diagnoser).run(finding)
        findings = complete_findings(diagnoser.kb, {m.code: m.present for m in mapped}, closed_world)
        result = diagnoser.run(findings, age, (sex or "").upper() or None)
    document = {**result.to_json(), "mapped": [{"code": m.code, "present": m.present, "text": m.clause,
                                                "score": round(m.score, 3)} for m in mapped]}
    if as_json:
        typer.echo(json.dumps(document, ensure_ascii=False, indent=2))
        return
    _print_mapped(document["mapped"])
    table = Table("diagnosis", "ICD-10", "posterior", "differential", "findings that moved it most")
    for d in result.listed:
        drivers = "; ".join(f"{'+' if x.present else '−'} {x.question}" for x in d.drivers)
        table.add_row(d.name, d.icd10, f"{d.posterior:.3g}", f"{d.differential:.2f}", drivers)
    console.print(table)


def _print_mapped(mapped: list[dict[str, object]]) -> None:
    if not mapped:
        stderr.print("[yellow]no finding was recognised; the ranking is the prior[/]")
    for m in mapped:
        stderr.print(f"  {'present' if m['present'] else 'absent '}  {m['code']:<24} ← {m['text']}",
                     highlight=False, markup=False)


@ddx_app.command("eval")
def evaluate_patients(
    patients: Annotated[Path, typer.Option(help="A DDXPlus patients CSV (the shared layout).")],
    free_text: Annotated[bool, typer.Option("--free-text", help="Render each patient's evidence as first-person "
                                            "sentences and map them back (the free-text path).")] = False,
    limit: Annotated[int, typer.Option(help="At most this many patients (0 = all).")] = 0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Top-1/3/5 against PATHOLOGY and differential F1 against DIFFERENTIAL_DIAGNOSIS."""
    from ebmrag.compose import Resources, build_diagnoser, build_finding_mapper
    from ebmrag.ddx.engine import complete_findings
    from ebmrag.eval.ddx_eval import evaluate, read_patients, structured_findings
    from ebmrag.eval.ddx_render import render

    with user_errors():
        settings = load_settings(config)
        diagnoser = build_diagnoser(settings)
        rows = read_patients(patients, diagnoser.kb)[: limit or None]
        if free_text:
            mapper = build_finding_mapper(Resources(settings), diagnoser)

            def findings(p):  # type: ignore[no-untyped-def]
                mapped = mapper.run([render(diagnoser.kb, p)])
                return complete_findings(diagnoser.kb, {m.code: m.present for m in mapped}, closed_world=True)
        else:
            def findings(p):  # type: ignore[no-untyped-def]
                return structured_findings(diagnoser.kb, p)
        with progress_bar() as bar:
            scores = evaluate(diagnoser, rows, findings, progress_callback(bar))
    if as_json:
        typer.echo(json.dumps(scores.to_json()))
        return
    console.print(scores.to_json())


@ddx_app.command("build-kb")
def build_kb(
    ddxplus: Annotated[Path, typer.Option(help="Folder of DDXPlus release files.")],
    out: Annotated[Path, typer.Option(help="Where to write the condition knowledge base (JSON).")],
) -> None:
    """Convert DDXPlus release files into an `ebmrag-ddx-kb/1` file (what ships in ebmrag/ddx/data)."""
    from ebmrag.ddx.knowledge import from_ddxplus

    with user_errors():
        kb = from_ddxplus(ddxplus)
        kb.save(out)
    console.print(f"{len(kb.conditions)} conditions, {len(kb.evidences)} evidences -> {out}")
