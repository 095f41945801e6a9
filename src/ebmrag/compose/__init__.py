"""The composition root: settings -> a ready `Engine` or one of its parts. The CLI, the service and the
results gateway build everything through here (the part builders live in `agent.parts`, below the
engine, so `Engine.from_config` uses the same ones)."""

from __future__ import annotations

from pathlib import Path

from ebmrag.answer.engine import Engine
from ebmrag.compose.parts import (
    build_gate,
    build_packer,
    cache_dir,
    engine_parts,
    make_chat_client,
    make_llm_client,
    make_retriever,
    make_rewriter,
    make_voter,
    open_kb,
    require_llm_client,
    utility_params,
)
from ebmrag.config import Settings
from ebmrag.compose.research import build_diagnoser, build_finding_mapper, build_research_agent

__all__ = [
    "build_diagnoser",
    "build_engine",
    "build_finding_mapper",
    "build_gate",
    "build_packer",
    "build_research_agent",
    "cache_dir",
    "make_chat_client",
    "make_llm_client",
    "make_retriever",
    "make_rewriter",
    "make_voter",
    "open_kb",
    "require_llm_client",
    "utility_params",
]


def build_engine(settings: Settings, *, kb: str | Path | None = None, llm: str | None = None,
                 base_url: str | None = None, model: str | None = None, window: int | None = None,
                 retrieval: str | None = None, model_path: str | None = None) -> Engine:
    """The answer engine the settings describe; flags override them. Without `kb`, the bundled demo KB."""
    return Engine(**engine_parts(settings, kb=kb, llm=llm, base_url=base_url, model=model, window=window,
                                 retrieval=retrieval, model_path=model_path))
