"""An OpenAI-compatible chat client with retries, a reply cache on disk and token accounting.

Standard library only (urllib): a hospital deployment points `base_url` at its own gateway, and an
evaluation rerun must cost nothing, so every reply is cached under sha256 of the exact request
(model, messages, temperature, max_tokens). Transient failures (timeouts, connection errors, 429,
5xx) are retried with exponential backoff; anything else fails at once with the server's message.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebmrag.errors import LLMError
from ebmrag.kvcache import KeyValueCache
from ebmrag.observe.instruments import model_call
from ebmrag.protocols import ChatMessage, LLMReply, ToolCall, ToolReply

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
PROVIDER = "openai"  # gen_ai.provider.name: the API spoken, whichever server answers it


@dataclass
class Usage:
    """Token spend of this client: cache hits cost nothing and are counted apart."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def add(self, reply: LLMReply) -> None:
        with self._lock:
            if reply.cached:
                self.cache_hits += 1
                return
            self.calls += 1
            self.prompt_tokens += reply.prompt_tokens
            self.completion_tokens += reply.completion_tokens

    def to_json(self) -> dict[str, int]:
        return {"calls": self.calls, "cache_hits": self.cache_hits, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "retries": self.retries}


class RequestRejectedError(LLMError):
    """The endpoint answered and refused the request (4xx other than 408/409/429): not a dead endpoint."""


class ReplyCache:
    """sha256(request) -> reply, in one SQLite file; safe to share between runs and processes. A damaged file or
    reply is a miss (kvcache.py: caches are disposable), and the request goes to the model again."""

    def __init__(self, path: Path) -> None:
        self._store = KeyValueCache(path, "replies", column="reply")

    def get(self, key: str) -> dict[str, Any] | None:
        found = self._store.get(key)
        return _reply(found) if found is not None else None

    def put(self, key: str, reply: dict[str, Any]) -> None:
        self._store.put_many({key: json.dumps(reply).encode()})

    def forget_quoting(self, texts: Sequence[str], least: int = 16) -> int:
        """Erase every cached reply that quotes one of `texts` (a patient's erasure: the cache is keyed by the
        request's hash, so replies are found by content); texts shorter than `least` characters are too
        common to attribute. A reply that fails its checksum or does not decode cannot be attributed, so it goes
        too. Returns the replies removed; raises `kvcache.CacheErasureError` when the cache cannot be erased."""
        needles = [t for t in texts if len(t) >= least]
        if not needles:
            return 0
        gone = [key for key, blob in self._store.scan() if _quotes(blob, needles)]
        return self._store.forget(gone)


def _reply(blob: bytes) -> dict[str, Any] | None:
    """A stored reply, or None (a miss) for one that is not the JSON object this client writes."""
    try:
        reply = json.loads(blob)
    except ValueError:
        return None
    whole = isinstance(reply, dict) and isinstance(reply.get("text"), str) and all(
        isinstance(reply.get(count), int) for count in ("prompt_tokens", "completion_tokens"))
    return reply if whole else None


def _quotes(blob: bytes | None, needles: Sequence[str]) -> bool:
    reply = _reply(blob) if blob is not None else None
    return reply is None or any(n in reply["text"] for n in needles)


