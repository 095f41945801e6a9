"""The OpenTelemetry SDK installed once for the session, as the service installs it (observe.setup.configure), with
an in-memory span exporter and metric reader in place of OTLP: the global providers can be set only once in a
process, so every test of this folder shares them and clears the spans it reads. `everything` is a second exporter
on the same provider without ebmrag's scope filter: what any library made."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ebmrag.observe.params import ObserveParams
from ebmrag.observe.setup import configure

REDIS_URL = os.environ.get("EBMRAG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")  # the machine's, as tests/gateway


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    everything: InMemorySpanExporter

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metric_points(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Instrument name -> (attributes, point) of what the meter provider collected now."""
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.metrics.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend((dict(p.attributes or {}), p)
                                                              for p in metric.data.data_points)
        return found


@pytest.fixture(scope="package")
def installed() -> Iterator[Telemetry]:
    """Installed with the first test of this folder; after its last, the exporters stop keeping what later tests'
    spans would pile up (the provider itself stays: it cannot be unset)."""
    found = Telemetry(InMemorySpanExporter(), InMemoryMetricReader(), InMemorySpanExporter())
    assert configure(ObserveParams(), span_exporter=found.spans, metric_reader=found.metrics), \
        "the SDK was installed before these tests: they need their own exporter"
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(found.everything))
    yield found
    found.spans.shutdown()
    found.everything.shutdown()


@pytest.fixture
def telemetry(installed: Telemetry) -> Iterator[Telemetry]:
    installed.spans.clear()
    installed.everything.clear()
    configure(ObserveParams())  # trace_stages on, whatever an earlier test set
    yield installed


def dumped(spans: list[ReadableSpan]) -> str:
    """Everything an exporter sends of these spans: name, context, parent, kind, attributes, events, links,
    status and resource, as JSON."""
    return "\n".join(s.to_json() for s in spans) + json.dumps([dict(s.resource.attributes) for s in spans])
