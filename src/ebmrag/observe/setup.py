"""The OpenTelemetry SDK installed once in a process that exports: the service (`serve_app` / `create_app`) and
the results gateway. Library code never calls this: it reports through the API (observe.tracing, observe.metrics),
which an embedding application may point at providers of its own.

Traces and metrics go over OTLP/HTTP to `[observe] otlp_endpoint` (or OTEL_EXPORTER_OTLP_ENDPOINT): spans in
batches to <endpoint>/v1/traces, metrics every `metrics_seconds` to <endpoint>/v1/metrics. With neither set,
nothing is installed and nothing leaves the process; `/metrics` still answers. The exporter's own variables
(OTEL_EXPORTER_OTLP_HEADERS, ..._TIMEOUT, ..._CERTIFICATE) are read by the exporter.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from opentelemetry import metrics, trace

from ebmrag.errors import require_extra
from ebmrag.observe.params import ObserveParams
from ebmrag.observe.tracing import set_detail

log = logging.getLogger(__name__)
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
_installed: dict[str, Any] = {}  # "tracer", "meter": the providers this process runs
_lock = threading.Lock()


def otlp_endpoint(params: ObserveParams) -> str:
    """The collector's base URL: the setting, else the environment's; empty: no export."""
    return params.otlp_endpoint or os.environ.get(ENDPOINT_VARIABLE, "")


def configure(params: ObserveParams, *, version: str = "", span_exporter: Any = None,
              metric_reader: Any = None) -> bool:
    """Install the SDK's tracer and meter providers once per process when there is somewhere to export to: the
    OTLP endpoint, or (tests) `span_exporter` (an SDK SpanExporter, exported synchronously) and `metric_reader`.
    Returns whether this call installed them; later calls only apply `trace_stages` (the global providers can
    be set once, and a provider the embedding application set first is left alone). Only ebmrag's own spans are
    exported (observe.export.OwnSpans): other libraries' spans follow other rules."""
    set_detail(params.trace_stages)
    endpoint = otlp_endpoint(params)
    if not endpoint and span_exporter is None and metric_reader is None:
        return False
    with _lock:
        if _installed:
            return False
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            log.info("a tracer provider is set already: ebmrag's spans go to it")
            return False
        require_extra("opentelemetry.sdk.trace", "otel", "exporting traces and metrics")
        tracer = _tracer_provider(params, version, endpoint, span_exporter)
        meter = _meter_provider(params, tracer.resource, endpoint, metric_reader)
        trace.set_tracer_provider(tracer)
        metrics.set_meter_provider(meter)
        _installed.update(tracer=tracer, meter=meter)
    log.info("OpenTelemetry export on (%s)", "OTLP" if endpoint else "in process")
    return True


def _tracer_provider(params: ObserveParams, version: str, endpoint: str, exporter: Any) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from ebmrag.observe.export import OwnSpans

    attributes = {"service.name": params.service_name, **({"service.version": version} if version else {})}
    provider = TracerProvider(resource=Resource.create(attributes),
                              sampler=ParentBased(TraceIdRatioBased(params.sample_ratio)))
    if endpoint:
        otlp = require_extra("opentelemetry.exporter.otlp.proto.http.trace_exporter", "otel", "OTLP export")
        url = f"{params.otlp_endpoint.rstrip('/')}/v1/traces" if params.otlp_endpoint else None  # None: env
        provider.add_span_processor(BatchSpanProcessor(OwnSpans(otlp.OTLPSpanExporter(endpoint=url))))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(OwnSpans(exporter)))
    return provider


def _meter_provider(params: ObserveParams, resource: Any, endpoint: str, reader: Any) -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    readers = [reader] if reader is not None else []
    if endpoint:
        otlp = require_extra("opentelemetry.exporter.otlp.proto.http.metric_exporter", "otel", "OTLP export")
        url = f"{params.otlp_endpoint.rstrip('/')}/v1/metrics" if params.otlp_endpoint else None
        readers.append(PeriodicExportingMetricReader(otlp.OTLPMetricExporter(endpoint=url),
                                                     export_interval_millis=params.metrics_seconds * 1000))
    return MeterProvider(metric_readers=readers, resource=resource)


def shutdown() -> None:
    """Flush and stop the exporters (the providers also do this at exit)."""
    with _lock:
        for name in ("tracer", "meter"):
            if name in _installed:
                _installed[name].shutdown()
