from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ebmrag.agent.engine import Engine
from ebmrag.config import AnswerSettings
from ebmrag.demo import DEMO_CORPUS
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.search import HybridRetriever
from ebmrag.index.sync import ingest_paths
from ebmrag.index.vote import DocumentVoter


@pytest.fixture(scope="session")
def demo_voter(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> DocumentVoter:
    """The bundled demo corpus in a real knowledge base on disk, searched hybrid as `ask` does by default."""
    kb = KnowledgeBase(tmp_path_factory.mktemp("demo-kb") / "kb", embedder=embedder)
    report = ingest_paths(kb, [Path(DEMO_CORPUS)])
    assert not report.errors and report.chunks_written >= 18
    return DocumentVoter(HybridRetriever(kb, "hybrid", "score", (0.3, 0.7)))


@pytest.fixture
def make_engine(context_packer: Any, demo_voter: DocumentVoter) -> Callable[..., Engine]:
    def build(client: Any = None, **options: Any) -> Engine:
        return Engine(context_packer, demo_voter, client, answer=AnswerSettings(**options))

    return build
