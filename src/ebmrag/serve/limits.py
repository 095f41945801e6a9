"""Per-key rate limits and the Prometheus counters of the service (no dependency: the text format is small)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict


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
    """Request counts by route and status, and latency sums, in Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[tuple[str, int], int] = defaultdict(int)
        self._seconds: dict[str, float] = defaultdict(float)

    def observe(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._count[(route, status)] += 1
            self._seconds[route] += seconds

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP ebmrag_requests_total Requests by route and status.",
                     "# TYPE ebmrag_requests_total counter"]
            lines += [f'ebmrag_requests_total{{route="{r}",status="{s}"}} {n}'
                      for (r, s), n in sorted(self._count.items())]
            lines += ["# HELP ebmrag_request_seconds_total Time spent answering, by route.",
                      "# TYPE ebmrag_request_seconds_total counter"]
            lines += [f'ebmrag_request_seconds_total{{route="{r}"}} {s:.6f}' for r, s in sorted(self._seconds.items())]
        return "\n".join(lines) + "\n"
