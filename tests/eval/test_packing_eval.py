from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.eval.cases import EvalCase, load_cases
from ebmrag.eval.noise import NoiseConfig, noisy_cases
from ebmrag.eval.packing_eval import entity_ceiling, evaluate, prepare, score_pack
from ebmrag.eval.packing_report import dataset_dir, prepare_cases, run_suite
from ebmrag.eval.packing_suite import NEUTRAL, Suite, split_of, tier_weight_grid
from ebmrag.evidence.entities import EntityCompressor
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.models.tokens import make_token_counter
from ebmrag.packing.dedup import collapse_duplicates
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.greedy import GreedyPacker
from ebmrag.packing.overflow import is_allergy
from ebmrag.packing.packer import STRATEGIES, make_packer
from ebmrag.packing.utility import CandidateBuilder, UtilityParams
from ebmrag.records.fragment import Tier
from tests.eval.helpers import measured, prepared_case

ROW_KEYS = {"dataset", "strategy", "window", "cases", "rrce", "entity_rrce", "entity_ceiling", "t1_retention",
            "history_retention", "findings_rrce", "utility_ratio", "ms_per_pack"}


def test_entity_ceiling_takes_the_cheapest_complete_state_and_bounds_every_packer() -> None:
    items = [
        measured("lab", Tier.T2, "Creatinine 2.8 mg/dL, up from 1.1 mg/dL last week, patient feels tired.", 30,
                 ("Creatinine 2.8 mg/dL, up from 1.1 mg/dL.", 14)),
        measured("path", Tier.T1, "Biopsy shows adenocarcinoma of the colon.", 20),
        measured("cut", Tier.T2, "Potassium 6.1 mmol/L and sodium 131 mmol/L on the morning panel.", 25,
                 ("Potassium 6.1 mmol/L.", 8)),
        measured("chat", Tier.T4, "Patient watched television.", 40, similarity=0.9),
    ]
    prepared = prepared_case(items, {"lab": Tier.T2, "path": Tier.T1, "cut": Tier.T2, "chat": Tier.T4})
    candidates = prepared.candidates(UtilityParams())
    # "cut" loses the sodium in its compressed state, so only its full 25 tokens keep every entity
    assert entity_ceiling(prepared, candidates, 34) == 2  # 14 (lab, compressed) + 20 (path)
    assert entity_ceiling(prepared, candidates, 59) == 3
    for strategy in STRATEGIES:
        packer = make_packer(strategy, make_token_counter("bundled"))
        for window in (20, 34, 59, 120):
            score = score_pack(prepared, candidates, packer.pack(candidates, window))
            assert score.entity_kept <= entity_ceiling(prepared, candidates, window) <= score.critical
            assert score.entity_kept <= score.kept <= score.critical == 3


def test_weight_grid_and_split_are_the_papers() -> None:
    grid = tier_weight_grid()
    assert len(grid) == 35 and all(w.alpha >= w.beta >= w.gamma >= 1 for w in grid)
    assert split_of("case-1") == split_of("case-1")
    ids = [f"c{i}" for i in range(400)]
    assert 150 < sum(split_of(i) == "validation" for i in ids) < 250


@pytest.fixture(scope="module")
def suite(embedder: Any, tiering: Any, extractor: Any) -> Suite:
    counter = make_token_counter("bundled")
    return Suite(CandidateBuilder(embedder, counter, NEUTRAL, compressor=EntityCompressor(extractor)), tiering,
                 extractor, counter, NoiseConfig(seed=1))


@pytest.mark.slow
def test_invariants_on_real_cases(suite: Suite, shared_data: Path) -> None:
    prepared = [*prepare_cases(suite, "agentclinic", load_cases("agentclinic", shared_data / "agentclinic", 4),
                               suite.noise),
                *prepare_cases(suite, "medqa", load_cases("medqa", shared_data / "mirage", 4), suite.noise)]
    packers = [make_packer(s, suite.token_counter) for s in STRATEGIES]
    rows = {(r.strategy, r.window): r for r in evaluate(prepared, packers, (256, 1024))}
    for row in rows.values():
        assert row.cases == 8
        assert row.entity_rrce <= row.rrce and row.entity_rrce <= row.entity_ceiling
    for window in (256, 1024):
        exact = rows[("ebm-exact", window)]
        assert exact.utility_ratio == pytest.approx(100.0)
        assert exact.rrce > rows[("fifo", window)].rrce and exact.rrce > rows[("semantic", window)].rrce
        assert exact.entity_rrce > rows[("uniform", window)].entity_rrce
    assert rows[("ebm-exact", 1024)].rrce >= rows[("ebm-exact", 256)].rrce
    # every candidate of every case is either packed or dropped, each with a reason
    item = prepared[0]
    candidates = item.candidates(UtilityParams())
    result = ExactPacker().pack(candidates, 256)
    assert len(result.packed) + len(result.dropped) == len(candidates)
    assert all(p.reason for p in result.packed) and all(d.reason for d in result.dropped)


