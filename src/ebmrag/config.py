"""One TOML file configures every command; command-line flags override it (`with_overrides`).

Each table is the params dataclass of the component that reads it, and its field names are the table's keys:
[packing] `packing.params.PackingParams`, [kb] `index.params.KnowledgeBaseConfig` (what a knowledge base is)
and `index.params.StorageSettings` (how it is stored), [retrieval] `retrieve.params.RetrievalParams`, [llm]
`llm.params.LLMParams`, [answer] `answer.params.AnswerParams`, [research] `research.params.ResearchParams`,
[chart] `records.params.ChartParams`, [observe] `observe.params.ObserveParams`, [ehr] `ehr.params.EhrParams`,
[cds] `cds.params.CdsParams`;
[models] (the shared models the composition root builds) and [serve] (the HTTP service) are defined here.
Every key, its default and its meaning: docs/configuration.md.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ebmrag.answer.params import AnswerParams
from ebmrag.cds.params import CdsParams
from ebmrag.ehr.params import EhrParams
from ebmrag.errors import ConfigError
from ebmrag.index.params import KnowledgeBaseConfig, StorageSettings, check_embedding
from ebmrag.llm.params import LLMParams
from ebmrag.observe.params import ObserveParams
from ebmrag.packing.params import PackingParams
from ebmrag.records.params import ChartParams
from ebmrag.research.params import ResearchParams
from ebmrag.retrieve.params import RetrievalParams


@dataclass(frozen=True)
class ModelSettings:
    """The models the composition root builds once and shares (`compose.Resources`)."""

    tokenizer: str = "bundled"  # or "hf:/path/tokenizer.json", "tiktoken:/path/file.tiktoken"
    embedding_model: str = ""  # a local sentence-transformers folder; empty = bundled all-MiniLM-L6-v2
    embedding_runtime: str = "auto"  # "onnx" (no torch), "torch" ([train] extra); auto: onnx wherever it can build
    embedding_precision: str = "auto"  # onnx: fp32 | int8 (auto: fp32); torch: fp32 | bf16 | int8
    embedding_threads: int = 0  # ONNX Runtime's intra-op threads per forward pass; 0: one per core
    cache_dir: str = ""  # empty = $XDG_CACHE_HOME/ebmrag
    tier_rules: str = ""  # empty = the bundled rules/tiers.toml
    tier_model: str = "bundled"  # where no tier rule speaks: "bundled" (rules/tier_ngram.npz), a path, or "" for none
    question_rules: str = ""  # empty = the bundled rules/questions.toml
    recogniser: str = "bundled"  # the critical-fact recogniser where rules are unsure: "bundled", a folder, "" for none

    def __post_init__(self) -> None:
        check_embedding(self.embedding_runtime, self.embedding_precision)
        if self.embedding_threads < 0:
            raise ValueError(f"embedding_threads must be >= 0, got {self.embedding_threads}")


FORWARDED_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")  # what [serve] forwarded_header may name


def proxy_networks(entries: Iterable[Any]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """[serve] trusted_proxies as networks: CIDRs ("10.0.0.0/8", "2001:db8::/32") or single addresses. A ValueError
    names the entry at fault; one with host bits set ("10.0.0.7/8") is refused as the typo it usually is."""
    networks = []
    for entry in entries:
        if not isinstance(entry, str):
            raise ValueError(f'trusted_proxies holds CIDR strings like "10.0.0.0/8", got {entry!r}')
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=True))
        except ValueError as exc:
            raise ValueError(f"trusted_proxies: {entry!r} is not an address or CIDR ({exc})") from None
    return tuple(networks)


@dataclass(frozen=True)
class ServeSettings:
    """`ebmrag serve`: the patient store, the knowledge base and the limits every request meets (`kb` is also the
    one `ebmrag mcp` and `ebmrag gateway run --prepare` open)."""

    store_url: str = ""  # empty: SQLite in --data-dir; else postgresql://user@host:port/db (env EBMRAG_STORE_URL)
    max_body_mb: float = 10.0  # a larger request body is refused (413)
    rate_per_second: float = 20.0  # per API key, with bursts of rate_burst (429 with Retry-After beyond)
    rate_burst: int = 40
    request_seconds: float = 120.0  # a request still running after this is answered 504
    engine_slots: int = 0  # requests doing engine work at once in each worker process (0: the CPU count)
    tenant_slots: int = 0  # ... of which one tenant may hold (0: all; it gives back its extra ones when others wait)
    tenant_queue: int = 64  # a tenant's requests waiting for a slot; one more is refused 429
    queue_limit: int = 256  # all tenants' requests waiting for a slot; one more is refused 503
    ehr_calls: int = 16  # pulls and exports (and, apart, CDS fetches) running at once per process; one more: 503
    tenant_ehr_calls: int = 4  # ... of which one tenant's; one more is refused 429
    max_chart_fragments: int = 10_000  # ask and pack refuse (422) a chart with more fragments
    switch_interval_ms: float = 1.0  # a Python thread runs this long before a waiting one may take over (Python: 5)
    prepare_charts: bool = True  # a stored chart is embedded, tiered and compressed in the background after writes
    prepare_queue: int = 10_000  # patients waiting for preparation; one more is left to its first ask
    kb: str = ""  # the knowledge base served and changed by uploads (--kb); empty: the bundled demo one, read-only
    kb_admin_tenant: str = "ebmrag"  # the knowledge base is shared: only this tenant's admin keys may change it
    audit_key_file: str = ""  # the audit chain's secret (env EBMRAG_AUDIT_KEY_FILE); empty: <data-dir>/audit.key
    key_max_days: float = 365.0  # a new API key ends after this at the latest (its default too); 0: keys may not end
    ui_session_hours: float = 8.0  # a /ui sign-in ends this long after it began, however busy
    ui_idle_minutes: float = 30.0  # ... or this long after its last request
    ui_secure_cookie: bool = False  # true: the /ui cookie is always Secure (TLS ends at a proxy); on https it is anyway
    trusted_proxies: tuple[str, ...] = ()  # CIDRs of reverse proxies whose forwarded header names the client; none
    forwarded_header: str = "x-forwarded-for"  # the one header those proxies write: x-forwarded-for|forwarded|x-real-ip

    def __post_init__(self) -> None:
        if self.max_body_mb <= 0 or self.rate_per_second <= 0 or self.rate_burst < 1 or self.request_seconds <= 0:
            raise ValueError("max_body_mb, rate_per_second and request_seconds must be > 0 and rate_burst >= 1")
        if min(self.engine_slots, self.tenant_slots) < 0 or min(self.tenant_queue, self.queue_limit,
                                                                  self.max_chart_fragments) < 1:
            raise ValueError("engine_slots and tenant_slots must be >= 0; tenant_queue, queue_limit and "
                             "max_chart_fragments >= 1")
        if self.engine_slots and self.tenant_slots > self.engine_slots:
            raise ValueError(f"tenant_slots ({self.tenant_slots}) cannot exceed engine_slots ({self.engine_slots})")
        if not 0.05 <= self.switch_interval_ms <= 100:
            raise ValueError(f"switch_interval_ms must be 0.05 to 100, got {self.switch_interval_ms}")
        if self.prepare_queue < 1:
            raise ValueError(f"prepare_queue must be >= 1, got {self.prepare_queue}")
        if not 1 <= self.tenant_ehr_calls <= self.ehr_calls:
            raise ValueError(f"need 1 <= tenant_ehr_calls <= ehr_calls, got {self.tenant_ehr_calls} and "
                             f"{self.ehr_calls}")
        if self.key_max_days < 0:
            raise ValueError(f"key_max_days must be >= 0 (0: no limit), got {self.key_max_days}")
        if self.ui_session_hours <= 0 or self.ui_idle_minutes <= 0:
            raise ValueError("ui_session_hours and ui_idle_minutes must be > 0")
        networks = proxy_networks(self.trusted_proxies)  # a ValueError naming the entry at fault
        object.__setattr__(self, "trusted_proxies", tuple(str(n) for n in networks))
        if self.forwarded_header not in FORWARDED_HEADERS:
            raise ValueError(f"forwarded_header must be one of {', '.join(FORWARDED_HEADERS)}, got "
                             f"{self.forwarded_header!r}")


@dataclass(frozen=True)
class Settings:
    packing: PackingParams = field(default_factory=PackingParams)
    models: ModelSettings = field(default_factory=ModelSettings)
    kb: KnowledgeBaseConfig = field(default_factory=KnowledgeBaseConfig)
    storage: StorageSettings = field(default_factory=StorageSettings)
    retrieval: RetrievalParams = field(default_factory=RetrievalParams)
    llm: LLMParams = field(default_factory=LLMParams)
    answer: AnswerParams = field(default_factory=AnswerParams)
    serve: ServeSettings = field(default_factory=ServeSettings)
    research: ResearchParams = field(default_factory=ResearchParams)
    chart: ChartParams = field(default_factory=ChartParams)
    observe: ObserveParams = field(default_factory=ObserveParams)
    ehr: EhrParams = field(default_factory=EhrParams)
    cds: CdsParams = field(default_factory=CdsParams)


TABLES = ("packing", "models", "kb", "retrieval", "llm", "answer", "serve", "research", "chart", "observe",
          "ehr", "cds")


def with_overrides(settings: Settings, **tables: dict[str, Any]) -> Settings:
    """Command-line flags applied once, as settings: `with_overrides(s, llm={"base_url": url})`. A None value
    means "not given" and keeps the file's; an unknown key is a programming error, not a user's."""
    for table, values in tables.items():
        given = {k: v for k, v in values.items() if v is not None}
        parts = dict(zip(("kb", "storage"), _split_kb_table(given), strict=True)) if table == "kb" else {table: given}
        for target, changes in parts.items():
            if not changes:
                continue
            try:
                settings = replace(settings, **{target: replace(getattr(settings, target), **changes)})
            except ValueError as exc:
                raise ConfigError(f"[{table}]: {exc}") from exc
    return settings


def settings_to_dict(settings: Settings) -> dict[str, Any]:
    """The TOML file's tables as a dict (`settings_from_dict` reads it back; [kb] holds both of its parts)."""
    data = {name: {f.name: getattr(getattr(settings, name), f.name) for f in fields(getattr(settings, name))}
            for name in TABLES}
    data["kb"].update({f.name: getattr(settings.storage, f.name) for f in fields(StorageSettings)})
    return data


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
        if expected is tuple and isinstance(value, list):  # a TOML array for a tuple field
            value = tuple(value)
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
    try:
        return settings_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def settings_from_dict(data: dict[str, Any]) -> Settings:
    """Tables as TOML holds them (or `settings_to_dict` wrote them) -> checked settings."""
    unknown = set(data) - set(TABLES)
    if unknown:
        raise ConfigError(f"unknown tables {sorted(unknown)}")
    build, storage = _split_kb_table(data.get("kb"))
    return Settings(
        _section(PackingParams, data.get("packing"), "packing"),
        _section(ModelSettings, data.get("models"), "models"),
        _section(KnowledgeBaseConfig, build, "kb"),
        _section(StorageSettings, storage, "kb"),
        _section(RetrievalParams, data.get("retrieval"), "retrieval"),
        _section(LLMParams, data.get("llm"), "llm"),
        _section(AnswerParams, data.get("answer"), "answer"),
        _section(ServeSettings, data.get("serve"), "serve"),
        _section(ResearchParams, data.get("research"), "research"),
        _section(ChartParams, data.get("chart"), "chart"),
        observe=_section(ObserveParams, data.get("observe"), "observe"),
        ehr=_section(EhrParams, data.get("ehr"), "ehr"),
        cds=_section(CdsParams, data.get("cds"), "cds"),
    )
