from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ebmrag.ddx.engine import DifferentialDiagnoser
from ebmrag.ddx.findings import FindingMapper
from ebmrag.ddx.knowledge import load_kb
from ebmrag.demo import demo_record_path
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.records.loaders import load_record
from ebmrag.research.agent import ResearchAgent
from ebmrag.research.memory import ObservationMemory
from ebmrag.research.params import default_authority
from ebmrag.research.tools import (
    DdxTool,
    Icd10LookupTool,
    KbSearchTool,
    PatientRecordTool,
    ReadDocumentTool,
    Tool,
)


@pytest.fixture(scope="session")
def research_tools(context_packer: Any, tiering: Any, demo_voter: Any, embedder: Any, extractor: Any) -> list[Tool]:
    """Every tool on the real demo knowledge base, the bundled DDXPlus engine and the demo chest-pain record."""
    retriever = demo_voter.retriever
    diagnoser = DifferentialDiagnoser(load_kb())
    record = tiering.run(load_record(demo_record_path("demo-chest")))
    return [KbSearchTool(retriever, default_authority()), ReadDocumentTool(retriever.kb, context_packer.token_counter),
            DdxTool(diagnoser, FindingMapper(diagnoser.kb, embedder, extractor=extractor)), Icd10LookupTool(),
            PatientRecordTool(context_packer, record)]


@pytest.fixture
def make_agent(research_tools: list[Tool], resources: Any, context_packer: Any,
               tiering: Any) -> Callable[..., ResearchAgent]:
    def build(base_url: str, window: int = 8192, reserve: int = 512, **options: Any) -> ResearchAgent:
        client = OpenAIChatClient(base_url, "fake", max_retries=0, breaker_seconds=0)
        memory = ObservationMemory(context_packer, tiering, window, reserve, token_counter=resources.token_counter)
        return ResearchAgent(client, research_tools, memory, **options)

    return build
