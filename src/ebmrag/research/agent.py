"""The research agent (after MedResearcher-R1): thought -> tool call -> observation, until a final
answer or the step limit.

Two protocols: OpenAI tool calling ("tools"), and a plain Thought / Action / Action Input / Final Answer text
protocol ("text") for endpoints without it; "auto" starts with tools and falls back to text when the endpoint
refuses the `tools` field. Everything that can go wrong inside a step becomes an observation the model can act
on (DSPy's failures-as-observations): malformed JSON arguments, arguments outside the schema, an unknown
tool, a tool that fails, a repeated identical call (stopped after `max_repeats` in a row), a reply in neither
format, and a final answer that cites a source no observation showed (rejected and asked again). Each
citable item an observation shows is numbered [S1], [S2], ... across the run; the final answer may cite only
those. Observations are kept inside the window by `memory.ObservationMemory` (EBM-Pack). The system prompt, the
text protocol and the observations that steer the model are the `research_agent` step of
llm/prompts/steps/{en,zh}.toml; the protocol's keywords (Thought, Action, Action Input, Final Answer) are English in
both, since they are parsed.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ebmrag.errors import LLMError
from ebmrag.generate.injection import neutralise
from ebmrag.llm.openai import RequestRejectedError
from ebmrag.llm.prompts import LANGUAGES, step_prompt
from ebmrag.protocols import ChatMessage, ToolCall, ToolChatClient
from ebmrag.research.memory import ObservationMemory, PackEvent
from ebmrag.research.tools import Item, Observation, Tool

CITATION = re.compile(r"\[S(\d+)\]")
SYSTEM = step_prompt("research_agent").render("system")  # English; exported with trajectories


@dataclass
class Turn:
    role: str  # assistant | observation | user
    text: str
    calls: tuple[ToolCall, ...] = ()
    call_id: str = ""
    key: str = ""  # unique in the run (models may reuse call ids across replies): the memory's fragment id


@dataclass(frozen=True)
class Step:
    index: int
    thought: str
    tool: str
    arguments: str
    observation: str
    error: bool
    sources: tuple[str, ...]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.index, "thought": self.thought, "tool": self.tool, "arguments": self.arguments,
                "observation": self.observation, "error": self.error, "sources": list(self.sources),
                "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
                "latency_ms": round(self.latency_ms, 1)}


@dataclass
class ResearchResult:
    run_id: str
    question: str
    answer: str
    status: str  # answered | step_limit | loop | invalid_citations | model_error
    protocol: str
    steps: list[Step]
    sources: dict[str, Item]  # handle -> item, every source an observation showed
    cited: list[str]
    context_events: list[PackEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    patient_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "question": self.question, "patient_id": self.patient_id, "answer": self.answer,
            "status": self.status, "protocol": self.protocol, "steps": [s.to_json() for s in self.steps],
            "citations": [{"handle": h, "kind": self.sources[h].kind, "ref": self.sources[h].ref,
                           "text": self.sources[h].text} for h in self.cited],
            "sources": {h: {"kind": i.kind, "ref": i.ref} for h, i in self.sources.items()},
            "context": [vars(e) for e in self.context_events], "problems": self.problems, "tools": self.tools,
        }


class ResearchAgent:
    """`run(question)` -> ResearchResult. `tools` are typed `Tool`s; the client speaks the OpenAI chat API."""

    def __init__(self, client: ToolChatClient, tools: Sequence[Tool], memory: ObservationMemory, max_steps: int = 12,
                 protocol: str = "auto", max_repeats: int = 2, max_tokens: int = 800, language: str = "en") -> None:
        """`language` (en, zh) is the language of the prompts the model is sent."""
        if max_steps < 1 or max_repeats < 1 or max_tokens < 16:
            raise ValueError("max_steps and max_repeats must be >= 1, max_tokens >= 16")
        if protocol not in ("auto", "tools", "text"):
            raise ValueError(f"protocol must be auto, tools or text, got {protocol!r}")
        if language not in LANGUAGES:
            raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
        self.prompt = step_prompt("research_agent", language)
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"two tools share a name: {names}")
        self.client, self.tools, self.memory = client, {t.name: t for t in tools}, memory
        self.schemas = [t.schema() for t in tools]  # what the model is sent every step: built once
        self.schema_tokens = memory.count(json.dumps(self.schemas))
        self.max_steps, self.protocol, self.max_repeats, self.max_tokens = max_steps, protocol, max_repeats, max_tokens

    def run(self, question: str, patient_id: str = "") -> ResearchResult:
        if not question.strip():
            raise ValueError("the question is empty")
        self.memory.reset()
        return _Run(self, question, patient_id).execute()


class _Run:
    """One question's loop state: the turns, the numbered sources, the steps taken."""

    def __init__(self, agent: ResearchAgent, question: str, patient_id: str) -> None:
        self.agent, self.question = agent, question
        self.protocol = "text" if agent.protocol == "text" else "tools"
        self.turns: list[Turn] = [Turn("user", question)]
        self.result = ResearchResult(uuid.uuid4().hex[:16], question, "", "step_limit", self.protocol, [], {}, [],
                                     tools=agent.schemas, patient_id=patient_id)
        self._handles: dict[tuple[str, str], str] = {}
        self._calls: dict[str, int] = {}
        self._repeats = 0

    def execute(self) -> ResearchResult:
        for index in range(1, self.agent.max_steps + 1):
            if self._step(index):
                break
        else:
            self._final_after_limit()
        self.result.protocol = self.protocol
        self.result.context_events = list(self.agent.memory.events)
        return self.result

    # --- one model call -------------------------------------------------------------------------------------
    def _step(self, index: int) -> bool:
        """True when the run is over (an accepted answer, a loop, a dead model)."""
        started = time.perf_counter()
        try:
            text, calls, tokens = self._ask(index)
        except LLMError as exc:
            self.result.status, self.result.problems = "model_error", [*self.result.problems, str(exc)]
            return True
        latency = (time.perf_counter() - started) * 1000
        if not calls and text is not None and self._final_answer(text) is not None:
            return self._accept(index, self._final_answer(text) or "", text, tokens, latency)
        if not calls:
            self._record(index, text or "", "", "", Observation(self.agent.prompt.render("no_format"), error=True),
                         tokens, latency)
            self.turns += [Turn("assistant", text or ""), Turn("user", self._format_reminder())]
            return False
        self.turns.append(Turn("assistant", text or "", calls))
        for call in calls:
            observation = self._execute(call)
            shown = self._render(observation)
            self.turns.append(Turn("observation", shown, call_id=call.id, key=f"{index}.{call.id}"))
            self._record(index, _thought(text or ""), call.name, call.arguments, observation, tokens, latency,
                         shown=shown)
            tokens = (0, 0)  # a reply's tokens are counted once, on its first call
        return self._repeats >= self.agent.max_repeats and self._stop("loop")

    def _ask(self, index: int) -> tuple[str | None, tuple[ToolCall, ...], tuple[int, int]]:
        messages = self._messages(index)
        if self.protocol == "tools":
            try:
                reply = self.agent.client.complete_tools(messages, self.agent.schemas, 0.0, self.agent.max_tokens)
            except RequestRejectedError as exc:
                if self.agent.protocol != "auto" or "tool" not in str(exc).lower():
                    raise
                self.protocol = "text"  # the endpoint does not take `tools`: the plain-text protocol
                self.result.problems.append(f"tool calling refused, switched to the text protocol: {exc}")
                return self._ask(index)
            return reply.text, reply.tool_calls, (reply.prompt_tokens, reply.completion_tokens)
        chat = [ChatMessage(m["role"], m["content"]) for m in messages]
        text_reply = self.agent.client.complete(chat, 0.0, self.agent.max_tokens)
        return text_reply.text, _parse_action(text_reply.text, index), (text_reply.prompt_tokens,
                                                                         text_reply.completion_tokens)

    def _final_answer(self, text: str) -> str | None:
        if self.protocol == "tools":
            return text.strip() or None
        match = re.search(r"Final Answer:\s*(.*)", text, re.DOTALL)
        return match.group(1).strip() if match else None

    def _accept(self, index: int, answer: str, text: str, tokens: tuple[int, int], latency: float) -> bool:
        unseen = sorted({f"S{n}" for n in CITATION.findall(answer)} - set(self.result.sources))
        if unseen:
            allowed = ", ".join(self.result.sources) or self.agent.prompt.render("no_sources")
            note = self.agent.prompt.render("unseen_citations", unseen=", ".join(unseen), allowed=allowed)
            self._record(index, _thought(text), "", "", Observation(note, error=True), tokens, latency)
            self.turns += [Turn("assistant", text), Turn("user", note)]
            self.result.problems.append(f"step {index}: rejected an answer citing unseen {', '.join(unseen)}")
            self.result.status = "invalid_citations"
            return False
        self.result.answer, self.result.status = answer, "answered"
        self.result.cited = sorted(set(f"S{n}" for n in CITATION.findall(answer)), key=lambda h: int(h[1:]))
        self._record(index, _thought(text), "", "", Observation("final answer"), tokens, latency)
        return True

    def _final_after_limit(self) -> None:
        """Out of steps: one last call without tools for an answer from what was observed."""
        status = "step_limit" if self.result.status != "invalid_citations" else "invalid_citations"
        self.turns.append(Turn("user", self.agent.prompt.render("step_limit")))
        saved, self.protocol = self.protocol, "text"
        try:
            chat = [ChatMessage(m["role"], m["content"]) for m in self._messages(self.agent.max_steps + 1)]
            reply = self.agent.client.complete(chat, 0.0, self.agent.max_tokens)
        except LLMError as exc:
            self.result.problems.append(f"no final answer after the step limit: {exc}")
            self.result.status = "step_limit"
            return
        finally:
            self.protocol = saved
        answer = self._final_answer_any(reply.text)
        valid = [h for h in dict.fromkeys(f"S{n}" for n in CITATION.findall(answer)) if h in self.result.sources]
        unseen = {f"S{n}" for n in CITATION.findall(answer)} - set(valid)
        if unseen:  # no step is left to ask again: the unseen citations are removed and reported
            answer = CITATION.sub(lambda m: m.group(0) if f"S{m.group(1)}" in valid else "", answer)
            self.result.problems.append(f"removed citations of unseen sources {sorted(unseen)} from the forced answer")
        self.result.answer, self.result.cited, self.result.status = answer.strip(), valid, status

    @staticmethod
    def _final_answer_any(text: str) -> str:
        match = re.search(r"Final Answer:\s*(.*)", text, re.DOTALL)
        return (match.group(1) if match else text).strip()

    def _stop(self, status: str) -> bool:
        self.result.status = status
        self.result.problems.append(f"stopped: {self._repeats} identical tool calls in a row")
        return True

    # --- tools ------------------------------------------------------------------------------------------------
    def _execute(self, call: ToolCall) -> Observation:
        tool = self.agent.tools.get(call.name)
        if tool is None:
            return Observation(self.agent.prompt.render("unknown_tool", tool=repr(call.name),
                                                        tools=", ".join(self.agent.tools)), error=True)
        key = f"{call.name}:{_canonical(call.arguments)}"
        if key in self._calls:
            self._repeats += 1
            return Observation(self.agent.prompt.render("repeated_call", tool=call.name, step=self._calls[key]),
                               error=True)
        self._repeats = 0
        self._calls[key] = len(self.result.steps) + 1
        return tool.call(call.arguments)

    def _render(self, observation: Observation) -> str:
        """The observation as the model sees it: sources numbered, instruction-like text neutralised."""
        lines = [observation.summary]
        for item in observation.items:
            handle = self._handle(item)
            body, _ = neutralise(item.text)
            lines.append(f"[{handle}] {item.label + ': ' if item.label else ''}{body}")
        return "\n".join(lines)

    def _handle(self, item: Item) -> str:
        key = (item.kind, item.ref)
        if key not in self._handles:
            self._handles[key] = f"S{len(self._handles) + 1}"
            self.result.sources[self._handles[key]] = item
        return self._handles[key]

    def _record(self, index: int, thought: str, tool: str, arguments: str, observation: Observation,
                tokens: tuple[int, int], latency: float, shown: str | None = None) -> None:
        sources = tuple(self._handles[(i.kind, i.ref)] for i in observation.items if (i.kind, i.ref) in self._handles)
        self.result.steps.append(Step(index, thought, tool, arguments, shown or observation.summary,
                                      observation.error, sources, tokens[0], tokens[1], latency))

    # --- messages ---------------------------------------------------------------------------------------------
    def _messages(self, index: int) -> list[dict[str, Any]]:
        prompt = self.agent.prompt
        system = prompt.render("system") + (prompt.render("text_protocol", tools=self._tool_text())
                                            if self.protocol == "text" else "")
        fixed = [t for t in self.turns if t.role != "observation"]
        count = self.agent.memory.count
        fixed_tokens = count(system) + (self.agent.schema_tokens if self.protocol == "tools" else 0) + sum(
            count(t.text) + sum(count(c.name + c.arguments) for c in t.calls) + 8 for t in fixed)
        observations = [(t.key, t.text) for t in self.turns if t.role == "observation"]
        shown = self.agent.memory.fit(observations, fixed_tokens, self.question, index)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for turn in self.turns:
            messages.append(self._message(turn, shown.get(turn.key, turn.text)))
        return messages

    def _message(self, turn: Turn, shown: str) -> dict[str, Any]:
        if turn.role == "observation":
            if self.protocol == "tools":
                return {"role": "tool", "tool_call_id": turn.call_id, "content": shown}
            return {"role": "user", "content": f"Observation: {shown}"}
        if turn.role == "assistant" and turn.calls and self.protocol == "tools":
            return {"role": "assistant", "content": turn.text or None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in turn.calls]}
        if turn.role == "assistant" and turn.calls:
            call = turn.calls[0]
            text = turn.text if "Action:" in turn.text else \
                f"Thought: {turn.text}\nAction: {call.name}\nAction Input: {call.arguments}"
            return {"role": "assistant", "content": text}
        return {"role": turn.role, "content": turn.text}

    def _tool_text(self) -> str:
        return "\n".join(self.agent.prompt.render("tool_line", name=s["function"]["name"],
                                                  description=s["function"]["description"],
                                                  parameters=json.dumps(s["function"]["parameters"]))
                         for s in self.agent.schemas)

    def _format_reminder(self) -> str:
        return self.agent.prompt.render("reminder_tools" if self.protocol == "tools" else "reminder_text")


def _parse_action(text: str, index: int) -> tuple[ToolCall, ...]:
    """The text protocol's Action / Action Input, as one tool call (a final answer has none)."""
    if re.search(r"Final Answer:", text):
        return ()
    action = re.search(r"Action:\s*([A-Za-z0-9_\-]+)", text)
    if not action:
        return ()
    found = re.search(r"Action Input:\s*(.*)", text, re.DOTALL)
    arguments = found.group(1).strip() if found else "{}"
    arguments = re.sub(r"^```(?:json)?\s*|\s*```$", "", arguments)
    return (ToolCall(f"text_{index}", action.group(1), arguments),)


def _thought(text: str) -> str:
    match = re.search(r"Thought:\s*(.*?)(?:\n(?:Action|Final Answer):|$)", text, re.DOTALL)
    return (match.group(1) if match else text).strip()


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except json.JSONDecodeError:
        return arguments.strip()
