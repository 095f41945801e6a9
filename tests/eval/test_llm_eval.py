from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.eval.diagnosis import IcdIndex, diagnosis_lines, set_scores
from ebmrag.eval.llm_eval import diagnosis_f1, mirage_accuracy, parse_choice
from ebmrag.index.kb import KnowledgeBase
from ebmrag.ingest.documents import Document
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.utility import UtilityParams
from ebmrag.records.fragment import Tier
from ebmrag.retrieve.search import HybridRetriever
from tests.eval.helpers import measured, prepared_case
from tests.fake_openai import FakeOpenAI, serve

ICD = IcdIndex([("C81", "Hodgkin lymphoma"), ("A15", "Respiratory tuberculosis"), ("K35", "Acute appendicitis"),
                ("K40", "腹股沟疝")])


def _user(request: dict[str, Any]) -> str:
    return str(request["messages"][-1]["content"])


def test_choice_parsing_and_diagnosis_lines() -> None:
    assert parse_choice("B", ["A", "B"]) == "B"
    assert parse_choice("The answer is (C).", ["A", "B", "C"]) == "C"
    assert parse_choice("I cannot tell", ["A", "B"]) is None
    assert diagnosis_lines("1. Hodgkin lymphoma - most likely\n2) Tuberculosis: possible\n\n- **Sarcoidosis**") == [
        "Hodgkin lymphoma", "Tuberculosis", "Sarcoidosis"]


def test_set_scores_normalize_through_icd_names() -> None:
    scored = set_scores(["Hodgkin's lymphoma", "Pulmonary tuberculosis"], ["Hodgkin Lymphoma"], ICD)
    assert (scored.precision, scored.recall) == (0.5, 1.0) and scored.f1 == pytest.approx(2 / 3)
    assert set_scores(["腹股沟斜疝"], ["腹股沟疝"], ICD).f1 == 1.0
    assert set_scores([], ["Hodgkin lymphoma"], ICD).f1 == 0.0


def test_mirage_accuracy_with_and_without_retrieval(tmp_path: Path, embedder: Any) -> None:
    benchmark = tmp_path / "benchmark.json"
    items = {str(i): {"question": f"Which drug treats condition {i}?", "options": {"A": "x", "B": "y"},
                      "answer": "B"} for i in range(4)}
    benchmark.write_text(json.dumps({"medqa": items}))
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    kb.apply([Document("guide", "Condition treatment: the drug y treats every numbered condition.", "g", "txt")])

    def answer(request: dict[str, Any]) -> str:  # right only when given retrieved context
        return "B" if "Context:" in _user(request) else "A"

    with serve(FakeOpenAI(answer)) as url:
        client = OpenAIChatClient(url, "tiny", cache_dir=tmp_path / "cache")
        rows = mirage_accuracy(client, benchmark, ["medqa"], retriever=HybridRetriever(kb), k=1)
    assert [(r.setting, r.accuracy, r.questions) for r in rows] == [("no retrieval", 0.0, 4), ("retrieval", 100.0, 4)]


def test_diagnosis_f1_averages_set_scores_and_survives_failures(tmp_path: Path) -> None:
    items = [measured("lab", Tier.T2, "Biopsy shows Reed-Sternberg cells.", 12),
             measured("chat", Tier.T4, "Night sweats for a month.", 8)]
    toy = prepared_case(items, {"lab": Tier.T2, "chat": Tier.T4})
    cases = [replace(toy, case=replace(toy.case, answer="Hodgkin lymphoma"))]
    fake = FakeOpenAI(("text", "1. Hodgkin lymphoma\n2. Tuberculosis"))
    with serve(fake) as url:
        client = OpenAIChatClient(url, "tiny", max_retries=0)
        row = diagnosis_f1(client, cases, [ExactPacker()], [64], UtilityParams(), ICD)[0]
        assert (row.precision, row.recall, row.failed) == (50.0, 100.0, 0)
        assert "Reed-Sternberg" in _user(fake.requests[0])
        fake.script = [("status", 400)]
        failed = diagnosis_f1(client, cases, [ExactPacker()], [64], UtilityParams(), ICD)[0]
        assert (failed.f1, failed.failed) == (0.0, 1)


@pytest.mark.slow
def test_eval_packing_with_an_llm_caches_and_reports_spend(shared_data: Path, tmp_path: Path) -> None:
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n')
    fake = FakeOpenAI(("text", "A"))
    with serve(fake) as url:
        args = ["eval", "packing", "--dataset", "medqa", "--data-dir", str(shared_data / "mirage"), "--limit", "3",
                "--windows", "256", "--strategies", "fifo,ebm-exact", "--out", str(tmp_path / "out"), "--llm",
                "openai", "--model", "tiny", "--base-url", url, "--config", str(config)]
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        usage = json.loads((tmp_path / "out" / "llm_usage.json").read_text())
        assert usage["calls"] == 3 * 3 and usage["cache_hits"] == 0  # clean vignette + 2 strategies, 3 cases
        rows = json.loads((tmp_path / "out" / "llm_results.json").read_text())
        assert [r["setting"] for r in rows] == ["clean vignette", "fifo", "ebm-exact"]
        assert all(r["apr"] is None or r["apr"] == pytest.approx(r["accuracy"] / rows[0]["accuracy"])
                   for r in rows[1:])
        again = CliRunner().invoke(app, args)
        assert again.exit_code == 0 and len(fake.requests) == 9
        assert json.loads((tmp_path / "out" / "llm_usage.json").read_text())["cache_hits"] == 9
    no_url = CliRunner().invoke(app, ["eval", "packing", "--dataset", "medqa", "--data-dir", str(tmp_path),
                                      "--out", str(tmp_path / "o"), "--llm", "openai"])
    assert no_url.exit_code == 2 and "--base-url" in no_url.output
