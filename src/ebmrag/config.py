"""One TOML file configures every command; command-line flags override it.

[packing]
strategy = "ebm-exact"   # ebm-exact | ebm-greedy | fifo | semantic | uniform
window = 256
k_min = 1
alpha = 2.5              # tier weights, alpha >= beta >= gamma >= 1
beta = 2.5
gamma = 1.0
decay_lambda = 5.0       # per year; standing facts never decay
epsilon = 0.0
objective = "critical"   # ebm-exact: must-keep, then the current encounter's T1/T2, then quotas, then utility;
                         # "paper": quotas, then utility (the paper's MCKP)
encounter_window_hours = 72   # without encounter ids, fragments this close to the newest one are "current"
prefilter_windows = 4.0       # a record estimated above this many windows is pre-filtered before embedding
prefilter_min_fragments = 1000  # (and only when it holds more fragments than this); 0 windows = never.
                              # Critical fragments are never pre-filtered (docs/results/prefilter.md)

[models]
tokenizer = "bundled"    # or "hf:/path/tokenizer.json", "tiktoken:/path/file.tiktoken"
embedding_model = ""     # a local sentence-transformers folder; empty = bundled all-MiniLM-L6-v2
cache_dir = ""           # empty = $XDG_CACHE_HOME/ebmrag
tier_rules = ""          # empty = the bundled rules/tiers.toml
tier_model = "bundled"   # learned tier classifier where no rule speaks; a path of your own, or "" for rules only

[kb]                     # fixed when a knowledge base is created (stored in its manifest)
embedding_model = ""     # empty = bundled all-MiniLM-L6-v2; "minilm-medquad" = the same + a shipped delta for
                         # consumer medical questions (+0.07 nDCG@10, docs/results/retrieval.md); or a .npz delta or
                         # a local sentence-transformers folder
embedding_max_tokens = 128   # the length all-MiniLM-L6-v2 was trained at; 256 is ~2.5x slower
embedding_precision = "auto" # bf16 on CPUs with native bf16 (2x faster, same nDCG), else fp32; or fp32 | bf16 | int8
chunker = ""             # empty = by source type; or fixed | recursive | structure | sentence
contextual_prefix = true # index each chunk headed by its document title and section
hnsw_min_rows = 20000    # below this, dense search is an exact scan
                         # -- how it is stored and written (may change at any time) --
backend = "embedded"     # or "milvus": a collection per knowledge base on a Milvus server (the --kb path's last part
uri = ""                 # names it), at uri = "http://host:19530"; needs the 'milvus' extra
workers = 0              # ingest: processes that chunk and analyse (0 = one per core, at most 8; 1 = none)
segment_rows = 250000    # a write of more chunks than this is split into segments of about this size
merge_factor = 10        # tiered merging: this many segments of one size tier are merged (0 = only `kb compact`)

[retrieval]
mode = "hybrid"          # bm25 | dense | hybrid
fusion = "score"         # score (weighted min-max) | rrf (weighted reciprocal rank, k = rrf_k)
bm25_weight = 0.3
dense_weight = 0.7
route_depth = 50
rrf_k = 60
focus_weight = 0.0       # > 0: also search the question's focus (titles it names + question type), this share
k = 10
rerank_model = ""        # a cross-encoder: a local folder or a .npz delta over the bundled MiniLM; "" = none
rerank_depth = 0         # it rescores this many best hits of the first stage (0: all route_depth of them)
rerank_mix = 1.0         # its share of the final score (the rest: the first stage's, both min-max normalised)
rerank_max_tokens = 512
query_variants = 0       # > 0 (needs a model): the question reworded this many times, each searched at half weight
hyde = false             # (needs a model) HyDE: dense search with the mean of the question and a model-written passage

[llm]
backend = "extractive"   # or "openai": any OpenAI-compatible endpoint (base_url, model; key from OPENAI_API_KEY)

[answer]                 # ebmrag ask
window = 4096            # the whole prompt budget: system + context + history + question + output reserve
retrieval = "auto"       # auto (the retrieval gate decides) | always | never
ordering = "relevance_first"   # or edges_first
relevance_filter = false # LLM judges each retrieved document (needs --llm openai)
model_seconds = 180      # one time budget for all model calls of one answer; past it, stages degrade at once
gate_theta1 = 0.35       # gate thresholds and weights: gate_alpha/beta/gamma = 1.0/0.5/0.1
gate_theta2 = 0.25
brief_sentences = 12     # the offline brief: at most this many patient sentences (key facts first) ...
brief_evidence_sentences = 8   # ... and this many knowledge-base sentences; the full context is in the trace
redact = "auto"          # names, identifiers, contacts, exact dates out of what an outside model sees:
                         # auto = unless the endpoint's host is in local_hosts; always; never
local_hosts = "127.0.0.1,localhost,::1"

[serve]                  # ebmrag serve
store_url = ""           # empty: SQLite in --data-dir; or postgresql://user@host:5432/db (env EBMRAG_STORE_URL)
max_body_mb = 10         # larger request bodies are refused (413)
rate_per_second = 20     # per API key, bursts of rate_burst; beyond: 429 with Retry-After
rate_burst = 40
request_seconds = 120    # a request still running after this is answered 504
kb_admin_tenant = "ebmrag"   # the knowledge base is shared by all tenants: only this tenant's admins change it
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError, KnowledgeBaseError

EMBEDDING_PRECISIONS = ("auto", "fp32", "bf16", "int8")
MAX_WINDOW = 1_000_000  # far above today's largest model windows (~200k); a guard against typos, not a tuning knob
CHUNKERS = ("", "fixed", "recursive", "structure", "sentence")


def check_gate_params(alpha: float, beta: float, gamma: float, theta1: float, theta2: float) -> None:
    """The retrieval gate's rule for its weights and thresholds: checked here for the file and by
    `agent.gate.GateParams` for its arguments, with this one function."""
    if not alpha > 0 or not 0 <= gamma <= beta <= alpha:
        raise ValueError(f"gate weights need alpha > 0 and 0 <= gamma <= beta <= alpha, got ({alpha}, {beta}, {gamma})")
    if not 0 <= theta2 <= theta1 <= 1:
        raise ValueError(f"gate thresholds need 0 <= theta2 <= theta1 <= 1, got ({theta1}, {theta2})")


@dataclass(frozen=True)
class KnowledgeBaseConfig:
    """Fixed when a knowledge base is created and stored in every generation's manifest."""

    embedding_model: str = ""  # "minilm-medquad": +0.07 nDCG@10 on the LiveQA check half, not yet the default
    embedding_max_tokens: int = 128
    embedding_precision: str = "auto"  # bf16 where the CPU has it natively: 2x faster, same nDCG
    chunker: str = ""
    contextual_prefix: bool = True
    k1: float = 1.5
    b: float = 0.75
    hnsw_min_rows: int = 20_000

    def __post_init__(self) -> None:
        if self.chunker not in CHUNKERS:
            raise ValueError(f"unknown chunker {self.chunker!r}")
        if self.embedding_precision not in EMBEDDING_PRECISIONS:
            raise ValueError(f"embedding_precision must be one of {EMBEDDING_PRECISIONS}, "
                             f"got {self.embedding_precision!r}")
        if self.hnsw_min_rows < 0:
            raise ValueError("hnsw_min_rows must be >= 0")

    @classmethod
    def from_manifest(cls, stored: dict[str, Any], where: Path) -> KnowledgeBaseConfig:
        """The config a generation was built with; `quantize` (before precision profiles) maps to int8 / fp32."""
        values = dict(stored)
        if "quantize" in values:
            values["embedding_precision"] = "int8" if values.pop("quantize") else "fp32"
        values.setdefault("embedding_precision", "fp32")
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise KnowledgeBaseError(f"{where}: manifest has unknown settings {sorted(unknown)}; "
                                     "it was written by a newer ebmrag")
        return cls(**values)


