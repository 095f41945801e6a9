"""Tools on their own (authority weighting, document reading, ICD-10), trajectories, export, reward, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.research.params import default_authority
from ebmrag.research.tools import Icd10LookupTool, KbSearchTool, ReadDocumentTool, Tool
from ebmrag.research.trajectory import TrajectoryLog, answer_correctness, export_run, read_runs, score_run
from tests.fake_openai import FakeOpenAI, serve


def tool_named(tools: list[Tool], name: str) -> Any:
    return next(t for t in tools if t.name == name)


def test_authority_weighting_follows_the_formula() -> None:
    tool = KbSearchTool.__new__(KbSearchTool)
    tool.authority, tool.relevance_weight = dict(default_authority()), 0.4
    assert tool.score(0.5, "guideline") == pytest.approx(0.4 * 0.5 + 0.6 * 1.0)
    assert tool.score(0.9, "other") == pytest.approx(0.4 * 0.9 + 0.6 * 0.2)
    assert tool.score(0.9, "unheard-of") == tool.score(0.9, "other")
    assert tool.score(1.7, "trial") == pytest.approx(0.4 + 0.6 * 0.7)  # Rel is clipped to [0, 1]
    ordered = [default_authority()[k] for k in ("guideline", "systematic_review", "trial", "cohort", "textbook",
                                              "other")]
    assert ordered == sorted(ordered, reverse=True)


@pytest.mark.model
def test_kb_search_ranks_by_the_weighted_score_and_read_document_keeps_the_budget(
        research_tools: list[Tool]) -> None:
    search = tool_named(research_tools, "kb_search")
    found = search.call('{"query": "contrast media reaction premedication", "k": 4}')
    assert not found.error and len(found.items) == 4
    scores = [float(i.label.split("score ")[1].split(" ")[0]) for i in found.items]
    assert scores == sorted(scores, reverse=True)
    reader: ReadDocumentTool = tool_named(research_tools, "read_document")
    whole = reader.call(json.dumps({"doc_id": found.items[0].ref}))  # a chunk id opens its document
    assert not whole.error and whole.items[0].kind == "chunk"
    assert sum(reader.tokens.count(i.text) for i in whole.items) <= reader.budget or len(whole.items) == 1
    missing = reader.call('{"doc_id": "no-such-document"}')
    assert missing.error and "no document" in missing.summary
    assert search.call('{"query": "x", "k": 99}').error  # outside the schema: k <= 20


@pytest.mark.slow
def test_icd10_lookup_both_ways() -> None:
    tool = Icd10LookupTool()
    code = tool.call('{"query": "j930"}')
    assert code.items[0].ref == "J93.0" and "pneumothorax" in code.items[0].text.lower()
    by_name = tool.call('{"query": "spontaneous pneumothorax", "system": "cm"}')
    assert any(i.ref.startswith("J93") for i in by_name.items)
    assert tool.call('{"query": "J93", "system": "icd11"}').error


def test_schemas_come_from_the_argument_models(research_tools: list[Tool]) -> None:
    for tool in research_tools:
        spec = tool.schema()["function"]
        assert spec["name"] == tool.name and spec["parameters"]["type"] == "object"
        assert spec["parameters"].get("additionalProperties") is False


RUN = {"run_id": "r1", "question": "What is J93?", "answer": "Pneumothorax [S1].", "status": "answered",
       "citations": [{"handle": "S1", "kind": "icd10", "ref": "J93", "text": "J93: Pneumothorax"}],
       "tools": [{"type": "function", "function": {"name": "icd10_lookup", "parameters": {}}}],
       "steps": [{"step": 1, "thought": "look it up", "tool": "icd10_lookup", "arguments": '{"query": "J93"}',
                  "observation": "[S1] J93: Pneumothorax", "error": False, "sources": ["S1"]},
                 {"step": 2, "thought": "again", "tool": "icd10_lookup", "arguments": '{"query": "J93.1"}',
                  "observation": "[S2] J93.1", "error": False, "sources": ["S2"]},
                 {"step": 3, "thought": "", "tool": "", "arguments": "", "observation": "final answer",
                  "error": False, "sources": []}]}


def test_export_formats_and_reward() -> None:
    chat = export_run(RUN, "openai-chat")["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert chat[2]["tool_calls"][0]["id"] == chat[3]["tool_call_id"]
    share = export_run(RUN, "sharegpt")["conversations"]
    assert [t["from"] for t in share][-3:] == ["function_call", "observation", "gpt"]
    assert json.loads(share[2]["value"]) == {"name": "icd10_lookup", "arguments": {"query": "J93"}}
    reward = score_run(RUN, "pneumothorax")
    assert reward.task == 1.0 and reward.efficiency == 0.5  # the second lookup came after the cited source
    assert reward.total == pytest.approx(1.0 - 0.3 * 0.5)
    assert answer_correctness("The answer is C.", "C") == 1.0 and answer_correctness("B", "C") == 0.0
    with pytest.raises(ValueError, match="format"):
        export_run(RUN, "alpaca")


def test_trajectory_log_survives_a_torn_line(tmp_path: Path) -> None:
    log = tmp_path / "trajectories.jsonl"
    log.write_text(json.dumps(RUN) + "\n" + '{"run_id": "torn", "quest', encoding="utf-8")
    assert [r["run_id"] for r in read_runs(log)] == ["r1"]
    assert TrajectoryLog(tmp_path).path == log


@pytest.mark.slow
@pytest.mark.model
def test_cli_research_logs_and_exports(tmp_path: Path) -> None:
    fake = FakeOpenAI()
    fake.script = [("calls", [("icd10_lookup", '{"query": "J93"}')]), ("text", "Pneumothorax [S1].")]
    config = tmp_path / "c.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n[research]\ntrajectories = "{tmp_path}"\n',
                      encoding="utf-8")
    runner = CliRunner()
    with serve(fake) as url:
        done = runner.invoke(app, ["research", "What is J93?", "--base-url", url, "--model", "fake", "--json",
                                   "--patient", "demo-chest", "--config", str(config)])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["status"] == "answered" and result["citations"][0]["ref"] == "J93"
    assert result["patient_id"] == "demo-chest-0002"
    assert {t["function"]["name"] for t in result["tools"]} >= {"kb_search", "ddx", "patient_record"}
    out = tmp_path / "chat.jsonl"
    exported = runner.invoke(app, ["research", "export", "--format", "openai-chat", "--out", str(out),
                                   "--config", str(config)])
    assert exported.exit_code == 0, exported.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"question": "What is J93?", "answer": "pneumothorax"}) + "\n", encoding="utf-8")
    scored = runner.invoke(app, ["research", "score", "--gold", str(gold), "--config", str(config)])
    assert scored.exit_code == 0 and json.loads(scored.stdout)["mean_task"] == 1.0
    gold.write_text('{"question": "What is J93?"}\n', encoding="utf-8")
    no_answer = runner.invoke(app, ["research", "score", "--gold", str(gold), "--config", str(config)])
    assert no_answer.exit_code == 2 and "gold.jsonl:1" in no_answer.output
    bad = runner.invoke(app, ["research", "What?", "--config", str(config)])
    assert bad.exit_code == 2 and "--base-url" in bad.output
