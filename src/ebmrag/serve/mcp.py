"""The MCP server (`ebmrag mcp`): ebmrag's tools for agent frameworks, behind the service's keys and isolation.

Tools (JSON schemas from their typed signatures): `patient_fragments`, `pack`, `ask` (one stored patient each),
`search` (the shared knowledge base) and `ddx` (the bundled condition knowledge base; no patient data). Every call
is authenticated with a service API key and checked exactly as the HTTP routes check it: the key's role, its
tenant and its patient scope (a patient it may not see does not exist), then audited with the fragment ids it
disclosed. Over streamable HTTP the key travels in each request's `Authorization: Bearer ebm_…` header, and the
service's own guard (serve.guard.BodyGuard) stands in front of MCP: a request without a valid key is refused with
401 before a byte of its body is read, failed keys are throttled per address and per key id (429; a valid key
always passes), and a body is refused past [serve] max_body_mb while it streams (413). Over stdio the key is given
once when the server starts (`--key` or EBMRAG_API_KEY). Every refusal — the guard's, and a call refused with 401,
403, 404 or 429 — is audited as `refused <status> <where>` like a refused HTTP request (429s by the burst). A bad
argument or a refused call is a tool error, never a crash; a JSON-RPC id over MAX_ID_CHARS is a JSON-RPC error
(it would become the audit's request id).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from ebmrag.errors import EbmragError, require_extra

require_extra("mcp", "mcp", "ebmrag mcp")

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from mcp.types import INVALID_REQUEST  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402

from ebmrag import __version__  # noqa: E402
from ebmrag.serve.guard import (  # noqa: E402
    MAX_ID_CHARS,
    ASGIApp,
    BodyGuard,
    Scope,
    client_of,
    request_id,
    scope_request_id,
    too_long,
)
from ebmrag.serve.models import MAX_TEXT, bounded_text  # noqa: E402
from ebmrag.serve.problems import ProblemError  # noqa: E402
from ebmrag.serve.service import Service  # noqa: E402
from ebmrag.store import audit  # noqa: E402
from ebmrag.store.access import (  # noqa: E402
    READ,
    SEARCH,
    AccessError,
    authenticate,
    require,
    valid_name,
)
from ebmrag.store.keys import ApiKey  # noqa: E402

T = TypeVar("T")
MAX_FINDINGS = 200  # a differential from more findings than any chart states is a request to burn CPU
INSTRUCTIONS = ("Evidence-graded context for medical questions about one stored patient: patient_fragments lists a "
                "record with tiers, pack fits it into a token window keeping critical facts, ask answers with "
                "citations, search reads the shared knowledge base, ddx ranks diagnoses from findings.")
MCP_ROUTE = "/mcp"


class McpTools:
    """What each tool does once its caller's key is known (kept apart from MCP so it reads like the routes)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._ddx: tuple[Any, Any] | None = None

    def _record(self, key: ApiKey, patient_id: str) -> Any:
        valid_name(patient_id, "patient_id")
        require(key, READ, patient_id)
        record = self.service.store.record(key.tenant, patient_id)
        if record is None or not record.fragments:
            raise AccessError(404, "no such patient")
        return record

    def _audit(self, key: ApiKey, patient: str, action: str, call: str, fragments: tuple[str, ...] = ()) -> None:
        audit.append(self.service.store, audit.AuditEntry(key.key_id, key.tenant, patient, f"mcp:{action}", call,
                                                          fragments))

    def _chart(self, key: ApiKey, patient_id: str) -> Any:
        """The record for `ask` and `pack`: a chart over [serve] max_chart_fragments is a tool error at once."""
        try:
            return self.service.check_chart(self._record(key, patient_id))
        except ProblemError as exc:
            raise ToolError(f"{exc.status}: {exc.detail}") from None

    def _run(self, key: ApiKey, work: Callable[[], T], patient: str = "", engine: bool = True) -> T:
        """`work` under the service's scheduling and time limit, as the HTTP routes run it (serve.scheduler); a
        full queue, a chart too large or a timeout is a tool error with its status."""
        try:
            return self.service.call(work, tenant=key.tenant, patient=patient, engine=engine)
        except ProblemError as exc:
            raise ToolError(f"{exc.status}: {exc.detail}") from None

    def _ddx_parts(self) -> tuple[Any, Any]:
        """The condition knowledge base and the finding mapper, built once; the mapper shares the engine's model."""
        from ebmrag.compose import build_diagnoser, build_finding_mapper

        if self._ddx is None:
            diagnoser = build_diagnoser(self.service.settings)
            self._ddx = (diagnoser, build_finding_mapper(self.service.resources(), diagnoser))
        return self._ddx

    def patient_fragments(self, key: ApiKey, call: str, patient_id: str) -> dict[str, Any]:
        record = self._record(key, patient_id)
        classified = self._run(key, lambda: self.service.classify(record), patient_id, engine=False)
        self._audit(key, patient_id, "read", call, tuple(f.id for f in classified.fragments))
        return {"patient": patient_id, "fragments": [
            {"id": f.id, "text": f.text, "section": f.section, "tier": f.tier.value,
             "timestamp": f.timestamp.isoformat() if f.timestamp else None,
             "must_keep": bool(f.decision and f.decision.must_keep)} for f in classified.fragments]}

    def pack(self, key: ApiKey, call: str, patient_id: str, question: str, window: int,
             strategy: str | None) -> dict[str, Any]:
        bounded_text("question", question)
        record = self._chart(key, patient_id)
        result = self._run(key, lambda: self.service.pack(record, question, window, strategy), patient_id)
        self._audit(key, patient_id, "pack", call, tuple(p.fragment_id for p in result.packed))
        return dict(result.to_json(), context=result.context)

    def ask(self, key: ApiKey, call: str, patient_id: str, question: str, window: int | None) -> dict[str, Any]:
        bounded_text("question", question)
        record = self._chart(key, patient_id)
        result = self._run(key, lambda: self.service.engine().ask(question, record, window), patient_id)
        self._audit(key, patient_id, "ask", call, tuple(i.id for i in result.items))
        data: dict[str, Any] = result.to_json()
        return data

    def search(self, key: ApiKey, call: str, query: str, k: int) -> list[dict[str, Any]]:
        require(key, SEARCH)
        bounded_text("query", query)
        try:
            retriever = self.service.retriever()
        except ProblemError as exc:
            raise ToolError(exc.detail) from None
        hits = self._run(key, lambda: retriever.run(query, k))
        self._audit(key, "", "search", call)
        return [h.to_json() for h in hits]

    def ddx(self, key: ApiKey, findings: list[str], age: int | None, sex: str | None) -> dict[str, Any]:
        from ebmrag.ddx.engine import complete_findings

        require(key, SEARCH)
        if len(findings) > MAX_FINDINGS:
            raise ValueError(f"give at most {MAX_FINDINGS} findings, got {len(findings):,}")
        if sum(len(f) for f in findings) > MAX_TEXT:  # the same text limit as a question, on every transport
            raise ValueError(f"the findings are longer than {MAX_TEXT:,} characters together")
        diagnoser, mapper = self._run(key, self._ddx_parts)
        mapped = self._run(key, lambda: mapper.run(findings))
        result = diagnoser.run(complete_findings(diagnoser.kb, {m.code: m.present for m in mapped}, False), age,
                               (sex or "").upper() or None)
        return {**result.to_json(), "mapped": [{"code": m.code, "present": m.present, "text": m.clause}
                                               for m in mapped]}


