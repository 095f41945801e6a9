"""`ebmrag pull` and `ebmrag ehr keygen`: charts from a FHIR server into the service's store, and the key pair
that registers ebmrag with the EHR as a SMART Backend Services client (docs/ehr.md)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ebmrag.cli.common import ConfigOption, JsonOption, console, stderr, user_errors
from ebmrag.cli.serve import DataDirOption, StoreOption, open_store_for
from ebmrag.config import load_settings
from ebmrag.errors import require_extra

if TYPE_CHECKING:
    from ebmrag.ehr.params import EhrConnection, EhrParams
    from ebmrag.ehr.pull import PullReport
    from ebmrag.protocols import Progress as ProgressCallback

ehr_app = typer.Typer(help="ebmrag as a client of an EHR's FHIR server (SMART Backend Services).",
                      no_args_is_help=True)


def _require_ehr(command: str) -> None:
    for module in ("httpx", "jwt", "cryptography"):
        require_extra(module, "ehr", command)


def pull(
    data_dir: DataDirOption,
    patient: Annotated[str, typer.Option("--patient", help="The patient's id on the FHIR server (and in the store).")]
    = "",
    group: Annotated[str, typer.Option("--group", help="A Group id instead: its patients by Bulk Data $export.")]
    = "",
    fhir_base: Annotated[str, typer.Option("--fhir-base", help="The FHIR base URL (picks the \\[ehr] connection "
                                                               "with this base, or describes one with the flags "
                                                               "below).")] = "",
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the chart is stored under (default: the "
                                                         "connection's).")] = "",
    connection: Annotated[str, typer.Option("--connection", help="A named \\[ehr.connections.<name>].")] = "",
    full: Annotated[bool, typer.Option("--full", help="Read everything again instead of only what changed.")]
    = False,
    replace: Annotated[bool, typer.Option("--replace", help="Erase a chart pulled into this patient from another "
                                                            "source (server or FHIR patient) and store this one.")]
    = False,
    client_id: Annotated[str, typer.Option("--client-id", help="Without a configured connection: the client id "
                                                               "the EHR registered (none: an open server).")] = "",
    key_file: Annotated[str, typer.Option("--key-file", help="... its private key (PEM or JWK).")] = "",
    key_id: Annotated[str, typer.Option("--key-id", help="... its kid (default: the key's thumbprint).")] = "",
    alg: Annotated[str, typer.Option("--alg", help="... RS384 or ES384.")] = "ES384",
    scope: Annotated[str, typer.Option("--scope", help="... the scopes to ask for.")] = "system/*.rs",
    allow_http: Annotated[bool, typer.Option("--allow-http", help="... plain http (a local test server only).")]
    = False,
    store_url: StoreOption = "",
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Pull a patient's chart (or a Group's charts) from a FHIR server into the store `ebmrag serve` uses: only
    what changed since the last pull unless --full. A refusal is one line; nothing is half stored."""
    with user_errors():
        _require_ehr("ebmrag pull")
        from ebmrag.ehr.bulk import export_group
        from ebmrag.ehr.params import EhrConnection
        from ebmrag.ehr.pull import pull_patient
        from ebmrag.store import audit

        if bool(patient) == bool(group):
            raise ValueError("give --patient or --group (one of them)")
        if not (connection or fhir_base):
            raise ValueError("give --fhir-base or --connection")
        settings = load_settings(config)
        chosen = pick_connection(settings.ehr, connection, fhir_base, tenant) or EhrConnection(
            "cli", tenant or _missing("--tenant (no [ehr] connection has this base)"), fhir_base, client_id,
            key_file, key_id, alg, scope, allow_http=allow_http)
        store = open_store_for(data_dir, store_url, config)
        run = f"cli-{uuid.uuid4().hex[:12]}"

        def stored(report: PullReport) -> None:  # the store's access log holds every write, whoever wrote it
            audit.append(store, audit.AuditEntry("cli", chosen.tenant, report.patient, "pull", run,
                                                 report.audited))

        with StageDisplay() as progress:
            if patient:
                reports = [pull_patient(store, chosen, patient, params=settings.ehr, full=full,
                                        replace_source=replace, stale_after=settings.chart.stale_after,
                                        progress=progress, on_stored=stored)]
                problems: list[str] = []
                not_stored: list[tuple[str, str]] = []
            else:
                exported = export_group(store, chosen, group, params=settings.ehr,
                                        stale_after=settings.chart.stale_after, progress=progress,
                                        on_stored=stored)
                reports, problems = list(exported.patients), list(exported.problems)
                not_stored = list(exported.not_stored)
    if as_json:
        typer.echo(json.dumps({"tenant": chosen.tenant, "pulls": [r.to_json() for r in reports],
                               "problems": problems,
                               "not_stored": [{"patient": p, "reason": why} for p, why in not_stored]}, indent=2))
        return
    console.print(summary_table(reports, chosen.name, chosen.tenant))
    for problem in problems:
        stderr.print(f"[yellow]not stored:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    for patient_id, why in not_stored:
        stderr.print(f"[yellow]not stored:[/] patient {escape(patient_id)} ({why})", highlight=False, soft_wrap=True)


def pick_connection(params: EhrParams, name: str, fhir_base: str, tenant: str) -> EhrConnection | None:
    """The named connection (its base and tenant must agree with the flags given), else the one connection with
    this base (and tenant); None when no connection is configured for the base (the flags describe one)."""
    if name:
        if name not in params.connections:
            known = ", ".join(sorted(params.connections)) or "none"
            raise ValueError(f"no connection {name!r} in [ehr.connections] (configured: {known})")
        found = params.connection(name)
        if fhir_base and fhir_base.rstrip("/") != found.base:
            raise ValueError(f"--fhir-base differs from connection {name!r}'s fhir_base")
        if tenant and tenant != found.tenant:
            raise ValueError(f"connection {name!r} belongs to tenant {found.tenant!r}, not {tenant!r}")
        return found
    matching = [c for c in map(params.connection, sorted(params.connections))
                if c.base == fhir_base.rstrip("/") and (not tenant or c.tenant == tenant)]
    if len(matching) > 1:
        raise ValueError(f"{len(matching)} connections use this base: name one with --connection "
                         f"({', '.join(c.name for c in matching)})")
    return matching[0] if matching else None


def _missing(what: str) -> NoReturn:
    raise ValueError(f"give {what}")


class StageDisplay:
    """A spinner line per stage on stderr (received resources, export polls, files, patients stored)."""

    def __enter__(self) -> ProgressCallback:
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.completed}"), TimeElapsedColumn(), console=stderr, transient=True)
        self.bar.__enter__()
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = self.bar.add_task(stage, total=total or None)
            self.bar.update(tasks[stage], completed=done, total=total or None)

        return update

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)