def _with_allergies(dataset: str, folder: Path, noise: NoiseConfig, wanted: int) -> list[EvalCase]:
    """The first noisy cases whose signal or noise holds an allergy by the tier rules (cheap: no model)."""
    rules, found = TierClassifier(), []
    for case in noisy_cases(load_cases(dataset, folder, 60), noise):
        if any(rules.classify(f.text, f.section).always == "allergy" for f in case.record.fragments):
            found.append(case)
        if len(found) == wanted:
            break
    return found


@pytest.mark.slow
def test_every_allergy_of_signal_and_noise_is_packed_at_256_when_allergies_fit(suite: Suite,
                                                                            shared_data: Path) -> None:
    """Level 1 of the clinical order on real cases with the protocol's noise (other cases' allergies included)."""
    cases = [*_with_allergies("medqa", shared_data / "mirage", suite.noise, 3),
             *_with_allergies("agentclinic", shared_data / "agentclinic", suite.noise, 3)]
    assert len(cases) >= 4, "the slice must hold allergies, or the test proves nothing"
    checked = 0
    for item in prepare(cases, suite.builder, suite.tiering, suite.extractor):
        candidates, _ = collapse_duplicates(item.candidates(UtilityParams()))
        allergies = [c for c in candidates if is_allergy(c)]
        if sum(min(o.tokens for o in c.options) for c in allergies) > 256:
            continue
        for packer in (ExactPacker(), GreedyPacker()):
            packed = {p.fragment_id: p.reason.value for p in packer.pack(candidates, 256).packed}
            assert all(packed.get(c.fragment.id) == "allergy" for c in allergies), (item.case.case_id, packer.name)
        checked += len(allergies)
    assert checked >= 4


@pytest.mark.slow
def test_small_suite_writes_every_table_and_plot(suite: Suite, shared_data: Path, tmp_path: Path) -> None:
    seconds = run_suite(suite, shared_data, tmp_path, limit=2, sweep_cases=2)
    assert set(seconds) == {"measure", "windows", "sweeps", "noise"}
    for name in ("windows_medqa", "windows_agentclinic", "windows_cmb", "kmin", "weights", "epsilon_lambda",
                 "noise", "decay"):
        assert (tmp_path / f"{name}.json").is_file() and (tmp_path / f"{name}.png").stat().st_size > 5000
    rows = json.loads((tmp_path / "results.json").read_text())
    assert {r["dataset"] for r in rows} == {"medqa", "agentclinic", "cmb"}
    assert all(set(r) == ROW_KEYS for r in rows)
    noise = json.loads((tmp_path / "noise.json").read_text())
    assert sorted({r["noise"] for r in noise}) == [20, 40, 80, 120, 200]
    assert dataset_dir(shared_data, "cmb") == shared_data / "cmb_clin"


@pytest.mark.slow
def test_eval_packing_command_writes_results_json(shared_data: Path, tmp_path: Path) -> None:
    """--noise-ratio 2, not the paper's 12: the same steps on a sixth of the fragments to embed (issue 44)."""
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n')
    result = CliRunner().invoke(app, [
        "eval", "packing", "--dataset", "cmb", "--data-dir", str(shared_data / "cmb_clin"), "--limit", "2",
        "--windows", "256,512", "--strategies", "fifo,ebm-exact", "--noise-ratio", "2", "--out", str(tmp_path / "out"),
        "--config", str(config)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(r["strategy"], r["window"]) for r in rows] == [("fifo", 256), ("fifo", 512), ("ebm-exact", 256),
                                                           ("ebm-exact", 512)]
    assert all(set(r) == ROW_KEYS and r["cases"] == 2 for r in rows)
    bad = CliRunner().invoke(app, ["eval", "packing", "--dataset", "cmb", "--data-dir", str(tmp_path),
                                   "--out", str(tmp_path / "o"), "--strategies", "lifo"])
    assert bad.exit_code == 2 and "unknown strategies" in bad.output
    missing = CliRunner().invoke(app, ["eval", "packing", "--dataset", "cmb", "--data-dir", str(tmp_path),
                                       "--out", str(tmp_path / "o")])
    assert missing.exit_code == 2 and "cmb_clin" in missing.output
    cases = {}
    for half in ("tune", "check"):
        run = CliRunner().invoke(app, [
            "eval", "packing", "--dataset", "cmb", "--data-dir", str(shared_data / "cmb_clin"), "--limit", "6",
            "--windows", "256", "--strategies", "fifo", "--noise-ratio", "2", "--half", half,
            "--out", str(tmp_path / half), "--config", str(config)])
        assert run.exit_code == 0, run.output
        cases[half] = json.loads((tmp_path / half / "results.json").read_text())[0]["cases"]
    assert cases["tune"] + cases["check"] == 6, "the two halves split the cases"
    wrong = CliRunner().invoke(app, ["eval", "packing", "--dataset", "cmb", "--data-dir", str(shared_data / "cmb_clin"),
                                     "--out", str(tmp_path / "o"), "--half", "both"])
    assert wrong.exit_code == 2 and "half must be" in wrong.output