@dataclass(frozen=True)
class StorageSettings:
    """How a knowledge base is written and stored; unlike `KnowledgeBaseConfig`, not part of what it is."""

    backend: str = "embedded"
    uri: str = ""
    workers: int = 0
    segment_rows: int = 250_000
    merge_factor: int = 10

    def __post_init__(self) -> None:
        if self.backend not in ("embedded", "milvus"):
            raise ValueError(f"backend must be 'embedded' or 'milvus', got {self.backend!r}")
        if self.backend == "milvus" and not self.uri:
            raise ValueError("backend 'milvus' needs uri = \"http://host:19530\"")
        if self.workers < 0 or self.segment_rows < 1:
            raise ValueError("workers must be >= 0 and segment_rows >= 1")
        if self.merge_factor != 0 and self.merge_factor < 2:
            raise ValueError(f"merge_factor must be 0 (never merge automatically) or >= 2, got {self.merge_factor}")


@dataclass(frozen=True)
class PackingSettings:
    strategy: str = "ebm-exact"
    window: int = 256
    k_min: int = 1
    alpha: float = 2.5
    beta: float = 2.5
    gamma: float = 1.0
    decay_lambda: float = 5.0
    epsilon: float = 0.0
    similarity_floor: float = 0.05
    objective: str = "critical"  # ebm-exact: critical (must-keep, current encounter's T1/T2 first) | paper
    encounter_window_hours: float = 72.0  # without encounter ids: this close to the newest fragment is current
    prefilter_windows: float = 4.0  # records estimated above this many windows are pre-filtered; 0 = never
    prefilter_min_fragments: int = 1000  # ... and only when they hold more fragments than this

    def __post_init__(self) -> None:
        if self.prefilter_windows != 0 and self.prefilter_windows < 1:
            raise ValueError(f"prefilter_windows must be 0 (off) or >= 1, got {self.prefilter_windows}")
        if self.prefilter_min_fragments < 1:
            raise ValueError(f"prefilter_min_fragments must be >= 1, got {self.prefilter_min_fragments}")
        if self.objective not in ("critical", "paper"):
            raise ValueError(f"objective must be 'critical' or 'paper', got {self.objective!r}")


