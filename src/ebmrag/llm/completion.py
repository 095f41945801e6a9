"""One typed JSON completion for every LLM step: ask, extract the JSON object, validate it with pydantic,
and on a bad reply ask once more with the problem fed back (DSPy-style: a failure becomes an
observation for the model, then a typed fault for the caller, never an exception mid-pipeline).

Used by the staged answerer, the relevance filter and gate annotation, so all three tolerate the
same chatter around the JSON (code fences, a sentence before it) and report faults the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from ebmrag.errors import LLMError
from ebmrag.protocols import ChatClient, ChatMessage, SchemaChatClient

T = TypeVar("T", bound=BaseModel)
Status = Literal["ok", "invalid", "failed"]


@dataclass(frozen=True)
class Completion(Generic[T]):
    """The outcome of one JSON step: `value` when `status` is ok, else `error` says what went wrong.

    invalid: the model answered twice but neither reply had the shape; failed: no reply (transport).
    An ok value on the second attempt keeps the first attempt's problem in `error`, for the trace."""

    value: T | None
    status: Status
    attempts: int
    error: str
    text: str  # the last reply's raw text ('' when none came back)
    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


def parse_json(text: str, schema: type[T]) -> T:
    """The JSON object in a reply (chatter and code fences around it tolerated), validated against `schema`."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("the reply contains no JSON object")
    try:
        return schema.model_validate_json(text[start : end + 1])
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors()[:3])
        raise ValueError(f"the JSON does not match the {schema.__name__} shape: {problems}") from None


def complete_json(client: ChatClient, messages: Sequence[ChatMessage], schema: type[T], *,
                  temperature: float = 0.0, max_tokens: int = 512, check: Callable[[T], None] | None = None,
                  retry_hint: str = "Reply again with only the JSON object.",
                  deadline: float | None = None, json_schema: dict[str, Any] | None = None) -> Completion[T]:
    """Ask for `schema`; `check` adds rules pydantic cannot express (raise ValueError). One retry at most.
    `deadline` (time.monotonic()) is shared by every model call of one answer: past it, no call starts.
    A client that decodes under a JSON schema (`SchemaChatClient`) gets `json_schema`, or `schema`'s own."""
    started, history = time.perf_counter(), list(messages)
    prompt_tokens = completion_tokens = 0
    error, text, cached = "", "", False
    for attempt in (1, 2):
        if deadline is not None and time.monotonic() >= deadline:
            error = f"attempt {attempt}: the answer's time budget for model calls ran out"
            return Completion(None, "failed", attempt - 1, error, text, time.perf_counter() - started,
                              prompt_tokens, completion_tokens, cached)
        try:
            if isinstance(client, SchemaChatClient):
                reply = client.complete_schema(history, json_schema or schema.model_json_schema(), temperature,
                                               max_tokens)
            else:
                reply = client.complete(history, temperature, max_tokens)
        except LLMError as exc:
            error = f"attempt {attempt}: {exc}"
            return Completion(None, "failed", attempt, error, text, time.perf_counter() - started, prompt_tokens,
                              completion_tokens, cached)
        prompt_tokens += reply.prompt_tokens
        completion_tokens += reply.completion_tokens
        text, cached = reply.text, reply.cached
        try:
            value = parse_json(text, schema)
            if check is not None:
                check(value)
        except ValueError as exc:
            error = f"attempt {attempt}: {exc}"
            history += [ChatMessage("assistant", text),
                        ChatMessage("user", f"Your reply could not be used: {exc}. {retry_hint}")]
            continue
        return Completion(value, "ok", attempt, error, text, time.perf_counter() - started, prompt_tokens,
                          completion_tokens, cached)
    return Completion(None, "invalid", 2, error, text, time.perf_counter() - started, prompt_tokens,
                      completion_tokens, cached)
