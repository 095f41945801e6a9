"""The Prometheus exposition written by observe.metrics, the OpenTelemetry instruments mirrored behind it, and the
[observe] settings."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis

from ebmrag.config import settings_from_dict, settings_to_dict
from ebmrag.errors import ConfigError
from ebmrag.gateway.publish import publish
from ebmrag.observe.metrics import Family, Registry, serve_metrics
from ebmrag.observe.params import ObserveParams
from ebmrag.serve.limits import Metrics
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from ebmrag.store.results import ResultMessage
from tests.observe.conftest import REDIS_URL, Telemetry
from tests.serve.conftest import free_port

# One sample line of the text format: a name, optional labels with quoted (escaped) values, a number.
SAMPLE = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? '
                    r'(-?[0-9.e+-]+|\+Inf|NaN)')


def valid_exposition(text: str) -> bool:
    """Every line a HELP, a TYPE or a sample; the text ends with a newline."""
    return text.endswith("\n") and all(line.startswith(("# HELP ", "# TYPE ")) or SAMPLE.fullmatch(line)
                                       for line in text.splitlines())


def test_counters_histograms_and_gauges_in_the_text_format() -> None:
    registry = Registry()
    requests = registry.counter(Family("x_requests_total", "Requests.", ("route", "status")))
    latency = registry.histogram(Family("x_seconds", "Latency.", ("route",)), buckets=(0.1, 1.0))
    registry.gauge(Family("x_depth", "Depth.", ("queue",)), lambda: {("engine",): 3})
    requests.inc(route="/v1/patients/{pid}", status=200)
    requests.inc(route="/v1/patients/{pid}", status=200)
    for seconds in (0.05, 0.5, 0.1, 7.0):
        latency.observe(seconds, route='a"b\\c')
    text = registry.render()
    assert valid_exposition(text), text
    assert text.splitlines() == [
        "# HELP x_requests_total Requests.", "# TYPE x_requests_total counter",
        'x_requests_total{route="/v1/patients/{pid}",status="200"} 2',
        "# HELP x_seconds Latency.", "# TYPE x_seconds histogram",
        'x_seconds_bucket{route="a\\"b\\\\c",le="0.1"} 2',  # le: less than or equal, cumulative
        'x_seconds_bucket{route="a\\"b\\\\c",le="1"} 3',
        'x_seconds_bucket{route="a\\"b\\\\c",le="+Inf"} 4',
        'x_seconds_sum{route="a\\"b\\\\c"} 7.65',
        'x_seconds_count{route="a\\"b\\\\c"} 4',
        "# HELP x_depth Depth.", "# TYPE x_depth gauge", 'x_depth{queue="engine"} 3']


def test_labels_must_be_the_familys_and_names_unique() -> None:
    registry = Registry()
    counter = registry.counter(Family("y_total", "Y.", ("route",)))
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc(route="/a", patient="p1")
    with pytest.raises(ValueError, match="registered already"):
        registry.counter(Family("y_total", "Y again."))
    with pytest.raises(ValueError, match="increasing"):
        registry.histogram(Family("z_seconds", "Z."), buckets=(1.0, 0.5))


def test_the_service_metrics_keep_their_names_and_add_a_latency_histogram() -> None:
    metrics = Metrics()
    metrics.observe("/v1/patients/{pid}/fragments", 401, 0.0)
    metrics.observe("/v1/patients/{pid}/ask", 200, 0.3)
    text = metrics.render()
    assert valid_exposition(text)
    assert 'ebmrag_requests_total{route="/v1/patients/{pid}/fragments",status="401"} 1' in text
    assert 'ebmrag_request_seconds_total{route="/v1/patients/{pid}/ask"} 0.3' in text
    assert 'ebmrag_request_duration_seconds_bucket{route="/v1/patients/{pid}/ask",le="0.25"} 0' in text
    assert 'ebmrag_request_duration_seconds_bucket{route="/v1/patients/{pid}/ask",le="0.5"} 1' in text


def test_a_process_without_a_service_serves_its_metrics() -> None:
    """`ebmrag gateway run --metrics-port`: the gateway's registry on 127.0.0.1 at /metrics."""
    registry = Registry()
    registry.counter(Family("g_total", "G.")).inc(2)
    server = serve_metrics(registry.render, 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        answer = httpx.get(f"{url}/metrics")
        assert answer.text == "# HELP g_total G.\n# TYPE g_total counter\ng_total 2\n"
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert httpx.get(f"{url}/other").status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_the_gateway_serves_its_message_counts_and_lag(tmp_path: Path) -> None:
    """`ebmrag gateway run --metrics-port`: a result consumed from a real Redis shows in the gateway's /metrics."""
    stream = f"test:{uuid.uuid4().hex[:10]}"
    create_key(SQLiteStore(tmp_path / "store.sqlite"), "t", "service")
    publish(REDIS_URL, [ResultMessage.model_validate({
        "tenant": "t", "patient_id": "p1", "result_id": "r1", "kind": "pathology", "producer": "slide-model",
        "produced_at": datetime(2026, 3, 14, 8, tzinfo=UTC), "text": "Adenocarcinoma."})], stream)
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "ebmrag.cli", "gateway", "run", "--data-dir", str(tmp_path),
                                "--broker", REDIS_URL, "--stream", stream, "--metrics-port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text, deadline = "", time.monotonic() + 30
    try:
        while "outcome=\"stored\"} 1" not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=15)
        redis.Redis.from_url(REDIS_URL).delete(stream, f"{stream}:dead")
    assert 'ebmrag_gateway_messages_total{kind="pathology",outcome="stored"} 1' in text
    assert 'ebmrag_gateway_lag_seconds_count 1' in text and valid_exposition(text)


def test_metrics_are_mirrored_to_opentelemetry_instruments(telemetry: Telemetry) -> None:
    """What /metrics shows is what a meter provider collects (and exports over OTLP): the request histogram under
    the HTTP semantic conventions' name, with the route template as http.route."""
    Metrics().observe("/v1/patients/{pid}/pack", 200, 0.2)
    points = telemetry.metric_points()["http.server.request.duration"]
    pack = [p for attributes, p in points if attributes == {"http.route": "/v1/patients/{pid}/pack"}]
    assert pack and pack[0].count >= 1 and 0.1 in pack[0].explicit_bounds and 0.25 in pack[0].explicit_bounds


def test_gauges_are_observed_by_the_meter_provider(telemetry: Telemetry) -> None:
    registry = Registry()
    registry.gauge(Family("q_depth", "Depth.", ("queue",), "ebmrag.test.depth", "{item}", ("ebmrag.queue",)),
                   lambda: {("prepare",): 5})
    points = telemetry.metric_points()["ebmrag.test.depth"]
    assert [(attributes, p.value) for attributes, p in points] == [({"ebmrag.queue": "prepare"}, 5)]


def test_observe_settings_are_checked_and_round_trip() -> None:
    settings = settings_from_dict({"observe": {"otlp_endpoint": "http://collector:4318", "sample_ratio": 0.25,
                                               "trace_stages": False}})
    assert settings.observe == ObserveParams("http://collector:4318", sample_ratio=0.25, trace_stages=False)
    assert settings_from_dict(settings_to_dict(settings)) == settings
    for bad in ({"otlp_endpoint": "collector:4318"}, {"sample_ratio": 1.5}, {"service_name": "a b"},
                {"metrics_seconds": 0.5}, {"endpoint": "x"}):
        with pytest.raises(ConfigError):
            settings_from_dict({"observe": bad})
