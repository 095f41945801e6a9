"""What the engine, the model clients and the results gateway report: one helper per kind of work, each making
its span (observe.tracing) and counting into the process's registry (observe.metrics.REGISTRY).

- `stage`: an engine stage (gate, retrieval, packing, answer, grounding): a detail span and
  `ebmrag_stage_duration_seconds{stage}`;
- `traced`: a detail span around a step's `run` (the packer, a search), with counts read from its result;
- `model_call`: one span per model call in the OpenTelemetry GenAI conventions (`chat <model>`, the provider,
  the models, temperature, max tokens and the token usage; never the prompt or the reply), call, token and
  duration metrics;
- `consumed`: one span per result message the gateway handles (kind, outcome), the gateway's lag.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from opentelemetry.trace import Span, SpanKind

from ebmrag.observe.metrics import REGISTRY, Family
from ebmrag.observe.tracing import AttributeValue, annotate, span

P = ParamSpec("P")
R = TypeVar("R")
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

STAGE_SECONDS = REGISTRY.histogram(Family(
    "ebmrag_stage_duration_seconds", "Time in each stage of an ask (gate, retrieval, packing, answer, grounding).",
    ("stage",), "ebmrag.stage.duration", "s", ("ebmrag.stage",)))
_MODEL = ("gen_ai.provider.name", "gen_ai.request.model")
MODEL_SECONDS = REGISTRY.histogram(Family(
    "ebmrag_model_call_duration_seconds", "Model calls that reached the model, by provider and model.",
    ("operation", "provider", "model"), "gen_ai.client.operation.duration", "s", ("gen_ai.operation.name", *_MODEL)))
MODEL_CALLS = REGISTRY.counter(Family(
    "ebmrag_model_calls_total", "Model calls by outcome: ok, cached (answered from the reply cache), failed.",
    ("provider", "model", "outcome"), "ebmrag.model.calls", "{call}", (*_MODEL, "ebmrag.outcome")))
MODEL_TOKENS = REGISTRY.counter(Family(
    "ebmrag_model_tokens_total", "Tokens models read (input) and wrote (output); cache hits cost none.",
    ("provider", "model", "type"), "ebmrag.model.tokens", "{token}", (*_MODEL, "gen_ai.token.type")))
GATEWAY_MESSAGES = REGISTRY.counter(Family(
    "ebmrag_gateway_messages_total", "Result messages the gateway handled, by kind and outcome (stored, pending, "
    "dead, retry).", ("kind", "outcome"), "ebmrag.gateway.messages", "{message}",
    ("ebmrag.message.kind", "ebmrag.message.outcome")))
GATEWAY_LAG = REGISTRY.histogram(Family(
    "ebmrag_gateway_lag_seconds", "Seconds from a result's arrival on the stream to its application to the store.",
    (), "ebmrag.gateway.lag", "s"), LAG_BUCKETS)


@contextmanager
def stage(name: str) -> Iterator[Span]:
    """One stage of an ask: a detail span named after it, and its duration in the stage histogram."""
    started = time.perf_counter()
    try:
        with span(name, {"ebmrag.stage": name}, detail=True) as current:
            yield current
    finally:
        STAGE_SECONDS.observe(time.perf_counter() - started, stage=name)


def traced(name: str, describe: Callable[[R], Mapping[str, AttributeValue]] | None = None
           ) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A detail span around every call of the decorated step; `describe` reads counts from its result."""
    def decorate(step: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(step)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with span(name, detail=True) as current:
                result = step(*args, **kwargs)
                if describe is not None and current.is_recording():
                    annotate(current, describe(result))
                return result
        return run
    return decorate


@dataclass
class ModelCall:
    """What a model call's span learns at its end (`replied`)."""

    input_tokens: int = 0
    output_tokens: int = 0
    response_model: str = ""
    cached: bool = False

    def replied(self, input_tokens: int, output_tokens: int, response_model: str = "", cached: bool = False) -> None:
        self.input_tokens, self.output_tokens = input_tokens, output_tokens
        self.response_model, self.cached = response_model, cached


@contextmanager
def model_call(provider: str, model: str, *, temperature: float, max_tokens: int, operation: str = "chat",
               server_address: str = "", server_port: int = 0) -> Iterator[ModelCall]:
    """One call to a model: a CLIENT span `chat <model>` and the call's metrics. The body calls `replied` with the
    reply's usage; a reply from the cache is a span with `ebmrag.cache_hit` and no usage."""
    call, outcome, started = ModelCall(), "failed", time.perf_counter()
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": operation, "gen_ai.provider.name": provider, "gen_ai.system": provider,
        "gen_ai.request.model": model, "gen_ai.request.temperature": temperature,
        "gen_ai.request.max_tokens": max_tokens}
    if server_address:
        attributes.update({"server.address": server_address, "server.port": server_port})
    try:
        with span(f"{operation} {model}", attributes, kind=SpanKind.CLIENT) as current:
            yield call
            outcome = "cached" if call.cached else "ok"
            done: dict[str, AttributeValue] = {"gen_ai.response.model": call.response_model or model,
                                               "ebmrag.cache_hit": call.cached}
            if not call.cached:
                done.update({"gen_ai.usage.input_tokens": call.input_tokens,
                             "gen_ai.usage.output_tokens": call.output_tokens})
            annotate(current, done)
    finally:
        MODEL_CALLS.inc(provider=provider, model=model, outcome=outcome)
        if outcome != "cached":
            MODEL_SECONDS.observe(time.perf_counter() - started, operation=operation, provider=provider, model=model)
        if outcome == "ok":
            MODEL_TOKENS.inc(call.input_tokens, provider=provider, model=model, type="input")
            MODEL_TOKENS.inc(call.output_tokens, provider=provider, model=model, type="output")


@dataclass
class Consumed:
    """A gateway message's kind (once parsed) and what became of it."""

    kind: str = "unknown"
    outcome: str = "retry"  # stored | pending | dead | retry (left pending after a store failure)


@contextmanager
def consumed(stream: str, group: str, arrived: float | None) -> Iterator[Consumed]:
    """One stream entry handled: a CONSUMER span `process <stream>` and the message metrics. `arrived`: the
    entry's time on the stream (epoch seconds), for the lag of a message that reached the store."""
    message = Consumed()
    with span(f"process {stream}", {"messaging.system": "redis", "messaging.operation.type": "process",
                                    "messaging.destination.name": stream, "messaging.consumer.group.name": group},
              kind=SpanKind.CONSUMER) as current:
        try:
            yield message
        finally:
            attributes: dict[str, AttributeValue] = {"ebmrag.message.kind": message.kind,
                                                     "ebmrag.message.outcome": message.outcome}
            if arrived is not None and message.outcome in ("stored", "pending"):
                lag = max(0.0, time.time() - arrived)
                attributes["ebmrag.message.lag_seconds"] = round(lag, 3)
                GATEWAY_LAG.observe(lag)
            annotate(current, attributes)
            GATEWAY_MESSAGES.inc(kind=message.kind, outcome=message.outcome)