@dataclass(frozen=True)
class ModelSettings:
    tokenizer: str = "bundled"
    embedding_model: str = ""
    cache_dir: str = ""
    tier_rules: str = ""
    tier_model: str = "bundled"  # where no tier rule speaks: "bundled" (rules/tier_model.npz), a path, or "" for none


@dataclass(frozen=True)
class RetrievalSettings:
    mode: str = "hybrid"
    fusion: str = "score"
    bm25_weight: float = 0.3
    dense_weight: float = 0.7
    route_depth: int = 50
    rrf_k: int = 60
    focus_weight: float = 0.0  # the share of fusion weight for the routes run on the question's focus (focus.py)
    k: int = 10
    rerank_model: str = ""  # a local cross-encoder folder or a .npz delta over the bundled MiniLM; empty = none
    rerank_depth: int = 0  # the reranker rescores this many best hits of the first stage (0: all of them)
    rerank_mix: float = 1.0  # share of the reranker's score in the final one (the rest: the first stage's)
    rerank_max_tokens: int = 512  # question + chunk length the reranker reads
    query_variants: int = 0  # > 0: a model rewords the question this many times; each rewording also searches
    hyde: bool = False  # a model writes a passage answering the question; the dense route searches with it too
    vote_chunks: int = 100  # ICA-RAG document vote: chunks per sentence (m)
    vote_documents: int = 5  # documents kept (k)
    vote_min_score: float = 0.5  # chunks below this share of the sentence's best score do not vote


@dataclass(frozen=True)
class LLMSettings:
    """The answering model. The key is better left out of the file: OPENAI_API_KEY is read when it is empty."""

    backend: str = "extractive"  # or "openai": any OpenAI-compatible endpoint; "local": a GGUF file (llama.cpp)
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    timeout: float = 60.0
    max_retries: int = 2
    model_path: str = ""  # backend "local": the .gguf file
    context_tokens: int = 4096  # backend "local": the model's context window

    def __post_init__(self) -> None:
        if self.backend not in ("extractive", "openai", "local"):
            raise ValueError(f"backend must be 'extractive', 'openai' or 'local', got {self.backend!r}")


