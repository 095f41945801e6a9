"""`eval tiers --text-only` and `eval compression` on the shared data, through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app


@pytest.mark.data
@pytest.mark.model
def test_text_only_tiering_reports_per_tier_precision_and_recall(shared_data: Path) -> None:
    """On the tune half, the half rules and models are tuned on (the check half is reported, docs/tiers.md)."""
    result = CliRunner().invoke(app, ["eval", "tiers", "--text-only", "--data-dir", str(shared_data), "--half",
                                      "tune", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) >= {"fragments", "agreement", "per_tier"} and report["fragments"] > 800
    assert set(report["per_tier"]) == {"T1", "T2", "T3", "T4"}
    assert all(0 <= v["precision"] <= 1 and 0 <= v["recall"] <= 1 for v in report["per_tier"].values())
    assert report["per_tier"]["T1"]["recall"] >= 0.9, "pathology and allergies told in free text are found"
    assert {"agentclinic-medqa", "agentclinic-nejm", "cmb-clin"} <= set(report["sources"])


@pytest.mark.slow
@pytest.mark.data
def test_compression_check_lists_what_state_b_drops(shared_data: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "compression", "--data-root", str(shared_data), "--json"])
    assert result.exit_code == 0, result.output
    check = json.loads(result.stdout)
    assert check["fragments"] > 500 and check["entities"] > check["fragments"]
    assert sum(check["dropped"].values()) <= 0.01 * check["entities"], "state B keeps the entities of critical facts"
