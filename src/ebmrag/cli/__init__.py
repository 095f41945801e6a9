"""The `ebmrag` command line: one module per command group, `common` for what they share.

    pack, demo                    cli.pack     EBM-Pack on one record
    ask                           cli.ask      the main job: a cited answer with its trace
    ingest, delete, search, kb    cli.kb       the knowledge base
    eval ...                      cli.eval     measurements on public data
    gate ...                      cli.gate     the retrieval gate's classifier
    serve, mcp, keys, audit       cli.serve    the multi-tenant service (HTTP and MCP)
    pull, ehr keygen              cli.ehr      charts from an EHR's FHIR server into the service's store
    gateway run | publish         cli.gateway  results from a message queue into the store
    ddx, ddx eval | build-kb      cli.ddx      Bayesian differential diagnosis
    research, research export | score  cli.research  the research agent and its trajectories
    synth questions               cli.synth    KISA multi-hop questions from a knowledge base

Commands are registered here, so no command module imports another's (or this one).
"""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

from ebmrag import __version__
from ebmrag.cli import ask, ehr, kb, pack, serve
from ebmrag.cli.ddx import ddx_app
from ebmrag.cli.eval import eval_app
from ebmrag.cli.gate import gate_app
from ebmrag.cli.gateway import gateway_app
from ebmrag.cli.research import research_app
from ebmrag.cli.synth import synth_app

# What the model libraries (sentence-transformers, transformers, huggingface_hub) read from the environment when a
# command first loads a torch model: never a hub, no progress bars, no load-time chatter. The library code passes
# `local_files_only` itself and writes no environment; these are the command line process's settings, so they are
# set here, before any model loads (a `serve` command's workers inherit them), and a variable the user set wins.
MODEL_LIBRARY_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                             "TRANSFORMERS_VERBOSITY": "error"}

app = typer.Typer(help="Evidence-graded retrieval and context packing for medical LLMs.", no_args_is_help=True)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ebmrag {__version__}")
        raise typer.Exit()


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress.")] = False,
         version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    for name, value in MODEL_LIBRARY_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


app.command()(pack.pack)
app.command()(pack.demo)
app.command()(ask.ask)
app.command()(kb.ingest)
app.command()(kb.delete)
app.command()(kb.search)
app.add_typer(kb.kb_app, name="kb")
app.add_typer(eval_app, name="eval")
app.add_typer(gate_app, name="gate")
app.command()(serve.serve)
app.command()(serve.mcp)
app.add_typer(serve.keys_app, name="keys")
app.add_typer(serve.audit_app, name="audit")
app.command()(ehr.pull)
app.add_typer(ehr.ehr_app, name="ehr")
app.add_typer(gateway_app, name="gateway")
app.add_typer(ddx_app, name="ddx")
app.add_typer(research_app, name="research")
app.add_typer(synth_app, name="synth")
