"""Spans through the OpenTelemetry API, with the one rule that matters here: no patient data in any of them.

Every span of ebmrag is made by `span()`, which lets through only the attributes named in `ATTRIBUTES` (route
templates, status codes, stage and model names, counts: never a path, a patient id, a name, a question, a prompt
or a chart's text) and records a failure as its exception's type and a fixed description, never `str(exc)`: an
exception's message can quote the chart (the SDK's own `record_exception` would put it in an event). The caller
names the span from constants; the name is never built from request data.

Without the SDK (`pip install 'ebmrag[otel]'`) or an exporter configured, the API's tracer does nothing, so the
code below the service runs unchanged in a library or a CLI. `detail` spans (stages, the packer, retrieval,
embedding batches) are made only inside an existing trace and while [observe] trace_stages is on: a chart
prepared in the background does not start a trace of its own per embedding batch.

Context does not follow work onto an executor's thread by itself (contextvars are per thread): `bind` carries
the caller's span over, so the engine's spans on a scheduler thread are children of the request's span.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)
T = TypeVar("T")
AttributeValue = str | bool | int | float
TRACER_NAME = "ebmrag"
MAX_TEXT = 200  # characters of a string attribute: names and templates are short; anything longer is cut
FAILED, STOPPED = "failed", "stopped"  # the only status descriptions a span carries

# The attribute keys a span may carry. Each holds a value from code or settings, or a count: nothing a
# request, a chart or a model's reply wrote. A key not listed here is dropped (and logged by name).
ATTRIBUTES = frozenset({
    # HTTP server (semantic conventions): the route template, never url.path or url.query
    "http.request.method", "http.route", "http.response.status_code", "url.scheme", "error.type",
    # GenAI client calls (semantic conventions): names and token counts, never prompt or completion content
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
    "gen_ai.response.model", "gen_ai.request.max_tokens", "gen_ai.request.temperature",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "server.address", "server.port",
    # the results gateway (messaging conventions): the stream and group from settings, the kind from a closed list
    "messaging.system", "messaging.operation.type", "messaging.operation.name", "messaging.destination.name",
    "messaging.consumer.group.name",
    # ebmrag's own: stage names, modes, strategies and counts
    "ebmrag.stage", "ebmrag.cache_hit", "ebmrag.pack.strategy", "ebmrag.pack.window", "ebmrag.pack.packed",
    "ebmrag.pack.dropped", "ebmrag.search.queries", "ebmrag.search.hits", "ebmrag.embed.texts",
    "ebmrag.message.kind", "ebmrag.message.outcome", "ebmrag.message.lag_seconds",
})
_W3C = TraceContextTextMapPropagator()
_detail = {"on": True}  # [observe] trace_stages, set by `observe.setup.configure`


def set_detail(on: bool) -> None:
    """[observe] trace_stages: whether `detail` spans are made at all."""
    _detail["on"] = on


def allowed(attributes: Mapping[str, AttributeValue] | None) -> dict[str, AttributeValue]:
    """The attributes a span may carry: listed keys with plain values, strings cut to MAX_TEXT."""
    kept: dict[str, AttributeValue] = {}
    for key, value in (attributes or {}).items():
        if key not in ATTRIBUTES or not isinstance(value, str | bool | int | float):
            log.debug("span attribute %s left out: not on the allow-list", key if key in ATTRIBUTES else "(unlisted)")
            continue
        kept[key] = value[:MAX_TEXT] if isinstance(value, str) else value
    return kept


def annotate(current: Span, attributes: Mapping[str, AttributeValue]) -> None:
    """Attributes known only at the end of the work (a status code, token counts), through the allow-list."""
    if current.is_recording():
        current.set_attributes(allowed(attributes))


@contextmanager
def span(name: str, attributes: Mapping[str, AttributeValue] | None = None, *, kind: SpanKind = SpanKind.INTERNAL,
         parent: Context | None = None, detail: bool = False) -> Iterator[Span]:
    """A span current for the body. `name`: a constant (or built from constants and settings). `parent`: a remote
    caller's context (`remote_parent`); default the current one. `detail`: a stage-level span, made only inside a
    trace and while trace_stages is on (else the body runs under a non-recording span)."""
    if detail and not (_detail["on"] and trace.get_current_span().get_span_context().is_valid):
        yield INVALID_SPAN
        return
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=allowed(attributes),
                                      record_exception=False, set_status_on_exception=False) as current:
        try:
            yield current
        except GeneratorExit:
            raise
        except Exception as exc:
            failed(current, exc)
            raise
        except BaseException as exc:  # WorkCancelled, asyncio.CancelledError: the request went away or timed out
            failed(current, exc, STOPPED)
            raise


def failed(current: Span, exc: BaseException, description: str = FAILED) -> None:
    """Mark a span failed by the exception's type only: its message may quote a chart."""
    if current.is_recording():
        current.set_attribute("error.type", type(exc).__qualname__[:MAX_TEXT])
        current.set_status(Status(StatusCode.ERROR, description))


def remote_parent(traceparent: str | None) -> Context | None:
    """A caller's W3C `traceparent` as the parent context; None when absent or malformed. Only traceparent is
    read: `tracestate` and `baggage` are free text a caller writes, and would travel with every span."""
    if not traceparent:
        return None
    extracted = _W3C.extract({"traceparent": traceparent})
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None


def bind(work: Callable[[], T]) -> Callable[[], T]:
    """`work`, run later on another thread under the trace context current now (the request's span)."""
    captured = otel_context.get_current()

    def bound() -> T:
        token = otel_context.attach(captured)
        try:
            return work()
        finally:
            otel_context.detach(token)

    return bound
