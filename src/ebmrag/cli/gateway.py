"""`ebmrag gateway run` and `ebmrag gateway publish`: the results gateway on Redis Streams."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ebmrag.cli.common import ConfigOption, stderr, user_errors
from ebmrag.cli.serve import DataDirOption, StoreOption, open_store_for

gateway_app = typer.Typer(help="Results from specialist models and laboratories, via Redis Streams.",
                          no_args_is_help=True)
BrokerOption = Annotated[str, typer.Option("--broker", help="redis://HOST:PORT/DB")]
StreamOption = Annotated[str, typer.Option("--stream", help="The stream results arrive on.")]


@gateway_app.command("run")
def run(data_dir: DataDirOption, broker: BrokerOption, stream: StreamOption = "ebmrag:results",
        group: Annotated[str, typer.Option(help="Consumer group.")] = "ebmrag",
        claim_idle_ms: Annotated[int, typer.Option(help="Reclaim entries another consumer left this long.")]
        = 30_000, max_deliveries: Annotated[int, typer.Option(
            min=1, help="Dead-letter an entry delivered this many times without being stored.")] = 5,
        store_url: StoreOption = "", config: ConfigOption = None) -> None:
    """Consume results into the patient store until SIGTERM (each acknowledged only once stored)."""
    with user_errors():
        from ebmrag.gateway.consumer import ResultConsumer

        consumer = ResultConsumer(open_store_for(data_dir, store_url, config), broker, stream, group,
                                  claim_idle_ms=claim_idle_ms, max_deliveries=max_deliveries)
        stderr.print(f"gateway: {broker} stream {stream} group {group} as {consumer.consumer}")
        stats = consumer.run()
    stderr.print(f"gateway stopped: {stats.stored} stored, {stats.dead} dead-lettered ({stats.capped} at the delivery "
                 f"cap), {stats.claimed} reclaimed, {stats.failures} store failures ({stats.outages} outages)")


@gateway_app.command("publish")
def publish_file(broker: BrokerOption, file: Annotated[Path, typer.Option("--file", help="A JSON message, a JSON "
                                                                           "list of them, or an HL7 v2 file.")],
                 tenant: Annotated[str, typer.Option(help="Tenant of an HL7 file's results.")] = "",
                 stream: StreamOption = "ebmrag:results") -> None:
    """Validate and publish result messages; prints one entry id per message."""
    with user_errors():
        from ebmrag.gateway.publish import publish, read_messages

        entries = publish(broker, read_messages(file, tenant), stream)
    for entry in entries:
        typer.echo(entry)
