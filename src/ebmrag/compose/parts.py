"""Settings -> the parts of the answer pipeline, one function per part. `factory` (the public entry for the
CLI, the service and the gateway) and `Engine.from_config` both build through these, so a TOML file
means the same thing on every path.

One embedder instance is shared by the packer, the gate, grounding and the knowledge base when the
packer would load the same model at the knowledge base's profile (see `shared_embedder`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ebmrag.answer.gate import GateParams, RetrievalGate, RuleLabeller
from ebmrag.answer.gate_model import ClassifierLabeller
from ebmrag.config import Settings
from ebmrag.demo import ensure_demo_kb
from ebmrag.models.embeddings import SentenceEmbedder, default_cache_dir
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.llm.local import LlamaCppChatClient
from ebmrag.retrieve.query_rewrite import QueryRewriter
from ebmrag.index.backend import KnowledgeStore, open_knowledge_base
from ebmrag.retrieve.rerank import CrossEncoderReranker
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.retrieve.vote import DocumentVoter
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.prefilter import Prefilter
from ebmrag.packing.utility import TierWeights, UtilityParams
from ebmrag.protocols import ChatClient


def cache_dir(settings: Settings) -> Path:
    return Path(settings.models.cache_dir) if settings.models.cache_dir else default_cache_dir()


def utility_params(settings: Settings) -> UtilityParams:
    p = settings.packing
    return UtilityParams(TierWeights(p.alpha, p.beta, p.gamma), p.decay_lambda, p.epsilon, p.similarity_floor,
                         p.encounter_window_hours)


def build_packer(settings: Settings, strategy: str | None = None, k_min: int | None = None,
                 embedder: SentenceEmbedder | None = None, objective: str | None = None) -> ContextPacker:
    p, m = settings.packing, settings.models
    if objective not in (None, "critical", "paper"):
        raise ValueError(f"--objective must be 'critical' or 'paper', got {objective!r}")
    name = strategy or p.strategy
    if name == "ebm-exact" and (objective or p.objective) == "paper":
        name = "ebm-exact-paper"
    prefilter = Prefilter(p.prefilter_windows, p.prefilter_min_fragments) if p.prefilter_windows else None
    return ContextPacker(name, k_min if k_min is not None else p.k_min, utility_params(settings),
                         m.tokenizer, m.embedding_model or None, str(cache_dir(settings)), m.tier_rules or None,
                         embedder, m.tier_model, prefilter)


def open_kb(settings: Settings, kb: Path) -> KnowledgeStore:
    """The configured backend; [kb] build settings apply when the knowledge base is created, afterwards its
    manifest rules."""
    return open_knowledge_base(settings, kb, cache_dir(settings))


def make_retriever(settings: Settings, kb: KnowledgeStore, mode: str | None = None,
                   rerank_model: str | None = None) -> HybridRetriever:
    r = settings.retrieval
    model = rerank_model if rerank_model is not None else r.rerank_model
    reranker = CrossEncoderReranker(model, max_length=r.rerank_max_tokens, depth=r.rerank_depth,
                                    mix=r.rerank_mix) if model else None
    return HybridRetriever(kb, mode or r.mode, r.fusion, (r.bm25_weight, r.dense_weight), r.route_depth, r.rrf_k,
                           reranker, r.focus_weight)


def make_voter(settings: Settings, retriever: HybridRetriever) -> DocumentVoter:
    r = settings.retrieval
    return DocumentVoter(retriever, r.vote_chunks, r.vote_documents, r.vote_min_score)


def make_llm_client(settings: Settings, llm: str | None = None, model: str | None = None,
                    base_url: str | None = None) -> OpenAIChatClient | None:
    """The flags override the [llm] table; None when no model is asked for (the offline default)."""
    backend = llm or settings.llm.backend
    if backend == "extractive":
        return None
    if backend == "local":
        raise ValueError("this command needs an OpenAI-compatible endpoint (--llm openai); the local backend "
                         "answers `ask` and `eval generation`")
    if backend != "openai":
        raise ValueError(f"--llm must be 'openai', 'local' or 'extractive', got {backend!r}")
    s = settings.llm
    url, name = base_url or s.base_url, model or s.model
    if not url or not name:
        raise ValueError("--llm openai needs --base-url and --model (or [llm] base_url and model)")
    return OpenAIChatClient(url, name, s.api_key or None, s.timeout, s.max_retries, cache_dir=cache_dir(settings))


def make_chat_client(settings: Settings, llm: str | None = None, model: str | None = None,
                     base_url: str | None = None, model_path: str | None = None) -> ChatClient | None:
    """The answering model: an OpenAI-compatible endpoint, a local GGUF file (`--llm local --model-path`), or
    None (the offline brief)."""
    if (llm or settings.llm.backend) != "local":
        return make_llm_client(settings, llm, model, base_url)
    path = model_path or settings.llm.model_path
    if not path:
        raise ValueError("--llm local needs --model-path FILE.gguf (or [llm] model_path)")
    return LlamaCppChatClient(path, settings.llm.context_tokens)


def require_llm_client(settings: Settings, llm: str | None, model: str | None, base_url: str | None,
                       purpose: str) -> OpenAIChatClient:
    """For commands that cannot run offline: the client, or an error saying which flags are missing."""
    client = make_llm_client(settings, llm or "openai", model, base_url)
    if client is None:
        raise ValueError(f"{purpose} needs a model: --llm openai --base-url URL --model NAME")
    return client


def shared_embedder(settings: Settings, kb: KnowledgeStore | None) -> SentenceEmbedder | None:
    """The knowledge base's embedder when the packer is configured with the same model, else None.

    The packer then embeds at the knowledge base's length (128 word pieces by default, against the
    model's own 256): similarities of fragments longer than that change slightly; measured in
    docs/results/shared_embedder.md before this was adopted."""
    if kb is None or (settings.models.embedding_model or "") != (kb.config.embedding_model or ""):
        return None
    return kb.embedder


def build_gate(settings: Settings, packer: ContextPacker) -> RetrievalGate:
    a = settings.answer
    labeller = (ClassifierLabeller(a.gate_model, packer.embedder) if a.gate_model
                else RuleLabeller(packer.classifier))
    return RetrievalGate(labeller, GateParams(a.gate_alpha, a.gate_beta, a.gate_gamma, a.gate_theta1, a.gate_theta2))


def engine_parts(settings: Settings, *, kb: str | Path | None = None, llm: str | None = None,
                 base_url: str | None = None, model: str | None = None, window: int | None = None,
                 retrieval: str | None = None, model_path: str | None = None) -> dict[str, Any]:
    """Keyword arguments of `Engine`: without `kb`, the bundled demo knowledge base (built on first use)."""
    answer = replace(settings.answer, window=window if window is not None else settings.answer.window,
                     retrieval=retrieval or settings.answer.retrieval)
    client = make_chat_client(settings, llm, model, base_url, model_path)  # before the KB: a bad flag fails fast
    knowledge_base = None
    if answer.retrieval != "never":
        knowledge_base = open_kb(settings, Path(kb) if kb else ensure_demo_kb(cache_dir(settings)))
    packer = build_packer(settings, embedder=shared_embedder(settings, knowledge_base))
    voter = make_voter(settings, make_retriever(settings, knowledge_base)) if knowledge_base else None
    return {"packer": packer, "voter": voter, "client": client, "gate": build_gate(settings, packer),
            "answer": answer, "rewriter": make_rewriter(settings, client) if voter else None}


def make_rewriter(settings: Settings, client: ChatClient | None, variants: int | None = None,
                  hyde: bool | None = None) -> QueryRewriter | None:
    """Query expansion / HyDE as configured (flags override [retrieval]); both need a model."""
    n = settings.retrieval.query_variants if variants is None else variants
    imagine = settings.retrieval.hyde if hyde is None else hyde
    if not n and not imagine:
        return None
    if client is None:
        raise ValueError("query expansion and HyDE need a model: --llm openai --base-url URL --model NAME "
                         "(or set [retrieval] query_variants = 0 and hyde = false)")
    return QueryRewriter(client, n, imagine)
