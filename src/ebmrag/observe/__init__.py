"""Observability: OpenTelemetry spans and metrics, and the Prometheus text of `/metrics` (docs/observability.md).

`tracing` (spans through an attribute allow-list: no patient data in any span), `metrics` (counters, histograms,
gauges; the Prometheus exposition and the OpenTelemetry instruments behind it), `instruments` (what the engine,
the model clients and the gateway report), `setup` (the SDK and the OTLP exporters, installed once by a process
that exports), `params` ([observe]). Only the OpenTelemetry API is imported here; the SDK is the `otel` extra.
"""
