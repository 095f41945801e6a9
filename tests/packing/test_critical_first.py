"""The current encounter and the critical-first objective, end to end on hand-built records."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.evidence.entities import EntityCompressor, default_extractor
from ebmrag.packing.utility import MeasuredFragment, UtilityParams, current_encounter_id, is_current
from ebmrag.records.fragment import Fragment, Tier, TierDecision
from ebmrag.records.loaders import load_record

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def measured(hours: float | None, same: bool | None = None) -> MeasuredFragment:
    fragment = Fragment("f", "p", "x", decision=TierDecision(Tier.T2, "t"))
    return MeasuredFragment(fragment, "[f]", "[f] x", 2, 0.5, 0.0, hours_before_newest=hours, same_encounter=same)


def test_current_by_encounter_id_else_by_time() -> None:
    params = UtilityParams(encounter_window_hours=72)
    assert is_current(measured(10), params) and not is_current(measured(100), params)
    assert is_current(measured(None), params), "an undated note is read as today's"
    assert not is_current(measured(1, same=False), params), "an encounter id overrides time"
    fragments = [Fragment("a", "p", "x", timestamp=NOW - timedelta(days=9), encounter="Encounter/1"),
                 Fragment("b", "p", "y", timestamp=NOW, encounter="Encounter/2"), Fragment("c", "p", "z")]
    assert current_encounter_id(fragments) == "Encounter/2"


def test_encounter_ids_are_read_from_ebmrag_json(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"patient_id": "p", "fragments": [
        {"id": "a", "text": "Creatinine 2.8 mg/dL.", "encounter": "visit-7", "timestamp": "2026-03-01"}]}))
    assert load_record(path).fragments[0].encounter == "visit-7"


def test_compression_keeps_grade_receptors_side_score_and_pending() -> None:
    text = ("The core biopsy of the left breast, taken after a long wait in clinic, shows invasive ductal carcinoma, "
            "grade 3, ER positive, HER2 negative. Gleason 4+3 on the prostate cores; repeat PSA pending.")
    state_b = EntityCompressor(default_extractor()).compress(text).text
    for kept in ("left", "grade 3", "ER positive", "HER2 negative", "Gleason 4+3", "pending"):
        assert kept in state_b, kept
    assert "long wait" not in state_b


@pytest.mark.model
def test_pack_reports_both_objectives(tmp_path: Path) -> None:
    """A verbose, on-topic history line must not push out today's T2 result under the critical objective."""
    stamp = NOW.isoformat()
    record = {"patient_id": "p", "fragments": [
        {"id": "hist", "text": "He asks about the antibiotic for his wound infection, the antibiotic he took before "
                               "for the wound, which antibiotic is safe for a wound like this, and whether the wound "
                               "infection antibiotic can be taken with food.", "timestamp": stamp,
         "section": "History"},
        {"id": "k", "text": "Potassium 6.4 mmol/L.", "timestamp": stamp, "section": "Labs"}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    runner = CliRunner()
    results = {}
    for objective in ("critical", "paper"):
        out = runner.invoke(app, ["pack", str(path), "--query", "Which antibiotic is safe for his wound infection?",
                                  "--window", "40", "--k-min", "0", "--objective", objective, "--json"])
        assert out.exit_code == 0, out.output
        results[objective] = json.loads(out.stdout)
    critical = {p["fragment_id"]: p["reason"] for p in results["critical"]["packed"]}
    assert critical.get("k") == "current_encounter"
    assert results["paper"]["strategy"] == "ebm-exact-paper"
    bad = runner.invoke(app, ["pack", str(path), "--query", "q", "--objective", "fastest"])
    assert bad.exit_code == 2 and "--objective must be" in bad.output