def summary_table(reports: list[PullReport], connection: str, tenant: str) -> Table:
    """Counts only, no text of any chart: one column per patient for a pull, one row per patient for an export."""
    table = Table(title=f"pulled from {connection} into tenant {tenant}", title_justify="left")
    rows: list[tuple[str, Callable[[PullReport], str]]] = [
        ("read", lambda r: r.mode + (", since the last pull" if r.incremental else "")),
        ("requests", lambda r: str(r.requests)),
        ("resources fetched / kept", lambda r: f"{r.fetched} / {r.kept}"),
        ("fragments", lambda r: str(len(r.fragment_ids))),
        ("added / changed / removed", lambda r: f"{r.written.added} / {r.written.changed} / {r.written.removed}"),
        ("skipped parts", lambda r: str(len(r.skipped)))]
    if len(reports) == 1:
        table.add_column("patient")
        table.add_column(reports[0].patient, justify="right")
        for name, value in rows:
            table.add_row(name, value(reports[0]))
        return table
    table.add_column("patient")
    for name, _ in rows:
        table.add_column(name, justify="right")
    for report in reports:
        table.add_row(report.patient, *(value(report) for _, value in rows))
    return table


@ehr_app.command("keygen")
def keygen(
    out: Annotated[Path, typer.Option("--out", help="Where the private key goes (PEM, owner-only).")],
    alg: Annotated[str, typer.Option("--alg", help="RS384 or ES384.")] = "ES384",
    kid: Annotated[str, typer.Option("--kid", help="The key's id (default: its RFC 7638 thumbprint).")] = "",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key file.")] = False,
) -> None:
    """Make the client's key pair: the private key to --out (0600, atomically), the public JWKS to register with
    the EHR on stdout (the only output there)."""
    with user_errors():
        _require_ehr("ebmrag ehr keygen")
        from ebmrag.ehr.keys import generate, public_jwk, write_private_key

        if alg not in ("RS384", "ES384"):
            raise ValueError(f"--alg must be RS384 or ES384, got {alg!r}")
        if out.exists() and not force:
            raise ValueError(f"{out} exists; a key the EHR knows would be lost (use --force to replace it)")
        key = generate(alg)
        write_private_key(key, out)
        jwks: dict[str, Any] = {"keys": [public_jwk(key, alg, kid)]}
    stderr.print(f"private key written to {out} (0600); kid {jwks['keys'][0]['kid']}. Register the JWKS below with "
                 f"the EHR, then set private_key_file = \"{out}\" and algorithm = \"{alg}\" in "
                 "[ehr.connections.<name>].", highlight=False, soft_wrap=True)
    typer.echo(json.dumps(jwks, indent=2))
