"""Generation metrics on real `ask` results: offline approximations, a model judge (the fake server on 127.0.0.1),
and the fallback when the judge's replies cannot be used."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ebmrag.answer.engine import Engine
from ebmrag.demo import load_patient
from ebmrag.errors import EbmragError
from ebmrag.eval.generation import GenerationJudge, evaluate_generation, load_questions, markdown, summary
from ebmrag.llm.openai import OpenAIChatClient
from tests.engines import engine_from_parts
from tests.fake_openai import FakeOpenAI, serve

pytestmark = pytest.mark.model
QUESTION = "Which antibiotic is safe for his wound infection, given his allergy and kidney function?"
IN_RECORD = "He had anaphylaxis to penicillin. His creatinine is 2.8 mg/dL."
NOT_IN_RECORD = "He takes allopurinol 300 mg daily for gout. His HbA1c is 9.4 percent."


@pytest.fixture(scope="module")
def engine(resources: Any, context_packer: Any, demo_voter: Any) -> Engine:
    return engine_from_parts(resources, packer=context_packer, voter=demo_voter)


def test_offline_scores_follow_what_the_context_holds(engine: Engine) -> None:
    result = engine.ask(QUESTION, load_patient("demo-colon"), 900)
    judge = GenerationJudge(engine, embedder=engine.packer.embedder)
    held, missing = judge.run(result, IN_RECORD), judge.run(result, NOT_IN_RECORD)
    assert held["faithfulness"].value == 1.0 and held["faithfulness"].method == "offline"  # a brief of copies
    assert held["context_recall"].value == 1.0 and missing["context_recall"].value == 0.0
    assert 0.3 < held["answer_relevancy"].value <= 1.0  # type: ignore[operator]
    assert 0.0 < held["context_relevancy"].value <= 1.0  # type: ignore[operator]
    assert judge.run(result)["context_recall"].value is None  # no reference, nothing to recall


def verdicts(request: dict[str, Any]) -> str:
    """A judge that rates 0.75 and calls every odd-numbered item supported, every even one not."""
    prompt = request["messages"][-1]["content"]
    if '"score"' in prompt:
        return '{"score": 0.75}'
    count = len(re.findall(r"^\d+\. ", prompt.rsplit(":\n", 1)[-1], re.MULTILINE))
    return json.dumps({"supported": [n % 2 == 1 for n in range(1, count + 1)]})


def test_a_model_judge_scores_and_a_broken_one_falls_back(engine: Engine) -> None:
    result = engine.ask(QUESTION, load_patient("demo-colon"), 900)
    with serve(FakeOpenAI(default=verdicts)) as url:
        judged = GenerationJudge(engine, OpenAIChatClient(url, "judge", max_retries=0),
                                 embedder=engine.packer.embedder).run(result, IN_RECORD)
    assert all(s.method == "model" for s in judged.values())
    assert judged["answer_relevancy"].value == 0.75
    assert judged["context_recall"].value == 0.5  # 2 reference sentences, the first supported
    lines = len(result.items)
    assert judged["context_relevancy"].value == pytest.approx(((lines + 1) // 2) / lines)
    with serve(FakeOpenAI(default=("text", "I think it is fine."))) as url:
        broken = GenerationJudge(engine, OpenAIChatClient(url, "judge", max_retries=0),
                                 embedder=engine.packer.embedder).run(result, IN_RECORD)
    assert all(s.method.startswith("offline (model failed") for s in broken.values())
    assert broken["context_recall"].value == 1.0  # the offline value, not a guess


def test_questions_file_rows_summary_and_errors(tmp_path: Path, engine: Engine) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": QUESTION, "patient": "demo-colon",
                                "reference": IN_RECORD, "window": 900}) + "\n"
                    + json.dumps({"question": "What does the record say about chest pain?",
                                  "patient": "demo-chest"}) + "\n")
    rows = evaluate_generation(engine, GenerationJudge(engine, embedder=engine.packer.embedder), load_questions(path))
    total = summary(rows)
    assert total["questions"] == 2 and total["context_recall"]["measured"] == 1
    assert total["faithfulness"]["method"] == "offline" and "mean of 2" in markdown(rows)
    assert rows[1].question_id == "2"
    (tmp_path / "bad.jsonl").write_text('{"question": "no patient"}\n')
    with pytest.raises(EbmragError, match=r"bad\.jsonl:1"):
        load_questions(tmp_path / "bad.jsonl")
