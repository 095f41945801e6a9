"""The exporter's side of the PHI rule: only ebmrag's own spans leave the process.

Libraries under the service make spans of their own through the same global provider, and not by ebmrag's rules:
FastAPI's native telemetry puts `url.path` and `url.query` (patient ids) in its request spans, the MCP SDK records
exception messages. The service turns FastAPI's off (serve.telemetry), and whatever else appears is dropped here:
a span is exported only when its instrumentation scope is ebmrag's tracer. Imported only where the SDK is (the
`otel` extra).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ebmrag.observe.tracing import TRACER_NAME


class OwnSpans(SpanExporter):
    """Passes the spans of ebmrag's tracer to `inner`, and no other."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        own = [s for s in spans if s.instrumentation_scope is not None and s.instrumentation_scope.name == TRACER_NAME]
        return self.inner.export(own) if own else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)
