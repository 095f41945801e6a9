"""The MCP server (`ebmrag mcp`): ebmrag's tools for agent frameworks, behind the service's keys and isolation.

Tools (JSON schemas from their typed signatures): `patient_fragments`, `pack`, `ask` (one stored patient each),
`search` (the shared knowledge base) and `ddx` (the bundled condition knowledge base; no patient data). Every call
is authenticated with a service API key and checked exactly as the HTTP routes check it: the key's role, its
tenant and its patient scope (a patient it may not see does not exist), then audited with the fragment ids it
disclosed. Over streamable HTTP the key travels in each request's `Authorization: Bearer ebm_…` header and a
request without a valid key is refused with 401 before MCP sees it; over stdio the key is given once when the
server starts (`--key` or EBMRAG_API_KEY). A bad argument or a refused call is a tool error, never a crash.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ebmrag.errors import EbmragError, require_extra

require_extra("mcp", "mcp", "ebmrag mcp")

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: E402

from ebmrag import __version__  # noqa: E402
from ebmrag.serve.models import bounded_text  # noqa: E402
from ebmrag.serve.problems import ProblemError  # noqa: E402
from ebmrag.serve.service import Service  # noqa: E402
from ebmrag.store import audit  # noqa: E402
from ebmrag.store.access import READ, SEARCH, AccessError, authenticate, require, valid_name  # noqa: E402
from ebmrag.store.patients import ApiKey  # noqa: E402

INSTRUCTIONS = ("Evidence-graded context for medical questions about one stored patient: patient_fragments lists a "
                "record with tiers, pack fits it into a token window keeping critical facts, ask answers with "
                "citations, search reads the shared knowledge base, ddx ranks diagnoses from findings.")


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

    def _ddx_parts(self) -> tuple[Any, Any]:
        """The condition knowledge base and the finding mapper, built once; the mapper shares the engine's model."""
        from ebmrag.compose import build_diagnoser, build_finding_mapper

        if self._ddx is None:
            diagnoser = build_diagnoser(self.service.settings)
            self._ddx = (diagnoser, build_finding_mapper(self.service.resources(), diagnoser))
        return self._ddx

    def patient_fragments(self, key: ApiKey, call: str, patient_id: str) -> dict[str, Any]:
        record = self._record(key, patient_id)
        classified = self.service.locked(lambda: self.service.classify(record))()
        self._audit(key, patient_id, "read", call, tuple(f.id for f in classified.fragments))
        return {"patient": patient_id, "fragments": [
            {"id": f.id, "text": f.text, "section": f.section, "tier": f.tier.value,
             "timestamp": f.timestamp.isoformat() if f.timestamp else None,
             "must_keep": bool(f.decision and f.decision.must_keep)} for f in classified.fragments]}

    def pack(self, key: ApiKey, call: str, patient_id: str, question: str, window: int,
             strategy: str | None) -> dict[str, Any]:
        bounded_text("question", question)
        record = self._record(key, patient_id)
        result = self.service.locked(lambda: self.service.packer(strategy).run(record, question, window))()
        self._audit(key, patient_id, "pack", call, tuple(p.fragment_id for p in result.packed))
        return dict(result.to_json(), context=result.context)

    def ask(self, key: ApiKey, call: str, patient_id: str, question: str, window: int | None) -> dict[str, Any]:
        bounded_text("question", question)
        record = self._record(key, patient_id)
        result = self.service.locked(lambda: self.service.engine().ask(question, record, window))()
        self._audit(key, patient_id, "ask", call, tuple(i.id for i in result.items))
        data: dict[str, Any] = result.to_json()
        return data

    def search(self, key: ApiKey, call: str, query: str, k: int) -> list[dict[str, Any]]:
        require(key, SEARCH)
        bounded_text("query", query)
        try:
            retriever = self.service.locked(self.service.retriever)()
        except ProblemError as exc:
            raise ToolError(exc.detail) from None
        hits = self.service.locked(lambda: retriever.run(query, k))()
        self._audit(key, "", "search", call)
        return [h.to_json() for h in hits]

    def ddx(self, key: ApiKey, findings: list[str], age: int | None, sex: str | None) -> dict[str, Any]:
        from ebmrag.ddx.engine import complete_findings

        require(key, SEARCH)
        diagnoser, mapper = self.service.locked(self._ddx_parts)()
        mapped = self.service.locked(lambda: mapper.run(findings))()
        result = diagnoser.run(complete_findings(diagnoser.kb, {m.code: m.present for m in mapped}, False), age,
                               (sex or "").upper() or None)
        return {**result.to_json(), "mapped": [{"code": m.code, "present": m.present, "text": m.clause}
                                               for m in mapped]}