class OpenAIChatClient:
    """POST {base_url}/chat/completions; the API key comes from the argument or OPENAI_API_KEY."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 2, backoff: float = 0.5, cache_dir: str | Path | None = None,
                 breaker_seconds: float = 60.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model.strip():
            raise ValueError("model is empty: name the model the endpoint serves")
        if timeout <= 0 or max_retries < 0 or backoff < 0 or breaker_seconds < 0:
            raise ValueError("timeout must be > 0, max_retries, backoff and breaker_seconds >= 0")
        self.base_url, self.model = base_url.rstrip("/"), model
        address = urllib.parse.urlsplit(self.base_url)
        self._server = (address.hostname or "", address.port or (443 if address.scheme == "https" else 80))
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.cache = ReplyCache(self.cache_dir / "llm_replies.sqlite") if self.cache_dir else None
        self.usage = Usage()
        # Circuit breaker: once the endpoint failed past its retries, later calls (the next stages of the
        # same answer) fail at once for `breaker_seconds` instead of waiting out the timeouts again.
        self.breaker_seconds = breaker_seconds
        self._open_until, self._last_failure = 0.0, ""
        self._breaker_lock = threading.Lock()

    def payload(self, messages: Sequence[ChatMessage], temperature: float, max_tokens: int) -> dict[str, Any]:
        """The request body; the cache key is its hash, so an identical request never reaches the model twice."""
        return {"model": self.model, "messages": [m.to_json() for m in messages], "temperature": temperature,
                "max_tokens": max_tokens}

    def complete(self, messages: Sequence[ChatMessage], temperature: float = 0.0, max_tokens: int = 512) -> LLMReply:
        if not messages:
            raise ValueError("no messages to send")
        found = self._cached_or_posted(self.payload(messages, temperature, max_tokens), tools=False)
        reply = LLMReply(found["text"], found["prompt_tokens"], found["completion_tokens"], found["cached"], self.model)
        self.usage.add(reply)
        return reply

    def complete_tools(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                       temperature: float = 0.0, max_tokens: int = 512) -> ToolReply:
        """One turn with OpenAI tool calling ("tools", "tool_choice": "auto"); cached like `complete`."""
        if not messages:
            raise ValueError("no messages to send")
        body = {"model": self.model, "messages": list(messages), "tools": list(tools), "tool_choice": "auto",
                "temperature": temperature, "max_tokens": max_tokens}
        found = self._cached_or_posted(body, tools=True)
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in found.get("tool_calls", []))
        self.usage.add(LLMReply(found["text"], found["prompt_tokens"], found["completion_tokens"], found["cached"],
                                self.model))
        return ToolReply(found["text"], calls, found["prompt_tokens"], found["completion_tokens"], found["cached"],
                         self.model)

    def _cached_or_posted(self, body: dict[str, Any], tools: bool) -> dict[str, Any]:
        """The reply, from the cache or the endpoint, reported as one model call (observe.instruments: a span with
        the GenAI attributes and token counts, never the messages)."""
        with model_call(PROVIDER, self.model, temperature=body["temperature"], max_tokens=body["max_tokens"],
                        server_address=self._server[0], server_port=self._server[1]) as call:
            found = self._cached_or_fetched(body, tools)
            call.replied(found["prompt_tokens"], found["completion_tokens"], found.get("model", ""), found["cached"])
        return found

    def _cached_or_fetched(self, body: dict[str, Any], tools: bool) -> dict[str, Any]:
        key = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        cached = self.cache.get(key) if self.cache else None
        if cached is not None:
            return {**cached, "cached": True}
        found = _parse_reply(self._post(body), allow_tool_calls=tools)
        if self.cache:
            self.cache.put(key, found)
        return {**found, "cached": False}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._breaker_lock:
            remaining = self._open_until - time.monotonic()
            if remaining > 0:
                raise LLMError(f"{self.base_url} is not asked again for {remaining:.0f} s: it failed just before "
                               f"({self._last_failure})")
        try:
            return self._post_with_retries(body)
        except RequestRejectedError:
            raise  # the server is alive and refused this request: later requests may well succeed
        except LLMError as exc:
            with self._breaker_lock:
                self._open_until, self._last_failure = time.monotonic() + self.breaker_seconds, str(exc)
            raise

    def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/chat/completions"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.add_retry()
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                request = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return _json_body(response.read(), url)
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:300]
                last = f"HTTP {exc.code} from {url}: {detail}"
                if exc.code not in RETRY_STATUS:
                    raise RequestRejectedError(last) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"no reply from {url} within {self.timeout:g} s: {reason}"
            log.warning("LLM request failed (attempt %d of %d): %s", attempt + 1, self.max_retries + 1, last)
        raise LLMError(f"{last} (gave up after {self.max_retries + 1} attempts)")

    def to_dict(self) -> dict[str, Any]:
        """Everything but the key, which stays in the environment or the settings file."""
        return {"base_url": self.base_url, "model": self.model, "timeout": self.timeout,
                "max_retries": self.max_retries, "backoff": self.backoff, "breaker_seconds": self.breaker_seconds,
                "cache_dir": str(self.cache_dir) if self.cache_dir else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], api_key: str | None = None) -> OpenAIChatClient:
        return cls(**data, api_key=api_key)


def _json_body(raw: bytes, url: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise LLMError(f"{url} answered with a body that is not JSON: {raw[:200]!r}") from None
    if not isinstance(data, dict):
        raise LLMError(f"{url} answered with JSON that is not an object")
    return data


def _parse_reply(data: dict[str, Any], allow_tool_calls: bool = False) -> dict[str, Any]:
    """{"text", "prompt_tokens", "completion_tokens"} (+ "tool_calls": [{"id", "name", "arguments"}])."""
    try:
        message = data["choices"][0]["message"]
        text = message.get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise LLMError(f"the reply has no choices[0].message.content: {json.dumps(data)[:200]}") from None
    calls = _tool_calls(message) if allow_tool_calls else []
    if text is None and calls:
        text = ""
    if not isinstance(text, str):
        raise LLMError("choices[0].message.content is not a string")
    usage = data.get("usage") or {}
    found: dict[str, Any] = {"text": text, "prompt_tokens": int(usage.get("prompt_tokens", 0)),
                             "completion_tokens": int(usage.get("completion_tokens", 0))}
    if isinstance(data.get("model"), str):  # the model that answered (a gateway may route to another)
        found["model"] = data["model"][:200]
    if allow_tool_calls:
        found["tool_calls"] = calls
    return found


def _tool_calls(message: dict[str, Any]) -> list[dict[str, str]]:
    """The message's function calls; arguments stay raw text (a malformed one is the agent's to report)."""
    calls = []
    for n, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise LLMError(f"tool_calls[{n}] has no function name")
        arguments = function.get("arguments", "")
        calls.append({"id": str(call.get("id") or f"call_{n}"), "name": function["name"],
                      "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
    return calls
