"""Settings -> pipeline parts. The CLI and `Engine.from_config` build everything through these functions,
so a TOML file means the same thing on every path."""

from __future__ import annotations

from pathlib import Path

from ebmrag.config import Settings
from ebmrag.evidence.embeddings import default_cache_dir
from ebmrag.generate.llm import OpenAIChatClient
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.rerank import CrossEncoderReranker, DocumentVoter
from ebmrag.index.search import HybridRetriever
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.utility import TierWeights, UtilityParams


def cache_dir(settings: Settings) -> Path:
    return Path(settings.models.cache_dir) if settings.models.cache_dir else default_cache_dir()


def build_packer(settings: Settings, strategy: str | None = None, k_min: int | None = None) -> ContextPacker:
    p, m = settings.packing, settings.models
    params = UtilityParams(TierWeights(p.alpha, p.beta, p.gamma), p.decay_lambda, p.epsilon, p.similarity_floor)
    return ContextPacker(strategy or p.strategy, k_min if k_min is not None else p.k_min, params, m.tokenizer,
                         m.embedding_model or None, m.cache_dir or None, m.tier_rules or None)


def open_kb(settings: Settings, kb: Path) -> KnowledgeBase:
    """The configured [kb] settings apply when the knowledge base is created; afterwards its manifest rules."""
    return KnowledgeBase(kb, settings.kb if not (kb / "CURRENT").exists() else None, cache_dir=cache_dir(settings))


def make_retriever(settings: Settings, kb: KnowledgeBase, mode: str | None = None,
                   rerank_model: str | None = None) -> HybridRetriever:
    r = settings.retrieval
    model = rerank_model if rerank_model is not None else r.rerank_model
    reranker = CrossEncoderReranker(model) if model else None
    return HybridRetriever(kb, mode or r.mode, r.fusion, (r.bm25_weight, r.dense_weight), r.route_depth, r.rrf_k,
                           reranker)


def make_voter(settings: Settings, retriever: HybridRetriever) -> DocumentVoter:
    r = settings.retrieval
    return DocumentVoter(retriever, r.vote_chunks, r.vote_documents, r.vote_min_score)


def make_llm_client(settings: Settings, llm: str | None = None, model: str | None = None,
                    base_url: str | None = None) -> OpenAIChatClient | None:
    """The flags override the [llm] table; None when no model is asked for (the offline default)."""
    backend = llm or settings.llm.backend
    if backend == "extractive":
        return None
    if backend != "openai":
        raise ValueError(f"--llm must be 'openai' or 'extractive', got {backend!r}")
    s = settings.llm
    url, name = base_url or s.base_url, model or s.model
    if not url or not name:
        raise ValueError("--llm openai needs --base-url and --model (or [llm] base_url and model)")
    return OpenAIChatClient(url, name, s.api_key or None, s.timeout, s.max_retries, cache_dir=cache_dir(settings))


def require_llm_client(settings: Settings, llm: str | None, model: str | None, base_url: str | None,
                       purpose: str) -> OpenAIChatClient:
    """For commands that cannot run offline: the client, or an error saying which flags are missing."""
    client = make_llm_client(settings, llm or "openai", model, base_url)
    if client is None:
        raise ValueError(f"{purpose} needs a model: --llm openai --base-url URL --model NAME")
    return client
