from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.eval.cases import load_cases
from ebmrag.text.sentences import split_sentences
from tests.fake_openai import FakeOpenAI, serve


@pytest.mark.slow
def test_annotate_then_train_from_the_command_line(shared_data: Path, tmp_path: Path) -> None:
    cases = [c for c in load_cases("agentclinic", shared_data / "agentclinic", 2) if c.answer]
    first = {split_sentences(c.record.fragments[0].text)[0].text: c.answer for c in cases}

    def doctor(body: dict[str, Any]) -> str:
        """Right exactly when the case's first sentence is in the summary: that sentence is decisive."""
        summary = body["messages"][1]["content"]
        return json.dumps({"diagnosis": next((gold for s, gold in first.items() if s in summary), "unsure")})

    labels, config = tmp_path / "labels.jsonl", tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n', encoding="utf-8")  # fresh reply cache
    with serve(FakeOpenAI(doctor)) as url:
        result = CliRunner().invoke(app, ["gate", "annotate", "--dataset", "agentclinic", "--data-dir",
                                          str(shared_data / "agentclinic"), "--out", str(labels), "--limit", "2",
                                          "--base-url", url, "--model", "tiny", "--config", str(config)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows if r["label"] == "A"] == list(first)
    assert {r["label"] for r in rows} == {"A", "C"} and {r["strategy"] for r in rows} == {1}
    trained = CliRunner().invoke(app, ["gate", "train", str(labels), "--out", str(tmp_path / "gate.npz"),
                                       "--config", str(config)])
    assert trained.exit_code == 0, trained.output
    assert "held out: accuracy" in trained.output and (tmp_path / "gate.npz").exists()
