from __future__ import annotations

import json
import random
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from ebmrag.errors import RecordError
from ebmrag.eval.cases import ENCOUNTER, agentclinic_cases, cmb_cases, load_cases, medqa_case, medqa_cases
from ebmrag.eval.noise import NoiseConfig, filler_line, inject_noise, noisy_cases
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.records.fragment import Tier


def test_medqa_vignette_becomes_modality_fragments_and_a_question(shared_data: Path) -> None:
    cases = medqa_cases(shared_data / "mirage")
    assert len(cases) > 100
    for case in cases[:50]:
        tiers = [case.gold_tiers[f.id] for f in case.record.fragments]
        assert len(set(tiers)) >= 2 and any(t in (Tier.T1, Tier.T2) for t in tiers)
        assert all(a is not b for a, b in pairwise(tiers)), "neighbours of one tier merge"
        assert case.question.endswith("?") and case.label_source == "classifier"
        assert case.answer in case.options


def test_medqa_case_rejects_single_modality_vignettes() -> None:
    only_history = {"question": "A 30-year-old man has had a cough for two days. He smokes. What is the cause?"}
    assert medqa_case("x", only_history, TierClassifier()) is None
    labs = {"question": "A 30-year-old man has a cough. Serum sodium is 128 mEq/L. What is the cause?",
            "options": {"A": "SIADH"}, "answer": "A"}
    case = medqa_case("y", labs, TierClassifier())
    assert case is not None and [case.gold_tiers[f.id] for f in case.record.fragments] == [Tier.T4, Tier.T2]


def test_agentclinic_gold_tiers_come_from_fields_and_hide_the_diagnosis(shared_data: Path) -> None:
    raw = [json.loads(line) for line in (shared_data / "agentclinic" / "agentclinic_medqa_extended_shared.jsonl")
           .read_text(encoding="utf-8").splitlines()[:20]]
    cases = agentclinic_cases(shared_data / "agentclinic")[:20]
    assert len({c.case_id for c in cases}) == len(cases)
    for case in cases:
        assert case.label_source == "field" and case.critical_ids
        assert all(f.timestamp is not None and f.timestamp >= ENCOUNTER for f in case.record.fragments)
        hidden = ("Correct_Diagnosis", "Objective_for_Doctor")
        assert not any((f.section or "").startswith(hidden) for f in case.record.fragments)
        # only a test result may name the diagnosis (a biopsy report can); history and exam never do here
        assert all(case.answer not in f.text for f in case.record.fragments if case.gold_tiers[f.id] is Tier.T4)
    biopsies = [fid for c in cases for fid, tier in c.gold_tiers.items() if "biopsy" in fid]
    assert biopsies and all(cases[0].gold_tiers.get(fid, Tier.T1) is Tier.T1 for fid in biopsies)
    assert cases[0].answer == raw[0]["OSCE_Examination"]["Correct_Diagnosis"]


def test_cmb_cases_hide_the_title_and_tier_by_part(shared_data: Path) -> None:
    raw = json.loads((shared_data / "cmb_clin" / "cmb_clin_shared.json").read_text(encoding="utf-8"))
    cases = cmb_cases(shared_data / "cmb_clin")
    assert len(cases) >= 30
    titles = {f"cmb-{r['id']}": r["title"] for r in raw}
    for case in cases:
        assert all(titles[case.case_id] not in f.text for f in case.record.fragments)
        for fragment in case.record.fragments:
            tier = case.gold_tiers[fragment.id]
            if (fragment.section or "").startswith("体格检查"):
                assert tier is Tier.T3
            if (fragment.section or "").startswith("辅助检查"):
                assert tier in (Tier.T1, Tier.T2)
        assert case.language == "zh" and case.question


def test_load_cases_errors_name_the_folder(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="benchmark"):
        load_cases("medqa", tmp_path)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_cases("mimic", tmp_path)


def test_noise_is_seeded_mixed_and_keeps_the_signal(shared_data: Path) -> None:
    cases = load_cases("agentclinic", shared_data / "agentclinic", limit=12)
    config = NoiseConfig(seed=3)
    first, again = noisy_cases(cases, config), noisy_cases(cases, config)
    assert [f.text for f in first[0].record.fragments] == [f.text for f in again[0].record.fragments]
    other_seed = noisy_cases(cases, NoiseConfig(seed=4))
    assert [f.text for f in other_seed[0].record.fragments] != [f.text for f in first[0].record.fragments]
    for clean, noisy in zip(cases, first, strict=True):
        signal = {f.id: f for f in clean.record.fragments}
        noise = [f for f in noisy.record.fragments if f.id not in signal]
        assert len(noise) == 12 * len(signal)
        assert all(noisy.record.fragments[i] for i in range(len(noisy.record.fragments)))
        assert {f.id: f for f in noisy.record.fragments if f.id in signal} == signal
        assert all(f.timestamp is not None and f.timestamp < ENCOUNTER for f in noise)
        own = {f.text for f in clean.record.fragments}
        assert not own & {f.text for f in noise}
        assert noisy.gold_tiers == clean.gold_tiers
    fillers = {filler_line(random.Random(i)) for i in range(200)}
    all_noise = [f.text for c, n in zip(cases, first, strict=True) for f in n.record.fragments
                 if f.source == "noise"]
    filler_share = sum(text in fillers or _is_filler(text) for text in all_noise) / len(all_noise)
    assert 0.33 < filler_share < 0.47


def _is_filler(text: str) -> bool:
    markers = ("Patient", "Routine", "Appointment", "Nursing", "Insurance", "Discharge", "Telephone", "Meal",
               "Transport", "Chart", "Pharmacy", "Social work", "Interpreter", "Follow-up letter", "Bed linen",
               "Clinic reminder", "Parking")
    return text.startswith(markers)


def test_noise_sweep_prefixes_share_texts_and_recent_share_dates_noise_on_the_day(shared_data: Path) -> None:
    cases = load_cases("medqa", shared_data / "mirage", limit=5)
    small = inject_noise(cases[0], cases, NoiseConfig(count=20, order="time"))
    large = inject_noise(cases[0], cases, NoiseConfig(count=200, order="time"))
    texts = Counter(f.text for f in large.record.fragments)
    assert all(texts[f.text] for f in small.record.fragments)
    recent = inject_noise(cases[0], cases, NoiseConfig(count=200, recent_share=1.0, order="time"))
    stamps = [f.timestamp for f in recent.record.fragments if f.source == "noise"]
    assert all(s is not None and abs((s - ENCOUNTER).total_seconds()) <= 86400 for s in stamps)
    assert [f.timestamp for f in recent.record.fragments] == sorted(f.timestamp for f in recent.record.fragments
                                                                    if f.timestamp)
    with pytest.raises(ValueError, match="sum to <= 1"):
        NoiseConfig(filler_share=0.8, other_case_share=0.4)
