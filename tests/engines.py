"""Test helpers over the composition root's API: an answer engine from hand-picked parts (a fake chat client,
the session's packer, a test knowledge base's voter) and retrievers with the old defaults spelled out."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from ebmrag.answer.engine import Engine
from ebmrag.answer.gate import GateParams, RetrievalGate, RuleLabeller
from ebmrag.answer.params import AnswerParams
from ebmrag.answer.relevance import RelevanceFilter
from ebmrag.compose import Resources, build_packer, build_tiering
from ebmrag.config import settings_to_dict
from ebmrag.generate.grounding import GroundingChecker
from ebmrag.index.backend import KnowledgeStore
from ebmrag.packing.packer import ContextPacker
from ebmrag.protocols import ChatClient
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.query_rewrite import QueryRewriter
from ebmrag.retrieve.search import HybridRetriever
from ebmrag.retrieve.vote import DocumentVoter


def rrf_params(mode: str = "hybrid", **options: Any) -> RetrievalParams:
    """[retrieval] with the retriever's former defaults: reciprocal-rank fusion, equal weights."""
    return RetrievalParams(**{"mode": mode, "fusion": "rrf", "bm25_weight": 1.0, "dense_weight": 1.0, **options})


def rrf_retriever(kb: KnowledgeStore, mode: str = "hybrid", **options: Any) -> HybridRetriever:
    """`HybridRetriever(kb, mode)` as it was before [retrieval] params: RRF with weights (1.0, 1.0)."""
    reranker = options.pop("reranker", None)
    return HybridRetriever(kb, rrf_params(mode, **options), reranker=reranker)


def engine_from_parts(resources: Resources, params: AnswerParams | None = None, *,
                      packer: ContextPacker | None = None, voter: DocumentVoter | None = None,
                      client: ChatClient | None = None, rewriter: QueryRewriter | None = None,
                      gate: RetrievalGate | None = None) -> Engine:
    """An engine over the session's models with the given parts (the rule gate of `params` unless given; the
    relevance filter when `params` asks for it and a client is given). Its configuration is the resources'
    settings with `params` as [answer]: a hand-plugged client or rewriter is not in it."""
    params = params or AnswerParams()
    gate = gate or RetrievalGate(RuleLabeller(resources.tier_classifier, resources.extractor), resources.questions,
                                 GateParams(params.gate_alpha, params.gate_beta, params.gate_gamma,
                                            params.gate_theta1, params.gate_theta2))
    relevance = RelevanceFilter(client) if params.relevance_filter and client is not None else None
    return Engine(params, tiering=build_tiering(resources), packer=packer or build_packer(resources), gate=gate,
                  grounding=GroundingChecker(resources.embedder, params.grounding_threshold,
                                             extractor=resources.extractor),
                  token_counter=resources.token_counter, questions=resources.questions,
                  tier_classifier=resources.tier_classifier, voter=voter, client=client, rewriter=rewriter,
                  relevance=relevance, configuration=settings_to_dict(replace(resources.settings, answer=params)))


def over_knowledge_base(resources: Resources, kb: KnowledgeStore) -> Resources:
    """The same shared models over `kb`: the resources a hand-built engine whose voter searches `kb` was built
    from (what a service given that engine needs, so erasure reaches the caches the engine fills)."""
    out = copy.copy(resources)
    out.knowledge_base = kb
    return out
