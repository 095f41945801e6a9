"""Trajectories: every research run as one JSON line, exported as fine-tuning data, scored with the reward below.

A run line holds the question, the steps (thought, tool, arguments, observation, tokens, latency), the answer,
its citations and the tool schemas. Lines are appended whole and flushed to disk, so a crash loses at most the
run being written; a torn last line is skipped (and counted) when read.

Export formats:
* `openai-chat`: {"messages": [system, user, assistant(tool_calls), tool, ..., assistant(answer)], "tools": [...]}
  — the shape of OpenAI's fine-tuning with function calling;
* `sharegpt`: {"conversations": [{"from": "system|human|gpt|function_call|observation", "value": ...}],
  "tools": "<json>"} — the shape LLaMA-Factory reads for agent tuning.

Reward (after MedResearcher-R1, r = α·r_task + β·r_expert − γ·r_efficiency): r_task is 1 for an answer that matches the
gold answer (the same option letter, or the gold text contained after normalisation), else the token F1;
r_expert is a judge's score when the caller has one (0 otherwise); r_efficiency is the share of tool calls
that were wasted — errors, repeats of an earlier call, and calls after the step whose sources the answer
cites last.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmrag.research.agent import SYSTEM, ResearchResult

log = logging.getLogger(__name__)
FORMATS = ("openai-chat", "sharegpt")


class TrajectoryLog:
    """Appends runs to `folder/trajectories.jsonl`."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "trajectories.jsonl"

    def append(self, result: ResearchResult) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(result.to_json(), ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def read_runs(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete run line; torn or foreign lines are skipped with a warning naming the line."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                run = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d is not a complete run (a crash while writing?); skipped", path, number)
                continue
            if isinstance(run, dict) and "steps" in run and "question" in run:
                yield run
            else:
                log.warning("%s:%d is not a research run; skipped", path, number)


def export_run(run: dict[str, Any], fmt: str) -> dict[str, Any]:
    if fmt == "openai-chat":
        return {"messages": _chat_messages(run), "tools": run.get("tools", [])}
    if fmt == "sharegpt":
        return {"conversations": _sharegpt(run), "tools": json.dumps(run.get("tools", []), ensure_ascii=False)}
    raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _tool_steps(run: dict[str, Any]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Steps grouped by model call (one reply may call several tools)."""
    calls: dict[int, list[dict[str, Any]]] = {}
    for step in run["steps"]:
        if step["tool"]:
            calls.setdefault(step["step"], []).append(step)
    yield from sorted(calls.items())


def _chat_messages(run: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": run["question"]}]
    for index, steps in _tool_steps(run):
        ids = [f"call_{index}_{n}" for n in range(len(steps))]
        messages.append({"role": "assistant", "content": steps[0]["thought"] or None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": s["tool"], "arguments": s["arguments"]}}
            for i, s in zip(ids, steps, strict=True)]})
        messages += [{"role": "tool", "tool_call_id": i, "content": s["observation"]}
                     for i, s in zip(ids, steps, strict=True)]
    messages.append({"role": "assistant", "content": run["answer"]})
    return messages


def _sharegpt(run: dict[str, Any]) -> list[dict[str, str]]:
    turns = [{"from": "system", "value": SYSTEM}, {"from": "human", "value": run["question"]}]
    for _, steps in _tool_steps(run):
        for step in steps:
            turns.append({"from": "function_call", "value": json.dumps(
                {"name": step["tool"], "arguments": _arguments(step["arguments"])}, ensure_ascii=False)})
            turns.append({"from": "observation", "value": step["observation"]})
    turns.append({"from": "gpt", "value": run["answer"]})
    return turns


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


@dataclass(frozen=True)
class Reward:
    task: float
    expert: float
    efficiency: float  # the wasted share of tool calls (a penalty)
    total: float
    tool_calls: int

    def to_json(self) -> dict[str, float | int]:
        return {"task": round(self.task, 4), "expert": round(self.expert, 4), "efficiency": round(self.efficiency, 4),
                "total": round(self.total, 4), "tool_calls": self.tool_calls}


def score_run(run: dict[str, Any], gold: str, alpha: float = 1.0, beta: float = 0.0, gamma: float = 0.3,
              expert: float = 0.0) -> Reward:
    task = answer_correctness(run.get("answer", ""), gold)
    calls = [s for s in run["steps"] if s["tool"]]
    wasted = sum(1 for s in calls if s["error"])
    cited = {c["handle"] for c in run.get("citations", [])}
    last_useful = max((s["step"] for s in calls if cited & set(s["sources"])), default=None)
    if last_useful is not None:
        wasted += sum(1 for s in calls if s["step"] > last_useful and not s["error"])
    efficiency = wasted / len(calls) if calls else 0.0
    return Reward(task, expert, efficiency, alpha * task + beta * expert - gamma * efficiency, len(calls))


def answer_correctness(answer: str, gold: str) -> float:
    """1.0 when the gold option letter or gold text is in the answer, else token F1 (0 for an empty answer)."""
    if not answer.strip() or not gold.strip():
        return 0.0
    if re.fullmatch(r"[A-Ea-e]", gold.strip()):
        letters = re.findall(r"\b(?:answer(?: is)?|option)?\s*\(?([A-E])\)?(?=[\s.:)]|$)", answer)
        return 1.0 if letters and letters[0] == gold.strip().upper() else 0.0
    a, g = _tokens(answer), _tokens(gold)
    if " ".join(g) in " ".join(a):
        return 1.0
    common = sum(min(a.count(t), g.count(t)) for t in set(g))
    return 0.0 if not common else 2 * common / (len(a) + len(g))


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())
