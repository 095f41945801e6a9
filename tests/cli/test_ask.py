from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app


@pytest.fixture
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory of the test's own, so the demo knowledge base is built on first use, as for a user."""
    root = tmp_path_factory.getbasetemp() / "ask-cli"
    root.mkdir(exist_ok=True)
    path = root / "ebmrag.toml"
    path.write_text(f'[models]\ncache_dir = "{root / "cache"}"\n', encoding="utf-8")
    return path


@pytest.mark.slow
def test_ask_json_on_the_bundled_demo(config: Path) -> None:
    result = CliRunner().invoke(app, ["ask", "Which antibiotic is safe, given his allergy?", "--patient",
                                      "demo-colon", "--retrieval", "always", "--window", "1200", "--json",
                                      "--config", str(config)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["decision"]["action"] in ("answer", "retrieve", "retrieve_warn")
    ids = {p["id"] for p in data["trace"]["packed"]}
    assert data["citations"] and {c["id"] for c in data["citations"]} <= ids
    assert any(c["kind"] == "evidence" for c in data["citations"])
    assert list((config.parent / "cache").glob("demo-kb-*/CURRENT")), "the demo KB was built in the cache dir"


def test_ask_names_bad_input(config: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["ask", "Q?", "--patient", "no-such-record", "--config", str(config)])
    assert missing.exit_code == 2 and "not a bundled demo record" in missing.output
    assert "Traceback" not in missing.output
    no_llm = runner.invoke(app, ["ask", "Q?", "--patient", "demo-colon", "--llm", "openai", "--config", str(config)])
    assert no_llm.exit_code == 2 and "needs --base-url and --model" in no_llm.output


@pytest.mark.parametrize("window", ["0", "-5"])
def test_ask_window_out_of_range_names_the_window_only(config: Path, window: str) -> None:
    """Issue 18.6/18.9: 0 meant 4096; -5 mentioned the internal max_queries."""
    result = CliRunner().invoke(app, ["ask", "Q?", "--patient", "demo-colon", "--window", window,
                                      "--config", str(config)])
    assert result.exit_code == 2 and "window must be a whole number of tokens" in result.stderr
    assert "max_queries" not in result.output
