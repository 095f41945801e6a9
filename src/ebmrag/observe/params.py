"""`[observe]`: where traces and metrics go (docs/observability.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A service name is a resource attribute of every span a collector receives: plain words, never free text.
_SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class ObserveParams:
    """OpenTelemetry export. Nothing is exported unless an OTLP endpoint is set here or in the environment;
    `/metrics` (Prometheus text) is served either way."""

    otlp_endpoint: str = ""  # an OTLP/HTTP collector (http://collector:4318); empty: OTEL_EXPORTER_OTLP_ENDPOINT
    service_name: str = "ebmrag"  # the resource's service.name
    sample_ratio: float = 1.0  # share of new traces kept (a caller's sampled traceparent is always followed)
    trace_stages: bool = True  # spans for the engine's stages, the packer, retrieval and embedding batches
    metrics_seconds: float = 60.0  # how often metrics are pushed over OTLP

    def __post_init__(self) -> None:
        if self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"otlp_endpoint must start with http:// or https://, got {self.otlp_endpoint!r}")
        if not _SERVICE_NAME.fullmatch(self.service_name):
            raise ValueError(f"service_name must be 1 to 63 letters, digits, '.', '_' or '-', got "
                             f"{self.service_name!r}")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be 0 to 1, got {self.sample_ratio}")
        if self.metrics_seconds < 1:
            raise ValueError(f"metrics_seconds must be >= 1, got {self.metrics_seconds}")