@dataclass(frozen=True)
class AnswerSettings:
    """`ebmrag ask`: the window is the whole prompt budget of the answering model (see generate.budget)."""

    window: int = 4096
    retrieval: str = "auto"  # auto (the gate decides) | always | never
    ordering: str = "relevance_first"  # or edges_first
    max_queries: int = 24  # A/B sentences that vote for documents, A first
    relevance_filter: bool = False  # ask the model about each retrieved document (needs an LLM)
    grounding_threshold: float = 0.6
    prompts: str = ""  # a TOML file with the four stages; empty = the bundled set for the question's language
    evidence_share: float = 0.5  # the most of the context that knowledge-base evidence may take
    model_seconds: float = 180.0  # one time budget for all model calls of one answer; then the offline brief
    gate_model: str = ""  # a classifier from `ebmrag gate train`; empty = the label-free rule labeller
    gate_alpha: float = 1.0  # completeness weights of A, B, C sentences (ICA-RAG)
    gate_beta: float = 0.5
    gate_gamma: float = 0.1
    gate_theta1: float = 0.35  # above: answer from the record (the paper prints 0.3; see docs/results/gate.md)
    gate_theta2: float = 0.25  # below: retrieve and warn (the paper prints 0.1, which can never fire)
    brief_sentences: int = 12  # the offline brief's patient sentences (must-keep first, then by relevance)
    brief_evidence_sentences: int = 8
    redact: str = "auto"  # identifiers out of what an outside model sees: auto (unless local), always, never
    local_hosts: str = "127.0.0.1,localhost,::1"  # endpoints on these hosts count as local

    def __post_init__(self) -> None:
        if not 1 <= self.window <= MAX_WINDOW:
            raise ValueError(f"window must be a whole number of tokens from 1 to {MAX_WINDOW:,}, got {self.window}")
        if self.model_seconds <= 0:
            raise ValueError(f"model_seconds must be > 0, got {self.model_seconds}")
        if self.max_queries < 1:
            raise ValueError(f"max_queries must be >= 1, got {self.max_queries}")
        if self.brief_sentences < 1 or self.brief_evidence_sentences < 0:
            raise ValueError("brief_sentences must be >= 1 and brief_evidence_sentences >= 0, got "
                             f"{self.brief_sentences} and {self.brief_evidence_sentences}")
        if not 0 < self.evidence_share <= 1:
            raise ValueError(f"evidence_share must be in (0, 1], got {self.evidence_share}")
        check_gate_params(self.gate_alpha, self.gate_beta, self.gate_gamma, self.gate_theta1, self.gate_theta2)
        if self.redact not in ("auto", "always", "never"):
            raise ValueError(f"redact must be auto, always or never, got {self.redact!r}")
        if self.retrieval not in ("auto", "always", "never"):
            raise ValueError(f"retrieval must be auto, always or never, got {self.retrieval!r}")
        if self.ordering not in ("relevance_first", "edges_first"):
            raise ValueError(f"ordering must be relevance_first or edges_first, got {self.ordering!r}")


@dataclass(frozen=True)
class ServeSettings:
    """`ebmrag serve`: the patient store and the limits every request meets."""

    store_url: str = ""  # empty: SQLite in --data-dir; else postgresql://user@host:port/db (env EBMRAG_STORE_URL)
    max_body_mb: float = 10.0  # a larger request body is refused (413)
    rate_per_second: float = 20.0  # per API key, with bursts of rate_burst (429 with Retry-After beyond)
    rate_burst: int = 40
    request_seconds: float = 120.0  # a request still running after this is answered 504
    kb_admin_tenant: str = "ebmrag"  # the knowledge base is shared: only this tenant's admin keys may change it

    def __post_init__(self) -> None:
        if self.max_body_mb <= 0 or self.rate_per_second <= 0 or self.rate_burst < 1 or self.request_seconds <= 0:
            raise ValueError("max_body_mb, rate_per_second and request_seconds must be > 0 and rate_burst >= 1")


DEFAULT_AUTHORITY = {"guideline": 1.0, "systematic_review": 0.85, "trial": 0.7, "cohort": 0.55, "textbook": 0.4,
                     "other": 0.2}


