"""Query expansion and HyDE against the fake OpenAI server on 127.0.0.1, through the real retriever, `ask` and the
`search` command."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.answer.params import AnswerParams
from ebmrag.cli import app
from ebmrag.compose import engine_from_dict
from ebmrag.demo import load_patient
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.retrieve.query_rewrite import QueryExpander, QueryRewriter
from ebmrag.retrieve.search import HybridRetriever
from tests.engines import engine_from_parts, rrf_retriever
from tests.fake_openai import FakeOpenAI, serve

pytestmark = pytest.mark.model
VAGUE = "what should I know about my heart medicine"


def client(url: str) -> OpenAIChatClient:
    return OpenAIChatClient(url, "rewriter", max_retries=0, breaker_seconds=0)


def test_expansion_keeps_new_rewordings_and_a_bad_reply_is_a_fault() -> None:
    reply = json.dumps({"queries": ["penicillin allergy cross-reactivity", VAGUE, "beta-lactam allergy", "x", "y"]})
    with serve(FakeOpenAI(default=("text", reply))) as url:
        assert QueryExpander(client(url), 2).run(VAGUE).variants == ("penicillin allergy cross-reactivity",
                                                                     "beta-lactam allergy")
    with serve(FakeOpenAI(default=("text", "no json here"))) as url:
        failed = QueryRewriter(client(url), 2, hyde=True).run(VAGUE)
    assert failed.variants == () and failed.hypothesis == ""
    assert "query expansion failed" in failed.fault and "HyDE failed" in failed.fault
    with pytest.raises(ValueError, match="1 to 8"):
        QueryExpander(client("http://127.0.0.1:9/v1"), 0)


def test_variants_and_a_hypothesis_move_the_ranking(demo_voter: Any) -> None:
    retriever: HybridRetriever = demo_voter.retriever
    plain = [h.doc_id for h in retriever.run(VAGUE, k=3)]
    assert "penicillin-allergy-review" not in plain
    expanded = [h.doc_id for h in retriever.run(VAGUE, k=3, variants=["penicillin allergy beta-lactam "
                                                                      "cross-reactivity cephalosporin"])]
    assert "penicillin-allergy-review" in expanded
    passage = ("A rise in creatinine of 0.3 mg/dL within 48 hours defines acute kidney injury; stop nephrotoxic "
               "drugs and review fluid balance.")
    dense = rrf_retriever(retriever.kb, "dense")
    assert dense.run("what is wrong with my blood test", k=1, hypothesis=passage)[0].doc_id == "aki-management"


def test_ask_votes_with_the_rewordings_and_records_a_failure(resources: Any, context_packer: Any,
                                                             demo_voter: Any) -> None:
    def rewriter_reply(request: dict[str, Any]) -> str:
        prompt = request["messages"][-1]["content"]
        if '"queries"' in prompt:
            return json.dumps({"queries": ["penicillin anaphylaxis which antibiotic"]})
        return json.dumps({"passage": "Patients with penicillin anaphylaxis can receive aztreonam."})

    record = load_patient("demo-colon")
    with serve(FakeOpenAI(default=rewriter_reply)) as url:
        engine = engine_from_parts(resources, packer=context_packer, voter=demo_voter,
                                   rewriter=QueryRewriter(client(url), 1, hyde=True))
        result = engine.ask("Which antibiotic now?", record, 900)
        assert engine_from_dict(engine.to_dict()).rewriter is None  # no client in the dict: nothing to call
    queries = result.retrieval.queries
    assert queries[:3] == ("Which antibiotic now?", "penicillin anaphylaxis which antibiotic",
                           "Patients with penicillin anaphylaxis can receive aztreonam.")
    fake = FakeOpenAI(default=rewriter_reply)  # redacting (as for a remote endpoint): identifiers never reach it
    with serve(fake) as url:
        engine = engine_from_parts(resources, AnswerParams(redact="always"), packer=context_packer, voter=demo_voter,
                                   rewriter=QueryRewriter(client(url), 1))
        engine.ask("Which antibiotic now for MRN12345678, phone 555-123-4567?", record, 900)
    sent = json.dumps(fake.requests)
    assert "MRN12345678" not in sent and "555-123-4567" not in sent and re.search(r"\[[A-Z_]+-1\]", sent)
    with serve(FakeOpenAI(default=("text", "sorry"))) as url:
        engine = engine_from_parts(resources, packer=context_packer, voter=demo_voter,
                                   rewriter=QueryRewriter(client(url), 1))
        failed = engine.ask("Which antibiotic now?", record, 900)
    assert "query expansion failed" in failed.retrieval.reason and failed.answer


def test_search_command_needs_a_model_for_expansion(demo_voter: Any) -> None:
    kb = str(demo_voter.retriever.kb.root)
    result = CliRunner().invoke(app, ["search", "penicillin", "--kb", kb, "--expand", "2"])
    assert result.exit_code == 2 and "need a model" in result.output
    asked = CliRunner().invoke(app, ["ask", "Which antibiotic?", "--patient", "demo-colon", "--kb", kb, "--hyde"])
    assert asked.exit_code == 2 and "need a model" in asked.output
