"""Settings -> the research agent's parts (the DDx engine, the finding mapper, the tools, the agent). The
composition root (`factory`) re-exports these, as it does `agent.parts`."""

from __future__ import annotations

from pathlib import Path

from ebmrag.agent.parts import cache_dir
from ebmrag.config import Settings
from ebmrag.ddx.engine import DifferentialDiagnoser
from ebmrag.ddx.findings import FindingMapper
from ebmrag.ddx.knowledge import ConditionKB, load_kb
from ebmrag.evidence.embeddings import SentenceEmbedder


def build_diagnoser(settings: Settings) -> DifferentialDiagnoser:
    path = settings.research.ddx_kb
    return DifferentialDiagnoser(load_kb(Path(path) if path else None))


def build_finding_mapper(settings: Settings, kb: ConditionKB,
                         embedder: SentenceEmbedder | None = None) -> FindingMapper:
    model = settings.models.embedding_model or None
    return FindingMapper(kb, embedder or SentenceEmbedder(model, cache_dir=cache_dir(settings)))