def build_mcp_server(service: Service, stdio_key: str | None = None) -> MCPServer:
    """The MCP server over `service`. `stdio_key` authenticates every call that arrives without HTTP headers."""
    tools, server = McpTools(service), MCPServer("ebmrag", instructions=INSTRUCTIONS, version=__version__)

    def caller(ctx: Context) -> tuple[ApiKey, str]:
        """The calling key, authenticated and held to the service's per-key rate limit ([serve] rate_*)."""
        headers = ctx.headers
        header = headers.get("authorization") if headers is not None else (f"Bearer {stdio_key}" if stdio_key
                                                                           else None)
        key = authenticate(service.store, header)
        wait = service.limiter.take(key.key_id)
        if wait > 0:
            raise AccessError(429, f"more than {service.settings.serve.rate_per_second:g} calls per second for "
                                   f"this key; retry in {max(1, round(wait))} s")
        return key, f"mcp-{ctx.request_id}.{uuid.uuid4().hex[:12]}"  # JSON-RPC ids repeat per session

    def guarded(work: Callable[[], Any]) -> str:
        try:
            return json.dumps(work(), ensure_ascii=False)
        except AccessError as exc:
            raise ToolError(f"{exc.status}: {exc.detail}") from None
        except (EbmragError, ValueError) as exc:
            raise ToolError(str(exc)) from None

    @server.tool(description="A stored patient's record fragments with their evidence tiers and must-keep flags.")
    def patient_fragments(patient_id: str, ctx: Context) -> str:
        return guarded(lambda: tools.patient_fragments(*caller(ctx), patient_id))

    @server.tool(description="Pack a stored patient's record into a token window for a question (EBM-Pack): every "
                             "fragment packed full or compressed, or dropped, with its reason.")
    def pack(patient_id: str, question: str, ctx: Context, window: int = 2048, strategy: str | None = None) -> str:
        return guarded(lambda: tools.pack(*caller(ctx), patient_id, question, window, strategy))

    @server.tool(description="Answer a clinical question about a stored patient with cited evidence and a trace.")
    def ask(patient_id: str, question: str, ctx: Context, window: int | None = None) -> str:
        return guarded(lambda: tools.ask(*caller(ctx), patient_id, question, window))

    @server.tool(description="Search the shared medical knowledge base (hybrid BM25 + dense).")
    def search(query: str, ctx: Context, k: int = 5) -> str:
        if not 1 <= k <= 50:
            raise ToolError(f"k must be between 1 and 50, got {k}")
        return guarded(lambda: tools.search(*caller(ctx), query, k))

    @server.tool(description="Rank diagnoses by posterior from findings in words ('fever', 'no cough') or codes.")
    def ddx(findings: list[str], ctx: Context, age: int | None = None, sex: str | None = None) -> str:
        if not findings:
            raise ToolError("give at least one finding")
        return guarded(lambda: tools.ddx(caller(ctx)[0], findings, age, sex))

    return server


class RequireKey:
    """ASGI guard for the HTTP transport: a request without a valid API key gets 401 before MCP reads it."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                authenticate(self.service.store, headers.get("authorization"))
            except AccessError as exc:
                await _problem(send, exc.status, exc.detail)
                return
        await self.app(scope, receive, send)


async def _problem(send: Callable[[MutableMapping[str, Any]], Awaitable[None]], status: int, detail: str) -> None:
    body = json.dumps({"type": "about:blank", "title": "unauthorized", "status": status, "detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/problem+json"),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})


def http_app(service: Service) -> ASGIApp:
    """The streamable HTTP transport at /mcp, guarded by the service's keys."""
    server = build_mcp_server(service)
    return RequireKey(server.streamable_http_app(host="127.0.0.1"), service)
