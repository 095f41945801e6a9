"""Building the engine: `compose.build_engine`, flags as settings, the dict round trip, one shared embedder."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ebmrag.answer.engine import Engine
from ebmrag.answer.gate import Label
from ebmrag.answer.gate_model import AnnotatedSentence, ClassifierLabeller, train_classifier
from ebmrag.compose import build_engine, engine_from_dict
from ebmrag.config import load_settings, with_overrides
from ebmrag.demo import demo_record_path
from ebmrag.records.loaders import load_record
from ebmrag.retrieve.vote import DocumentVoter

QUESTION = "Which antibiotic is safe for his wound infection, given his allergy and kidney function?"
DECISIVE = ["Culture grew MRSA sensitive to vancomycin.", "eGFR fell to 28 mL/min.", "Chest CT shows a cavity.",
            "Potassium is 6.1 mmol/L.", "Frozen section confirms melanoma.", "Lipase is 900 U/L."]
IDLE = ["He watches football on Sundays.", "The ward cat was mentioned.", "Lunch was late today.",
        "She prefers the window bed.", "A nephew phoned the desk.", "The TV remote was replaced."]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, demo_voter: DocumentVoter, embedder: Any) -> Path:
    """A settings file with a trained gate classifier and the demo KB of the agent tests."""
    root = tmp_path_factory.mktemp("engine-build")
    rows = [AnnotatedSentence("c", t, Label.A, 1) for t in DECISIVE] + [
        AnnotatedSentence("c", t, Label.C, 1) for t in IDLE]
    train_classifier(rows, embedder, root / "gate.npz")
    path = root / "ebmrag.toml"
    path.write_text(f'[models]\ncache_dir = "{root / "cache"}"\n[answer]\nretrieval = "always"\nwindow = 900\n'
                    f'gate_model = "{root / "gate.npz"}"\n', encoding="utf-8")
    return path


def kb_root(voter: DocumentVoter) -> Path:
    return voter.retriever.kb.root


def comparable(engine: Engine) -> dict[str, Any]:
    path = demo_record_path("demo-colon")
    assert path is not None
    result = engine.ask(QUESTION, load_record(path)).to_json()
    del result["trace"]["timings_ms"]
    return result


def test_one_embedder_serves_packer_gate_grounding_and_knowledge_base(config: Path,
                                                                      demo_voter: DocumentVoter) -> None:
    engine = build_engine(load_settings(config), kb=kb_root(demo_voter))
    model = engine.packer.embedder
    assert engine.shares_embedder and engine.voter is not None
    assert engine.voter.embedder is model and engine.grounding.embedder is model
    assert isinstance(engine.gate.labeller, ClassifierLabeller) and engine.gate.labeller.embedder is model


@pytest.mark.slow
def test_the_engine_round_trips_through_its_dict_with_a_trained_gate(config: Path,
                                                                      demo_voter: DocumentVoter) -> None:
    engine = build_engine(load_settings(config), kb=kb_root(demo_voter))
    data = json.loads(json.dumps(engine.to_dict()))  # plain JSON, as a service would store it
    assert data["gate"]["labeller"] == {"type": "classifier", "path": str(config.parent / "gate.npz")}
    rebuilt = engine_from_dict(data)
    assert rebuilt.to_dict() == engine.to_dict()
    assert rebuilt.shares_embedder and isinstance(rebuilt.gate.labeller, ClassifierLabeller)
    assert comparable(rebuilt) == comparable(engine)


def test_from_config_is_build_engine(config: Path, demo_voter: DocumentVoter) -> None:
    settings = load_settings(config)
    by_path = build_engine(with_overrides(settings, answer={"window": 1200}), kb_root(demo_voter))
    by_factory = build_engine(replace(settings, answer=replace(settings.answer, window=1200)), kb_root(demo_voter))
    assert by_path.to_dict() == by_factory.to_dict() and by_path.settings.window == 1200
