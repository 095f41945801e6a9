from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebmrag.errors import LLMError
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.protocols import ChatMessage
from tests.fake_openai import FakeOpenAI, serve

HELLO = [ChatMessage("system", "You are terse."), ChatMessage("user", "Say ok.")]


def test_reply_usage_headers_and_the_cache(tmp_path: Path) -> None:
    fake = FakeOpenAI(("text", "ok"))
    with serve(fake) as url:
        client = OpenAIChatClient(url, "tiny", api_key="sk-test", cache_dir=tmp_path)
        reply = client.complete(HELLO, temperature=0.0, max_tokens=5)
        assert (reply.text, reply.cached, reply.prompt_tokens) == ("ok", False, 11)
        assert fake.requests[0]["model"] == "tiny" and fake.requests[0]["max_tokens"] == 5
        assert fake.requests[0]["messages"][1] == {"role": "user", "content": "Say ok."}
        assert fake.headers[0]["Authorization"] == "Bearer sk-test"
        again = OpenAIChatClient(url, "tiny", api_key="sk-test", cache_dir=tmp_path).complete(HELLO, 0.0, 5)
        assert again.cached and again.text == "ok" and len(fake.requests) == 1
        client.complete(HELLO, temperature=0.7, max_tokens=5)  # another request, another key
        assert len(fake.requests) == 2
        assert client.usage.to_json() == {"calls": 2, "cache_hits": 0, "prompt_tokens": 22, "completion_tokens": 6,
                                          "retries": 0}


def test_server_errors_are_retried_then_reported(tmp_path: Path) -> None:
    fake = FakeOpenAI(("text", "recovered"))
    fake.script = [("status", 500), ("status", 503)]
    with serve(fake) as url:
        client = OpenAIChatClient(url, "tiny", max_retries=2, backoff=0.01)
        assert client.complete(HELLO).text == "recovered" and client.usage.retries == 2
        fake.script = [("status", 500)] * 3
        with pytest.raises(LLMError, match=r"HTTP 500 .*scripted 500.*gave up after 3 attempts"):
            client.complete([ChatMessage("user", "x")])
        fake.script = [("status", 401)]
        with pytest.raises(LLMError, match="HTTP 401"):
            OpenAIChatClient(url, "tiny", max_retries=5, backoff=0.01).complete([ChatMessage("user", "y")])
        assert len(fake.requests) == 3 + 3 + 1


def test_timeouts_and_malformed_bodies_are_clear_errors() -> None:
    fake = FakeOpenAI(("text", "late"))
    with serve(fake) as url:
        fake.script = [("slow", (1.0, "too late")), ("slow", (1.0, "too late"))]
        with pytest.raises(LLMError, match=r"no reply from .* within 0.2 s"):
            OpenAIChatClient(url, "tiny", timeout=0.2, max_retries=1, backoff=0.01).complete(HELLO)
        fake.script = [("raw", b"<html>gateway</html>")]
        with pytest.raises(LLMError, match="not JSON"):
            OpenAIChatClient(url, "tiny", max_retries=0).complete(HELLO)
        fake.script = [("raw", b'{"choices": []}')]
        with pytest.raises(LLMError, match=r"no choices\[0\].message.content"):
            OpenAIChatClient(url, "tiny", max_retries=0).complete(HELLO)
    with pytest.raises(ValueError, match="base_url"):
        OpenAIChatClient("localhost:8000", "tiny")


def test_tool_calls_are_parsed_cached_and_checked(tmp_path: Path) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("kb_search", '{"query": "x"}'), ("ddx", "{not json")]),
                   ("raw", json.dumps({"choices": [{"message": {"content": None, "tool_calls": [
                       {"id": "1", "function": {"arguments": "{}"}}]}}]}).encode())]
    tools = [{"type": "function", "function": {"name": "kb_search", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi"}]
    with serve(fake) as url:
        client = OpenAIChatClient(url, "m", cache_dir=tmp_path, max_retries=0)
        reply = client.complete_tools(messages, tools)
        again = client.complete_tools(messages, tools)
        with pytest.raises(LLMError, match="no function name"):
            client.complete_tools([{"role": "user", "content": "other"}], tools)
    assert [c.name for c in reply.tool_calls] == ["kb_search", "ddx"]
    assert reply.tool_calls[1].arguments == "{not json"  # raw: the agent reports it to the model
    assert reply.text == "" and not reply.cached
    assert again.cached and again.tool_calls == reply.tool_calls and len(fake.requests) == 2
    assert fake.requests[0]["tools"] == tools and fake.requests[0]["tool_choice"] == "auto"
