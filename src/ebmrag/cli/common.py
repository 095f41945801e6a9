"""What every command shares: the consoles, common options, progress bars and the one-line error rule.

stdout carries a command's result only (with `--json`, only the JSON document); progress bars,
status spinners, reports and errors go to stderr, so `ebmrag ... --json | jq` always works.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ebmrag.config import Settings, load_settings, with_overrides
from ebmrag.errors import EbmragError
from ebmrag.protocols import Progress as ProgressCallback

console = Console()  # results
stderr = Console(stderr=True)  # progress, reports, errors

ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML configuration file.")]
KbOption = Annotated[Path, typer.Option("--kb", help="Knowledge-base directory.")]
LlmOption = Annotated[str | None, typer.Option("--llm", help="'openai' (an OpenAI-compatible endpoint), 'local' "
                                                             "(ask: a GGUF file, --model-path) or 'extractive'.")]
ModelOption = Annotated[str | None, typer.Option("--model", help="Model name at the endpoint.")]
ModelPathOption = Annotated[str | None, typer.Option("--model-path", help="--llm local: the GGUF model file.")]
BaseUrlOption = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible endpoint, e.g. .../v1")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (and nothing else) on stdout.")]

# Errors a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (EbmragError, ValueError, OSError, json.JSONDecodeError)


def fail(exc: BaseException) -> typer.Exit:
    stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a user error into one line on stderr and exit code 2, never a traceback."""
    try:
        yield
    except USER_ERRORS as exc:
        raise fail(exc) from None


@contextmanager
def progress_bar() -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr, transient=True) as bar:
        yield bar


def progress_callback(bar: Progress) -> ProgressCallback:
    """A `protocols.Progress` that draws one bar per stage."""
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    return update


def write_jsonl(out: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Replace `out` atomically with one JSON object per line; returns the rows written."""
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows]
    if out.exists() and not out.is_file():  # a device or a pipe (--out /dev/null): a rename would replace the device
        out.write_text("".join(lines), encoding="utf-8")
        return len(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("".join(lines), encoding="utf-8")
    partial.replace(out)
    return len(lines)


def write_report(report: str, out: Path | None) -> None:
    """Print a markdown report and, with --out, also save it."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report, encoding="utf-8")
    typer.echo(report)


def settings_from(config: Path | None, *, llm: str | None = None, base_url: str | None = None,
                  model: str | None = None, model_path: str | None = None, **tables: dict[str, Any]) -> Settings:
    """The TOML file with the command's flags applied once, as settings (None: the flag was not given)."""
    flags = {"backend": llm, "base_url": base_url, "model": model, "model_path": model_path}
    return with_overrides(load_settings(config), llm=flags, **tables)