def build_mcp_server(service: Service, stdio_key: str | None = None) -> MCPServer:
    """The MCP server over `service`. `stdio_key` authenticates every call that arrives without HTTP headers."""
    tools, server = McpTools(service), MCPServer("ebmrag", instructions=INSTRUCTIONS, version=__version__)

    def caller(ctx: Context) -> ApiKey:
        """The calling key, authenticated and held to the service's per-key rate limit ([serve] rate_*)."""
        headers = ctx.headers
        header = headers.get("authorization") if headers is not None else (f"Bearer {stdio_key}" if stdio_key
                                                                           else None)
        key = authenticate(service.store, header)
        wait = service.limiter.take(key.key_id)
        if wait > 0:
            raise AccessError(429, f"more than {service.settings.serve.rate_per_second:g} calls per second for "
                                   f"this key; retry in {max(1, round(wait))} s", key)
        return key

    def guarded(tool: str, ctx: Context, work: Callable[[ApiKey, str], Any], patient: str = "") -> str:
        """One call under its caller's key; a refused call is audited (under the key when it is known, with the
        patient it named when that is a valid id) before it becomes a tool error."""
        sent = ctx.request_id
        if len(sent) > MAX_ID_CHARS:  # a JSON-RPC error naming the field, before anything is checked or audited
            raise MCPError(INVALID_REQUEST, too_long("JSON-RPC id", sent))
        call, key = request_id(sent, "mcp-"), None  # unique (JSON-RPC ids repeat per session); plain ids kept
        try:
            key = caller(ctx)
            return json.dumps(work(key, call), ensure_ascii=False)
        except AccessError as exc:
            service.audit_refused(key or exc.key, exc.status, f"mcp:{tool}", call, patient)
            raise ToolError(f"{exc.status}: {exc.detail}") from None
        except (EbmragError, ValueError) as exc:
            raise ToolError(str(exc)) from None

    @server.tool(description="A stored patient's record fragments with their evidence tiers and must-keep flags.")
    def patient_fragments(patient_id: str, ctx: Context) -> str:
        return guarded("patient_fragments", ctx, lambda key, call: tools.patient_fragments(key, call, patient_id),
                       patient_id)

    @server.tool(description="Pack a stored patient's record into a token window for a question (EBM-Pack): every "
                             "fragment packed full or compressed, or dropped, with its reason.")
    def pack(patient_id: str, question: str, ctx: Context, window: int = 2048, strategy: str | None = None) -> str:
        return guarded("pack", ctx, lambda key, call: tools.pack(key, call, patient_id, question, window, strategy),
                       patient_id)

    @server.tool(description="Answer a clinical question about a stored patient with cited evidence and a trace.")
    def ask(patient_id: str, question: str, ctx: Context, window: int | None = None) -> str:
        return guarded("ask", ctx, lambda key, call: tools.ask(key, call, patient_id, question, window), patient_id)

    @server.tool(description="Search the shared medical knowledge base (hybrid BM25 + dense).")
    def search(query: str, ctx: Context, k: int = 5) -> str:
        if not 1 <= k <= 50:
            raise ToolError(f"k must be between 1 and 50, got {k}")
        return guarded("search", ctx, lambda key, call: tools.search(key, call, query, k))

    @server.tool(description="Rank diagnoses by posterior from findings in words ('fever', 'no cough') or codes.")
    def ddx(findings: list[str], ctx: Context, age: int | None = None, sex: str | None = None) -> str:
        if not findings:
            raise ToolError("give at least one finding")
        return guarded("ddx", ctx, lambda key, call: tools.ddx(key, findings, age, sex))

    return server


def http_app(service: Service) -> ASGIApp:
    """The streamable HTTP transport at /mcp behind the same guard as the HTTP API (serve.guard.BodyGuard, on
    every path): no body read without a valid key, failed keys throttled with the same count as the HTTP API and
    /ui, bodies limited while they stream, each refusal audited and counted, and the bursts of 429s still counted
    audited when the server stops."""
    server = build_mcp_server(service)

    async def refused(scope: Scope, status: int) -> None:
        route = MCP_ROUTE if str(scope.get("path", "")).rstrip("/") == MCP_ROUTE else "unmatched"
        service.metrics.observe(route, status, 0.0)
        await run_in_threadpool(service.audit_refused, scope.get("state", {}).get("key"), status, route,
                                scope_request_id(scope), "", client_of(scope))

    return BodyGuard(server.streamable_http_app(host="127.0.0.1"), store=service.store,
                     max_bytes=int(service.settings.serve.max_body_mb * 2**20), refused=refused,
                     failed_keys=service.failed_keys, keyed_prefix="/", id_prefix="mcp-", clients=service.clients,
                     on_shutdown=service.throttled.close)