@dataclass(frozen=True)
class ResearchSettings:
    """`ebmrag research` and `ebmrag ddx`: the agent loop, authority weighting (seed 004) and the DDx engine."""

    max_steps: int = 12
    window: int = 8192  # the agent's own context, kept by EBM-Pack (question, patient view, observations)
    output_reserve: int = 1024  # tokens left free for the model's reply
    protocol: str = "auto"  # tools (OpenAI tool calling) | text (Thought/Action/Observation) | auto: tools, else text
    relevance_weight: float = 0.4  # λ in Score = λ·Rel + (1−λ)·Auth
    authority: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_AUTHORITY))
    search_k: int = 5
    read_budget: int = 600  # tokens of a document that read_document returns
    trajectories: str = ""  # folder for the JSONL trajectories; empty = <cache dir>/trajectories
    ddx_kb: str = ""  # a condition knowledge base (ebmrag-ddx-kb/1 JSON); empty = the bundled DDXPlus one

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.window < 512 or not 0 <= self.output_reserve < self.window // 2:
            raise ValueError("max_steps must be >= 1, window >= 512 and output_reserve in [0, window/2)")
        if self.protocol not in ("auto", "tools", "text"):
            raise ValueError(f"protocol must be auto, tools or text, got {self.protocol!r}")
        if not 0 <= self.relevance_weight <= 1:
            raise ValueError(f"relevance_weight must be in [0, 1], got {self.relevance_weight}")
        bad = {k: v for k, v in self.authority.items() if not isinstance(v, int | float) or not 0 <= v <= 1}
        if bad or "other" not in self.authority:
            raise ValueError(f"authority weights must be numbers in [0, 1] and include 'other'; bad: {bad}")
        if self.search_k < 1 or self.read_budget < 32:
            raise ValueError("search_k must be >= 1 and read_budget >= 32")


@dataclass(frozen=True)
class Settings:
    packing: PackingSettings = field(default_factory=PackingSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    kb: KnowledgeBaseConfig = field(default_factory=KnowledgeBaseConfig)
    storage: StorageSettings = field(default_factory=StorageSettings)
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    answer: AnswerSettings = field(default_factory=AnswerSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    research: ResearchSettings = field(default_factory=ResearchSettings)


def _section(cls: type[Any], raw: Any, name: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table")
    known = {f.name: f.type for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ConfigError(f"[{name}] has unknown keys {sorted(unknown)}; known: {sorted(known)}")
    defaults = cls()
    values = {}
    for key, value in raw.items():
        expected = type(getattr(defaults, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(f"[{name}].{key} must be {expected.__name__}, got {value!r}")
        values[key] = value
    try:
        return replace(defaults, **values)
    except ValueError as exc:
        raise ConfigError(f"[{name}]: {exc}") from exc


def _split_kb_table(raw: Any) -> tuple[Any, Any]:
    """[kb] holds both what a knowledge base is (its manifest) and how it is stored; each class takes its keys."""
    if not isinstance(raw, dict):
        return raw, None
    storage_keys = {f.name for f in fields(StorageSettings)}
    return ({k: v for k, v in raw.items() if k not in storage_keys},
            {k: v for k, v in raw.items() if k in storage_keys})


def load_settings(path: str | Path | None) -> Settings:
    if path is None:
        return Settings()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = set(data) - {"packing", "models", "kb", "retrieval", "llm", "answer", "serve", "research"}
    if unknown:
        raise ConfigError(f"config file {path}: unknown tables {sorted(unknown)}")
    build, storage = _split_kb_table(data.get("kb"))
    return Settings(
        _section(PackingSettings, data.get("packing"), "packing"),
        _section(ModelSettings, data.get("models"), "models"),
        _section(KnowledgeBaseConfig, build, "kb"),
        _section(StorageSettings, storage, "kb"),
        _section(RetrievalSettings, data.get("retrieval"), "retrieval"),
        _section(LLMSettings, data.get("llm"), "llm"),
        _section(AnswerSettings, data.get("answer"), "answer"),
        _section(ServeSettings, data.get("serve"), "serve"),
        _section(ResearchSettings, data.get("research"), "research"),
    )
