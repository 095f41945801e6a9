"""The composition root: one place builds components, flags are settings, and nothing reaches through a component
for the models it holds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from ebmrag.compose import Resources, build_engine_from, engine_from_dict, load_patient
from ebmrag.config import Settings, with_overrides
from ebmrag.errors import ConfigError
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from tests.fake_openai import FakeOpenAI, serve
from tests.serve.conftest import serving

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "src" / "ebmrag").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py")),
           *sorted((ROOT / "examples").glob("*.py"))]
# A component's models are the composition root's to hand out: reaching through one component for another's
# (`engine.packer.embedder`, `voter.retriever.kb`) couples every caller to how that component is built.
REACH_THROUGH = re.compile(r"\.packer\.(embedder|classifier|token_counter|builder|questions)\b|"
                           r"\bvoter\.retriever\b|engine\(\)\.(packer|voter)\b|\.builder\.compressor\b")
# Heavy parts are built by the root (compose/) only; a component may copy itself (`with_params`, `with_retrieval`).
CONSTRUCTORS = re.compile(r"\b(ContextPacker|DocumentVoter|Engine|OpenAIChatClient|LlamaCppChatClient|QueryRewriter|"
                          r"GroundingChecker|CrossEncoderReranker)\(")
OWN_COPIES = {"packing/packer.py": "ContextPacker(", "answer/engine.py": "Engine(",
              "retrieve/rerank.py": "CrossEncoderReranker("}  # from_dict


def offending(pattern: re.Pattern[str], allowed: dict[str, str] | None = None) -> list[str]:
    found = []
    for path in SOURCES:
        relative = path.relative_to(ROOT / "src" / "ebmrag") if "src" in path.parts else path.relative_to(ROOT)
        if str(relative).startswith("compose/"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            match = pattern.search(code)
            if match and not code.lstrip().startswith(("class ", "def ", '"', "`")) and \
                    (allowed or {}).get(str(relative)) != match.group(0):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_reach_through_a_component_outside_the_root() -> None:
    assert not offending(REACH_THROUGH), "\n".join(offending(REACH_THROUGH))


def test_components_are_constructed_only_by_the_root() -> None:
    found = offending(CONSTRUCTORS, OWN_COPIES)
    assert not found, "built outside compose/:\n" + "\n".join(found)


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    """A test of the greps: the patterns match the shapes the issue found."""
    assert REACH_THROUGH.search("x = engine.packer.embedder.embed(t)")
    assert REACH_THROUGH.search("kb = service.engine().voter.retriever.kb")
    assert REACH_THROUGH.search("c = engine.packer.builder.compressor")
    assert not REACH_THROUGH.search("packer.run(record, q, 256)")
    assert CONSTRUCTORS.search("engine = Engine(params, packer=p)") and not CONSTRUCTORS.search("build_engine(s)")


def test_flags_are_settings_applied_once() -> None:
    settings = with_overrides(Settings(), llm={"backend": "openai", "base_url": None, "model": "m"},
                              answer={"window": 900, "retrieval": None})
    assert settings.llm.model == "m" and settings.llm.base_url == "" and settings.answer.window == 900
    assert settings.answer.retrieval == "auto"
    split = with_overrides(Settings(), kb={"workers": 2, "chunker": "fixed"})  # [kb]: what it is and how it is stored
    assert split.storage.workers == 2 and split.kb.chunker == "fixed"
    with pytest.raises(ConfigError, match=r"\[packing\]: unknown packing strategy"):
        with_overrides(Settings(), packing={"strategy": "random"})
    with pytest.raises(ValueError, match="needs --base-url and --model"):
        Resources(settings).chat_client  # noqa: B018 - building it is the test


def test_resources_are_shared_and_the_engine_round_trips(demo_voter: Any) -> None:
    kb = demo_voter.retriever.kb
    resources = Resources(Settings(), kb)
    engine = build_engine_from(resources)
    assert resources.shares_embedder and engine.shares_embedder and engine.packer.embedder is kb.embedder
    rebuilt = engine_from_dict(json.loads(json.dumps(engine.to_dict())))
    assert rebuilt.to_dict()["settings"] == engine.to_dict()["settings"]
    assert rebuilt.voter is not None and str(rebuilt.voter.retriever.kb.root) == str(kb.root)


@pytest.mark.integration
def test_an_http_ask_that_sets_retrieval_keeps_the_query_rewriter(tmp_path: Path, demo_voter: Any) -> None:
    """The service's engine variant for another retrieval mode shares every part, the rewriter too: the model's
    rewording votes in an HTTP ask with "retrieval": "always"."""
    def rewording(request: dict[str, Any]) -> str:
        return json.dumps({"queries": ["penicillin anaphylaxis alternative antibiotic"]})

    store = SQLiteStore(tmp_path / "store.sqlite")
    with serve(FakeOpenAI(default=rewording)) as url:
        settings = with_overrides(Settings(), llm={"backend": "openai", "base_url": url, "model": "tiny",
                                                   "max_retries": 0},
                                  retrieval={"query_variants": 1}, answer={"retrieval": "never"})
        resources = Resources(settings, demo_voter.retriever.kb)
        engine = build_engine_from(resources)
        assert engine.rewriter is not None
        app = create_app(store, settings, engine, resources)
        record = load_patient("demo-colon")
        key = create_key(store, "t", "service")[0]
        with serving(app) as (base, _), httpx.Client(base_url=base, timeout=60,
                                                    headers={"Authorization": f"Bearer {key}"}) as http:
            http.put("/v1/patients/p1", json={"patient_id": "p1", "fragments": [
                {"id": f.id, "text": f.text, "section": f.section} for f in record.fragments]})
            answered = http.post("/v1/patients/p1/ask", json={"question": "Which antibiotic now?",
                                                              "retrieval": "always", "window": 6000})
    assert answered.status_code == 200, answered.text
    queries = answered.json()["trace"]["retrieval"]["queries"]
    assert "penicillin anaphylaxis alternative antibiotic" in queries
