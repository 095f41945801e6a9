from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.demo import demo_query, demo_record_paths

runner = CliRunner()


@pytest.mark.model
def test_pack_json_shape() -> None:
    path = next(p for p in demo_record_paths() if "colon" in p.name)
    result = runner.invoke(app, ["pack", str(path), "--query", demo_query(path), "--window", "256", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) >= {"window", "tokens_used", "packed", "dropped", "context"}
    assert data["tokens_used"] <= data["window"] == 256
    assert set(data["packed"][0]) >= {"fragment_id", "state", "tier", "tokens", "utility"}
    assert all(set(d) >= {"fragment_id", "tier", "reason"} for d in data["dropped"])
    assert any(p["fragment_id"] == "pathology-2026-03-10" for p in data["packed"])


def test_bad_record_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"patient_id": "p", "fragments": [{"id": "a"}]}')
    result = runner.invoke(app, ["pack", str(bad), "--query", "q"])
    assert result.exit_code == 2
    assert "fragments[0].text: is missing" in result.output
    assert "Traceback" not in result.output


def test_bad_config_is_reported(tmp_path: Path) -> None:
    config = tmp_path / "ebmrag.toml"
    config.write_text("[packing]\nwindow = 'big'\n")
    path = demo_record_paths()[0]
    result = runner.invoke(app, ["pack", str(path), "--query", "q", "--config", str(config)])
    assert result.exit_code == 2 and "[packing].window must be int" in result.output


@pytest.mark.parametrize("window", ["0", "-5", "1000000000"])
def test_zero_or_absurd_windows_are_errors_not_defaults(window: str) -> None:
    """Issue 18.2 and 18.6: 0 used to mean the default window, 10^9 grew to 21.9 GB."""
    path = demo_record_paths()[0]
    result = runner.invoke(app, ["pack", str(path), "--query", "q", "--window", window, "--json"])
    assert result.exit_code == 2 and "window must be a whole number of tokens from 1 to" in result.stderr
    assert result.stdout == "", "errors never reach stdout, where --json output is parsed"
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.model
def test_pack_takes_a_bundled_demo_name_and_names_them_when_unknown() -> None:
    result = runner.invoke(app, ["pack", "demo-colon", "--query", "Which antibiotic?", "--window", "300", "--json"])
    assert result.exit_code == 0, result.output
    assert any(p["fragment_id"] == "admission-2026-03-08" for p in json.loads(result.output)["packed"])
    unknown = runner.invoke(app, ["pack", "demo-nobody", "--query", "q"])
    assert unknown.exit_code == 2 and "demo-colon" in unknown.output and "Traceback" not in unknown.output


@pytest.mark.integration
def test_version_from_the_cli_and_python_m() -> None:
    import subprocess
    import sys

    from ebmrag import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"ebmrag {__version__}"
    module = subprocess.run([sys.executable, "-m", "ebmrag", "--version"], capture_output=True, text=True, check=False)
    assert module.returncode == 0 and module.stdout.strip() == f"ebmrag {__version__}"


@pytest.mark.model
def test_pack_json_carries_the_certificate_of_its_trace() -> None:
    """Issue 46.4: one glance says whether anything critical was left out; the counts add up to the trace."""
    answers = {}
    for strategy in ("ebm-exact", "ebm-greedy"):
        result = runner.invoke(app, ["pack", "demo-colon", "--query", "Which antibiotic is safe, given his allergy?",
                                     "--window", "64", "--strategy", strategy, "--json"])
        assert result.exit_code == 0, result.output
        answers[strategy] = json.loads(result.output)
    data = answers["ebm-exact"]
    cert = data["certificate"]
    assert [level["level"] for level in cert["levels"]] == [1, 2, 3, 4]
    assert sum(level["packed"] for level in cert["levels"]) == len(data["packed"])
    assert sum(level["left_out"] + level["collapsed"] for level in cert["levels"]) == len(data["dropped"])
    assert cert["optimal"] is True and answers["ebm-greedy"]["certificate"]["optimal"] is False
    assert cert["critical_left_out"] > 0, "64 tokens cannot hold every critical fact of the demo chart"
    first = cert["first_critical_left_out"]
    entry = next(d for d in data["dropped"] if d["fragment_id"] == first["fragment_id"])
    assert entry["level"] == first["level_name"] and entry["reason"] == first["reason"]
    assert first["room"] == 64 - data["tokens_used"] and first["needs"] > first["room"]
    assert first["level"] == min(level["level"] for level in cert["levels"] if level["left_out"])
