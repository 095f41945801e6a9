"""The composition root: settings -> `Resources` (the shared models, built once) -> components.

The CLI, the service, MCP, the results gateway, the research agent, the framework drop-ins and the benchmarks
build through here and nowhere else; command-line flags are applied once, as settings
(`config.with_overrides`). A record is loaded at the edge by `load_patient` (a file in any format the
record readers take, or a bundled demo name) and handed to `Engine.ask` as a `PatientRecord`.
"""

from ebmrag.compose.build import (
    ServiceParts,
    build_diagnoser,
    build_engine,
    build_engine_from,
    build_finding_mapper,
    build_gate,
    build_packer,
    build_reranker,
    build_research_agent,
    build_retriever,
    build_rewriter,
    build_tiering,
    build_voter,
    engine_from_dict,
    open_resources,
    require_openai,
    trajectory_folder,
)
from ebmrag.compose.resources import Resources, cache_dir_of, check_kb, open_kb
from ebmrag.demo import load_patient

__all__ = [
    "Resources",
    "ServiceParts",
    "build_diagnoser",
    "build_engine",
    "build_engine_from",
    "build_finding_mapper",
    "build_gate",
    "build_packer",
    "build_reranker",
    "build_research_agent",
    "build_retriever",
    "build_rewriter",
    "build_tiering",
    "build_voter",
    "cache_dir_of",
    "check_kb",
    "engine_from_dict",
    "load_patient",
    "open_kb",
    "open_resources",
    "require_openai",
    "trajectory_folder",
]
