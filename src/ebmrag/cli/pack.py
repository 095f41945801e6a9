"""`ebmrag pack` and `ebmrag demo`: EBM-Pack on one record, with the reason for every fragment."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from ebmrag.cli.common import ConfigOption, JsonOption, console, stderr, user_errors
from ebmrag.compose import Resources, build_packer, build_tiering
from ebmrag.config import load_settings, with_overrides
from ebmrag.demo import demo_query, demo_record_paths, load_patient
from ebmrag.packing.packer import STRATEGIES
from ebmrag.packing.params import OBJECTIVES
from ebmrag.packing.types import PackResult
from ebmrag.records.fragment import Tier, parse_timestamp
from ebmrag.records.loaders import load_record

TIER_STYLE = {Tier.T1: "bold red", Tier.T2: "yellow", Tier.T3: "cyan", Tier.T4: "dim"}


def trace_table(result: PackResult, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("fragment", "tier", "outcome", "tokens", "utility", "why"):
        table.add_column(column)
    for p in sorted(result.packed, key=lambda p: p.order):
        why = p.reason.value + (
            f"; {'/'.join(s.value for s in p.excluded_states)} excluded" if p.excluded_states else ""
        )
        table.add_row(p.fragment_id, f"[{TIER_STYLE[p.tier]}]{p.tier.value}[/]", f"packed {p.state.value}",
                      str(p.tokens), f"{p.utility:.3f}", why)
    for d in result.dropped:
        table.add_row(d.fragment_id, f"[{TIER_STYLE[d.tier]}]{d.tier.value}[/]", "[red]dropped[/]", "", "",
                      d.reason.value)
    table.caption = f"{result.tokens_used} of {result.window} tokens used; `--json` gives every reason in full"
    return table


def pack(
    record: Annotated[
        str, typer.Argument(help="Patient record: ebmrag JSON, a FHIR R4 Bundle (JSON or XML), FHIR Bulk Data "
                                 "NDJSON (a file or folder), a C-CDA document (.xml), an AgentClinic case, text, "
                                 "or a bundled demo record (demo-colon, demo-chest, demo-zh). See docs/charts.md.")
    ],
    query: Annotated[str, typer.Option("--query", "-q", help="The clinical question.")],
    window: Annotated[int | None, typer.Option(help="Token window for the packed context.")] = None,
    strategy: Annotated[str | None, typer.Option(help=f"One of: {', '.join(STRATEGIES)}.")] = None,
    k_min: Annotated[int | None, typer.Option("--k-min", help="Minimum fragments per tier present.")] = None,
    objective: Annotated[str | None, typer.Option(
        help="ebm-exact's objective: critical (default) or paper.")] = None,
    patient_id: Annotated[
        str | None, typer.Option("--patient-id", help="Pick one patient of a multi-record file.")
    ] = None,
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="ISO date ages are measured to (default: newest fragment).")
    ] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Pack one patient's record into a token window and show why each fragment was kept or dropped."""
    with user_errors():
        if objective not in (None, *OBJECTIVES):
            raise ValueError(f"--objective must be 'critical' or 'paper', got {objective!r}")
        settings = with_overrides(load_settings(config),
                                  packing={"strategy": strategy, "k_min": k_min, "objective": objective})
        resources = Resources(settings)
        tiering, packer = build_tiering(resources), build_packer(resources)
        patient = tiering.run(load_patient(record, patient_id, settings.chart))
        when: datetime | None = parse_timestamp(as_of, "--as-of") if as_of else None
        result = packer.run(patient, query, window if window is not None else settings.packing.window, when)
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False, indent=2))
        return
    for note in result.record_skipped:
        stderr.print(f"[yellow]not packed:[/] {note}", highlight=False, soft_wrap=True)
    console.print(trace_table(result, f"{result.strategy} · {patient.patient_id} · window {result.window}"))
    console.rule("packed context")
    console.print(result.context, highlight=False, markup=False)


def demo(
    window: Annotated[int, typer.Option(help="Token window.")] = 256,
    config: ConfigOption = None,
) -> None:
    """Pack the bundled synthetic patients with EBM-Pack and with FIFO truncation, side by side."""
    with user_errors():
        settings = with_overrides(load_settings(config), packing={"strategy": "ebm-exact"})
        resources = Resources(settings)
        tiering, exact = build_tiering(resources), build_packer(resources)
        fifo = exact.with_params(replace(settings.packing, strategy="fifo"))
        with stderr.status("loading the bundled embedding model..."):
            exact.warm_up()
        for path in demo_record_paths():
            record, query = tiering.run(load_record(path)), demo_query(path)
            console.rule(f"[bold]{record.patient_id}[/]: {query}")
            results = [packer.run(record, query, window) for packer in (exact, fifo)]
            for result in results:
                console.print(trace_table(result, f"{result.strategy} · window {window}"))
                lost = [d.fragment_id for d in result.dropped if d.tier is Tier.T1]
                console.print("[green]all T1 evidence kept[/]" if not lost
                              else f"[red]T1 evidence lost: {', '.join(lost)}[/]")
            console.rule("EBM-Pack context")
            console.print(results[0].context, highlight=False, markup=False)
