"""The research loop against a scripted tool-calling server on 127.0.0.1, with the real tools underneath."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from ebmrag.research.agent import ResearchAgent
from tests.fake_openai import FakeOpenAI, serve

pytestmark = pytest.mark.model
Build = Callable[..., ResearchAgent]


def answer_citing(handle: str) -> Callable[[dict[str, Any]], str]:
    """A final answer that cites `handle` only if the last observation really showed it (like a careful model)."""
    def reply(request: dict[str, Any]) -> str:
        seen = "\n".join(str(m.get("content") or "") for m in request["messages"] if m["role"] in ("tool", "user"))
        return f"Aspirin is contraindicated by the allergy [{handle}]." if f"[{handle}]" in seen else "no source"
    return reply


def test_tool_calls_observations_and_a_cited_answer(make_agent: Build) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("kb_search", '{"query": "aspirin allergy antiplatelet", "k": 3}')]),
                   answer_citing("S1")]
    with serve(fake) as url:
        result = make_agent(url).run("Can this patient take aspirin?")
    assert result.status == "answered" and result.cited == ["S1"]
    assert result.sources["S1"].kind == "chunk"
    first = result.steps[0]
    assert first.tool == "kb_search" and "[S1]" in first.observation and first.latency_ms > 0
    assert first.prompt_tokens == 11  # the fake's usage, recorded per step
    tool_message = next(m for m in fake.requests[1]["messages"] if m["role"] == "tool")
    assert tool_message["tool_call_id"] == "call_0" and "[S1]" in tool_message["content"]
    assert fake.requests[0]["tools"][0]["function"]["name"] == "kb_search"


def test_malformed_unknown_and_invalid_calls_become_observations(make_agent: Build) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("kb_search", '{"query": "aspirin'), ("prescribe", "{}"),
                              ("ddx", '{"findings": [], "sex": "X"}')]), ("text", "I could not find evidence.")]
    with serve(fake) as url:
        result = make_agent(url).run("Can this patient take aspirin?")
    errors = [s.observation for s in result.steps if s.error]
    assert result.status == "answered" and len(errors) == 3
    assert "not valid JSON" in errors[0]
    assert "no tool 'prescribe'" in errors[1] and "kb_search" in errors[1]
    assert "findings" in errors[2] and "sex" in errors[2]


def test_identical_calls_are_stopped(make_agent: Build) -> None:
    fake = FakeOpenAI(default=("calls", [("icd10_lookup", '{"query": "J93"}')]))
    with serve(fake) as url:
        result = make_agent(url, max_steps=10, max_repeats=2).run("What is J93?")
    assert result.status == "loop"
    assert len(fake.requests) == 3  # the first call, then two repeats
    assert "already called" in result.steps[-1].observation


def test_step_limit_forces_a_final_answer_without_tools(make_agent: Build) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("icd10_lookup", '{"query": "J93"}')]),
                   ("calls", [("icd10_lookup", '{"query": "I21"}')]),
                   ("text", "Final Answer: J93 is pneumothorax [S1], I21 is infarction [S2], and [S7].")]
    with serve(fake) as url:
        result = make_agent(url, max_steps=2).run("What are J93 and I21?")
    assert result.status == "step_limit"
    assert "tools" not in fake.requests[-1]
    assert result.cited == ["S1", "S2"] and "[S7]" not in result.answer
    assert any("unseen" in p for p in result.problems)


def test_an_answer_citing_an_unseen_source_is_rejected_then_corrected(make_agent: Build) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("icd10_lookup", '{"query": "J93"}')]), ("text", "It is pneumothorax [S4]."),
                   ("text", "It is pneumothorax [S1].")]
    with serve(fake) as url:
        result = make_agent(url).run("What is J93?")
    assert result.status == "answered" and result.answer == "It is pneumothorax [S1]."
    rejection = fake.requests[2]["messages"][-1]
    assert rejection["role"] == "user" and "S4" in rejection["content"] and "no observation showed" in \
        rejection["content"]


def test_text_protocol_and_fallback_when_tools_are_refused(make_agent: Build) -> None:
    fake = FakeOpenAI()
    fake.script = [("reject", "this model does not support tools"),
                   ("text", 'Thought: look the code up\nAction: icd10_lookup\nAction Input: {"query": "J93"}'),
                   ("text", "Thought: found it\nFinal Answer: Pneumothorax [S1].")]
    with serve(fake) as url:
        result = make_agent(url, protocol="auto").run("What is J93?")
    assert result.status == "answered" and result.protocol == "text" and result.cited == ["S1"]
    assert "tools" not in fake.requests[1] and "Action Input" in fake.requests[1]["messages"][0]["content"]
    assert fake.requests[2]["messages"][-1]["content"].startswith("Observation: ICD-10 (who) code J93")
    assert result.steps[0].thought == "look the code up"


def test_patient_record_tool_returns_packed_fragments_of_that_patient_only(make_agent: Build) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("patient_record", '{"question": "allergies and current medicines", "budget": 200}')]),
                   ("text", "Noted [S1].")]
    with serve(fake) as url:
        result = make_agent(url).run("What is this patient allergic to?")
    fragments = [i for i in result.sources.values() if i.kind == "fragment"]
    assert fragments and result.status == "answered"
    assert any("anaphylaxis" in f.text for f in fragments)  # the contrast reaction: must-keep in any budget


@pytest.mark.slow
def test_observations_are_packed_into_a_small_window_with_reasons(make_agent: Build,
                                                                    context_packer: Any) -> None:
    queries = ["aspirin allergy", "contrast reaction", "colon cancer staging", "anticoagulation chest pain",
               "renal function metformin", "penicillin alternatives"]
    fake = FakeOpenAI()
    fake.script = [("calls", [("kb_search", json.dumps({"query": q, "k": 8}))]) for q in queries] + \
        [("text", "Summary [S1].")]
    with serve(fake) as url:
        result = make_agent(url, window=2600, reserve=256, max_steps=10).run("Review the evidence.")
    assert result.status == "answered"
    states = {e.state for e in result.context_events}
    assert states & {"compressed", "dropped"}, result.context_events
    assert all(e.reason for e in result.context_events)
    last_request = fake.requests[-1]["messages"]
    newest = [m for m in last_request if m["role"] == "tool"][-1]["content"]
    assert newest.startswith("8 passages")  # the newest observation always stays in full
    sent = sum(context_packer.token_counter.count(str(m.get("content") or "")) for m in last_request)
    assert sent <= 2600


def test_a_dead_endpoint_ends_the_run_with_its_reason(make_agent: Build) -> None:
    fake = FakeOpenAI(default=("status", 503))
    with serve(fake) as url:
        result = make_agent(url).run("What is J93?")
    assert result.status == "model_error" and result.answer == ""
    assert "503" in result.problems[0]
