"""`ebmrag gateway run` and `ebmrag gateway publish`: the results gateway on Redis Streams."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ebmrag import __version__
from ebmrag.cli.common import ConfigOption, stderr, user_errors
from ebmrag.cli.serve import DataDirOption, StoreOption, kb_label, open_store_for, serve_settings

if TYPE_CHECKING:
    from ebmrag.config import Settings
    from ebmrag.serve.prepare import ChartPreparer
    from ebmrag.store.patients import PatientStore

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
        store_url: StoreOption = "", config: ConfigOption = None,
        prepare: Annotated[bool, typer.Option(help="Prepare each chart a result is stored into (vectors, tiers, "
                                                   "compressed states) in the background, into the cache the "
                                                   "service reads: needs the embedding model.")] = False,
        kb: Annotated[Path | None, typer.Option("--kb", help="--prepare: the service's knowledge base, whose "
                                                              "embedding model prepares charts (default: [serve] "
                                                              "kb; without either, the bundled demo one).")] = None,
        metrics_port: Annotated[int, typer.Option(min=0, max=65535, help="Serve Prometheus /metrics (messages, "
                                                                         "lag) on 127.0.0.1 at this port; 0: none.")]
        = 0) -> None:
    """Consume results into the patient store until SIGTERM (each acknowledged only once stored). Traces and
    metrics go over OTLP as [observe] says (docs/observability.md)."""
    with user_errors():
        from ebmrag.compose import check_kb
        from ebmrag.gateway.consumer import ResultConsumer
        from ebmrag.observe.metrics import REGISTRY, serve_metrics
        from ebmrag.observe.setup import configure

        settings = serve_settings(config, kb)
        if prepare and settings.serve.kb:  # the model loads with the first chart: a bad --kb fails now
            check_kb(settings, Path(settings.serve.kb))
        configure(settings.observe, version=__version__)
        metrics = serve_metrics(REGISTRY.render, metrics_port) if metrics_port else None
        store = open_store_for(data_dir, store_url, config)
        preparer = _preparer(store, settings) if prepare else None
        consumer = ResultConsumer(store, broker, stream, group, claim_idle_ms=claim_idle_ms,
                                  max_deliveries=max_deliveries, on_stored=preparer.enqueue if preparer else None)
        stderr.print(f"gateway: {broker} stream {stream} group {group} as {consumer.consumer}"
                     + (f" (preparing charts; knowledge base: {kb_label(settings)})" if preparer else ""),
                     highlight=False, soft_wrap=True)
        stats = consumer.run()
        if preparer is not None:
            preparer.wait_idle(timeout=30)  # what was stored before SIGTERM, within reason
        if metrics is not None:
            metrics.shutdown()
    stderr.print(f"gateway stopped: {stats.stored} stored, {stats.dead} dead-lettered ({stats.capped} at the delivery "
                 f"cap), {stats.claimed} reclaimed, {stats.failures} store failures ({stats.outages} outages)")


def _preparer(store: PatientStore, settings: Settings) -> ChartPreparer:
    """A chart preparer over this store and the [models] / [answer] settings (the same cache directory, so the
    service's asks find the work done) and the service's knowledge base ([serve] kb: its embedding model is the one
    the service shares), on threads of its own: the gateway has no scheduler to share. The model loads with the
    first chart to prepare; the service's extras (FastAPI) are not needed."""
    import threading

    from ebmrag.answer.engine import Engine
    from ebmrag.compose import Resources, build_engine_from, open_resources
    from ebmrag.serve.prepare import ChartPreparer

    built: list[tuple[Resources, Engine]] = []
    building = threading.Lock()

    def parts() -> tuple[Resources, Engine]:
        with building:
            if not built:
                resources = open_resources(settings, settings.serve.kb or None,
                                           retrieval=settings.answer.retrieval != "never")
                built.append((resources, build_engine_from(resources)))
            return built[0]

    return ChartPreparer(store, lambda: parts()[0], lambda: parts()[1], queue_limit=settings.serve.prepare_queue,
                         max_fragments=settings.serve.max_chart_fragments)


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
