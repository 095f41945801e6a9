"""Per-key rate limits and the request metrics of the service (observe.metrics writes the Prometheus text)."""

from __future__ import annotations

import threading
import time

from ebmrag.observe.metrics import Family, Registry


class RateLimiter:
    """A token bucket per key: `rate` requests per second on average, bursts of `burst`."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0 when the request may go; else the seconds until it may."""
        with self._lock:
            moment = time.monotonic()
            tokens, last = self._buckets.get(key, (float(self.burst), moment))
            tokens = min(float(self.burst), tokens + (moment - last) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, moment)
                return 0.0
            self._buckets[key] = (tokens, moment)
            return (1 - tokens) / self.rate


class Metrics:
    """This service's request metrics in Prometheus text format (observe.metrics): counts by route template and
    status, time spent per route (a sum, and a latency histogram), and the gauges the service adds (queue depths).
    One registry per service, so two apps in one process (tests) count apart; the OpenTelemetry instruments
    behind them (`http.server.request.duration`) are the process's."""

    def __init__(self) -> None:
        self.registry = Registry()
        self._count = self.registry.counter(REQUESTS)
        self._seconds = self.registry.counter(REQUEST_SECONDS)
        self._latency = self.registry.histogram(REQUEST_DURATION)

    def observe(self, route: str, status: int, seconds: float) -> None:
        """`route`: the template ("/v1/patients/{pid}/ask") or "unmatched", never the path."""
        self._count.inc(route=route, status=status)
        self._seconds.inc(seconds, route=route)
        self._latency.observe(seconds, route=route)

    def render(self) -> str:
        return self.registry.render()


REQUESTS = Family("ebmrag_requests_total", "Requests by route and status.", ("route", "status"))
REQUEST_SECONDS = Family("ebmrag_request_seconds_total", "Time spent answering, by route.", ("route",))
REQUEST_DURATION = Family("ebmrag_request_duration_seconds", "Request latency by route template.", ("route",),
                          "http.server.request.duration", "s", ("http.route",))
