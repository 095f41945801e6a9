"""Command line: `ebmrag pack`, `ebmrag demo`, `ebmrag eval tiers`. Errors print one line, never a traceback."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ebmrag.config import load_settings
from ebmrag.demo import demo_query, demo_record_paths
from ebmrag.errors import EbmragError
from ebmrag.evidence.fragment import Tier
from ebmrag.evidence.loaders import load_record, parse_timestamp
from ebmrag.factory import build_packer
from ebmrag.packing.packer import STRATEGIES
from ebmrag.packing.types import PackResult

app = typer.Typer(help="Evidence-graded retrieval and context packing for medical LLMs.", no_args_is_help=True)
eval_app = typer.Typer(help="Measure ebmrag on public data.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
console = Console()
log = logging.getLogger("ebmrag")

ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML configuration file.")]


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress.")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def _fail(exc: Exception) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(code=2)


def trace_table(result: PackResult, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("fragment", "tier", "outcome", "tokens", "utility", "why"):
        table.add_column(column)
    style = {Tier.T1: "bold red", Tier.T2: "yellow", Tier.T3: "cyan", Tier.T4: "dim"}
    for p in sorted(result.packed, key=lambda p: p.order):
        why = p.reason.value + (
            f"; {'/'.join(s.value for s in p.excluded_states)} excluded" if p.excluded_states else ""
        )
        table.add_row(
            p.fragment_id,
            f"[{style[p.tier]}]{p.tier.value}[/]",
            f"packed {p.state.value}",
            str(p.tokens),
            f"{p.utility:.3f}",
            why,
        )
    for d in result.dropped:
        table.add_row(d.fragment_id, f"[{style[d.tier]}]{d.tier.value}[/]", "[red]dropped[/]", "", "", d.reason.value)
    table.caption = f"{result.tokens_used} of {result.window} tokens used; `--json` gives every reason in full"
    return table


@app.command()
def pack(
    record: Annotated[
        Path, typer.Argument(help="Patient record: ebmrag JSON, FHIR R4 Bundle, AgentClinic case, or text.")
    ],
    query: Annotated[str, typer.Option("--query", "-q", help="The clinical question.")],
    window: Annotated[int | None, typer.Option(help="Token window for the packed context.")] = None,
    strategy: Annotated[str | None, typer.Option(help=f"One of: {', '.join(STRATEGIES)}.")] = None,
    k_min: Annotated[int | None, typer.Option("--k-min", help="Minimum fragments per tier present.")] = None,
    patient_id: Annotated[
        str | None, typer.Option("--patient-id", help="Pick one patient of a multi-record file.")
    ] = None,
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="ISO date ages are measured to (default: newest fragment).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the trace as JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Pack one patient's record into a token window and show why each fragment was kept or dropped."""
    try:
        settings = load_settings(config)
        packer = build_packer(settings, strategy, k_min)
        patient = load_record(record, patient_id)
        when: datetime | None = parse_timestamp(as_of, "--as-of") if as_of else None
        result = packer.run(patient, query, window or settings.packing.window, when)
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False, indent=2))
        return
    console.print(trace_table(result, f"{result.strategy} · {patient.patient_id} · window {result.window}"))
    console.rule("packed context")
    console.print(result.context, highlight=False, markup=False)


@app.command()
def demo(
    window: Annotated[int, typer.Option(help="Token window.")] = 256,
    config: ConfigOption = None,
) -> None:
    """Pack the bundled synthetic patients with EBM-Pack and with FIFO truncation, side by side."""
    try:
        settings = load_settings(config)
        exact, fifo = build_packer(settings, "ebm-exact"), build_packer(settings, "fifo")
        with console.status("loading the bundled embedding model..."):
            exact.warm_up()
        for path in demo_record_paths():
            record, query = load_record(path), demo_query(path)
            console.rule(f"[bold]{record.patient_id}[/]: {query}")
            candidates = exact.candidates(record, query)
            for packer in (exact, fifo):
                result = packer.packer.pack(candidates, window)
                console.print(trace_table(result, f"{result.strategy} · window {window}"))
                lost = [d.fragment_id for d in result.dropped if d.tier is Tier.T1]
                verdict = (
                    "[green]all T1 evidence kept[/]" if not lost else f"[red]T1 evidence lost: {', '.join(lost)}[/]"
                )
                console.print(verdict)
            console.rule("EBM-Pack context")
            console.print(exact.packer.pack(candidates, window).context, highlight=False, markup=False)
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None


@eval_app.command("tiers")
def eval_tiers(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Folder with agentclinic_*.jsonl files.")],
    out: Annotated[Path | None, typer.Option(help="Write the markdown report here.")] = None,
) -> None:
    """Agreement of the tier classifier with the typed fields of AgentClinic cases."""
    from ebmrag.eval.tier_agreement import agreement_report, measure_agreement

    try:
        report = agreement_report(measure_agreement(data_dir))
    except (EbmragError, ValueError) as exc:
        raise _fail(exc) from None
    write_report(report, out)


def write_report(report: str, out: Path | None) -> None:
    """Print a markdown report and, with --out, also save it."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report, encoding="utf-8")
    typer.echo(report)


from ebmrag import cli_ask as _cli_ask  # noqa: E402,F401  (registers `ebmrag ask`)
from ebmrag import cli_eval as _cli_eval  # noqa: E402,F401  (registers the packing evaluation commands)
from ebmrag import cli_gate as _cli_gate  # noqa: E402,F401  (registers `ebmrag gate`)
from ebmrag import cli_kb as _cli_kb  # noqa: E402,F401  (registers the knowledge-base commands)
