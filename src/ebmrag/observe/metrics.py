"""Counters, histograms and gauges, rendered in the Prometheus text format for `/metrics` and mirrored to
OpenTelemetry instruments, which export over OTLP once `observe.setup.configure` installed a meter provider.

The Prometheus exposition is written here (it is a few lines of text) rather than with prometheus_client: a
`Registry` per service keeps its request counts apart from another app's in the same process (tests), and the
process-wide `REGISTRY` holds what the engine, the model clients and the gateway count. Without the SDK the
OpenTelemetry API's instruments do nothing.

Label values come from code and settings only (route templates, status codes, stage, model and queue names,
outcomes): a label value is never a patient id, a key id or text, or Prometheus would keep it as a series.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from opentelemetry import metrics as otel_metrics

METER_NAME = "ebmrag"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
Labels = tuple[str, ...]
M = TypeVar("M", "Counter", "Histogram", "Gauge")


@dataclass(frozen=True)
class Family:
    """What a metric is: its Prometheus name and help, its label names, and the OpenTelemetry instrument it is
    mirrored to (`otel`: none when empty; `attributes`: the attribute key of each label, default its name)."""

    name: str
    help: str
    labels: Labels = ()
    otel: str = ""
    unit: str = ""
    attributes: Labels = ()

    def key(self, labels: Mapping[str, object]) -> Labels:
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {tuple(labels)}")
        return tuple(str(labels[name]) for name in self.labels)

    def otel_attributes(self, values: Labels) -> dict[str, str]:
        return dict(zip(self.attributes or self.labels, values, strict=True))


class Counter:
    def __init__(self, family: Family) -> None:
        self.family, self._lock = family, threading.Lock()
        self._values: dict[Labels, float] = {}
        self._otel = _instrument(family, "counter") if family.otel else None

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        key = self.family.key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount
        if self._otel is not None:
            self._otel.add(amount, self.family.otel_attributes(key))

    def render(self) -> list[str]:
        with self._lock:
            values = sorted(self._values.items())
        return _header(self.family, "counter") + [f"{self.family.name}{_labels(self.family.labels, k)} {_number(v)}"
                                                  for k, v in values]


class Histogram:
    def __init__(self, family: Family, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"{family.name}: buckets must be increasing, got {buckets}")
        self.family, self.buckets, self._lock = family, buckets, threading.Lock()
        self._series: dict[Labels, tuple[list[int], float]] = {}  # per-bucket counts (not cumulative), sum
        self._otel = _instrument(family, "histogram", buckets) if family.otel else None

    def observe(self, value: float, **labels: object) -> None:
        key = self.family.key(labels)
        with self._lock:
            counts, total = self._series.get(key) or ([0] * (len(self.buckets) + 1), 0.0)
            counts[bisect.bisect_left(self.buckets, value)] += 1
            self._series[key] = (counts, total + value)
        if self._otel is not None:
            self._otel.record(value, self.family.otel_attributes(key))

    def render(self) -> list[str]:
        name, labels = self.family.name, self.family.labels
        with self._lock:
            series = sorted((k, list(counts), total) for k, (counts, total) in self._series.items())
        lines = _header(self.family, "histogram")
        for key, counts, total in series:
            running = 0
            for bound, count in zip([*map(_number, self.buckets), "+Inf"], counts, strict=True):
                running += count
                lines.append(f"{name}_bucket{_labels((*labels, 'le'), (*key, bound))} {running}")
            lines.append(f"{name}_sum{_labels(labels, key)} {_number(total)}")
            lines.append(f"{name}_count{_labels(labels, key)} {running}")
        return lines


class Gauge:
    """A value read when rendered (a queue's depth): `read` returns label values -> value."""

    def __init__(self, family: Family, read: Callable[[], Mapping[Labels, float]]) -> None:
        self.family, self.read = family, read
        if family.otel:
            _observe_gauge(self)

    def render(self) -> list[str]:
        return _header(self.family, "gauge") + [f"{self.family.name}{_labels(self.family.labels, k)} {_number(v)}"
                                                for k, v in sorted(self.read().items())]


class Registry:
    """Metrics rendered together, in the order they were made."""

    def __init__(self) -> None:
        self._metrics: list[Counter | Histogram | Gauge] = []
        self._lock = threading.Lock()

    def counter(self, family: Family) -> Counter:
        return self._add(Counter(family))

    def histogram(self, family: Family, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(family, buckets))

    def gauge(self, family: Family, read: Callable[[], Mapping[Labels, float]]) -> Gauge:
        return self._add(Gauge(family, read))

    def _add(self, metric: M) -> M:
        with self._lock:
            if any(m.family.name == metric.family.name for m in self._metrics):
                raise ValueError(f"metric {metric.family.name} is registered already")
            self._metrics.append(metric)
        return metric

    def render(self) -> str:
        with self._lock:
            metrics = list(self._metrics)
        return "".join(line + "\n" for metric in metrics for line in metric.render())


REGISTRY = Registry()  # the process's own: engine stages, model calls, the gateway (observe.instruments)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve_metrics(render: Callable[[], str], port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """`GET /metrics` answered with `render()` from a daemon thread, for a process without an HTTP service of its
    own (the results gateway); stop it with `shutdown()`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path.split("?")[0] == "/metrics"
            body = render().encode() if found else b"not found\n"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="ebmrag-metrics", daemon=True).start()
    return server


def _header(family: Family, kind: str) -> list[str]:
    return [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {kind}"]


def _labels(names: Iterable[str], values: Iterable[str]) -> str:
    pairs = [f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True)]
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# --- the OpenTelemetry side: one instrument per name for the whole process --------------------------------------

_instruments: dict[str, Any] = {}
_gauges: dict[str, weakref.WeakSet[Gauge]] = {}
_otel_lock = threading.Lock()


def _instrument(family: Family, kind: str, buckets: tuple[float, ...] = ()) -> Any:
    """The API's instrument of this name (a proxy until a meter provider is installed, then the real one)."""
    with _otel_lock:
        if family.otel not in _instruments:
            meter = otel_metrics.get_meter(METER_NAME)
            _instruments[family.otel] = (
                meter.create_counter(family.otel, family.unit, family.help) if kind == "counter" else
                meter.create_histogram(family.otel, family.unit, family.help,
                                       explicit_bucket_boundaries_advisory=list(buckets)))
        return _instruments[family.otel]


def _observe_gauge(gauge: Gauge) -> None:
    """Gauges of one name (one per service in the process) behind one observable instrument."""
    name = gauge.family.otel
    with _otel_lock:
        if name not in _gauges:
            _gauges[name] = weakref.WeakSet()

            def observe(_: otel_metrics.CallbackOptions) -> Iterable[otel_metrics.Observation]:
                return [otel_metrics.Observation(value, live.family.otel_attributes(key))
                        for live in list(_gauges[name]) for key, value in live.read().items()]

            otel_metrics.get_meter(METER_NAME).create_observable_gauge(name, [observe], gauge.family.unit,
                                                                       gauge.family.help)
        _gauges[name].add(gauge)
