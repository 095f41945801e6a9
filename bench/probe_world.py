"""The planted world a probe run attacks: tenants, keys, records with unique markers, a /ui sign-in and an MCP
session, all made through the server's own API so each backend is seeded the same way.

Tenant `probe-a` holds p1 and p2, tenant `probe-b` holds its own p1; every fragment carries a marker string
that belongs to exactly one (tenant, patient), so `Run.check` can tell a leak from any answer to any caller.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from probe_kit import Caller, Reply, Run, Target

TENANT_A, TENANT_B, TENANT_INJ = "probe-a", "probe-b", "probe-inj"
QUESTION = "Which antibiotic is safe given his allergy and kidney function?"
KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {  # name -> tenant, role, patients
    "a_service": (TENANT_A, "service", ()), "a_admin": (TENANT_A, "admin", ()),
    "a_limited": (TENANT_A, "clinician", ("p1",)), "a_limited_service": (TENANT_A, "service", ("p1",)),
    "b_admin": (TENANT_B, "admin", ()), "b_service": (TENANT_B, "service", ()),
    "b_clinician": (TENANT_B, "clinician", ()), "inj_service": (TENANT_INJ, "service", ()),
}
SOURCES = {"setup": 1, "unauth-bodies": 10, "bad-keys": 11, "isolation": 12, "injection": 13, "deep-json": 14,
           "fhir": 15, "control-chars": 16, "request-ids": 17, "idempotency": 18, "record-fields": 19, "wait-ms": 20,
           "kb-doc-ids": 21, "mcp": 22, "ui": 23, "audit": 24, "mcp-bad-keys": 25, "other-address": 26,
           "body-limits": 27}


class SetupError(RuntimeError):
    """The world could not be planted: the run of this backend cannot say anything."""


def chart(patient: str, marker: str) -> dict[str, Any]:
    """A small record whose every fragment names `marker` (in its text, and one in its id)."""
    return {"patient_id": patient, "fragments": [
        {"id": "allergy", "text": f"Anaphylaxis to penicillin in 2014, band {marker}.", "section": "Allergies",
         "timestamp": "2026-03-01T09:00:00Z"},
        {"id": f"lab-{marker}", "text": f"Creatinine 2.8 mg/dL, up from 1.1 mg/dL, sample {marker}.",
         "section": "Labs", "timestamp": "2026-03-14T08:00:00Z"},
        {"id": "note", "text": f"Wound red and warm since yesterday, temperature 38.6 C, bed {marker}.",
         "section": "Progress note", "timestamp": "2026-03-14T09:00:00Z"}]}


@dataclass
class World:
    target: Target
    run: Run
    keys: dict[str, str] = field(default_factory=dict)
    seeded: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (tenant, pid) -> record
    _callers: dict[tuple[str, str], Caller] = field(default_factory=dict)

    def key_spec(self, name: str) -> tuple[str, str, tuple[str, ...]]:
        if name == "kb_admin":
            return self.target.kb_admin_tenant, "admin", ()
        return KEYS[name]

    def caller(self, name: str, klass: str) -> Caller:
        """The key `name` (or "anonymous") acting from the loopback address of `klass`."""
        cached = self._callers.get((name, klass))
        if cached is None:
            source = f"127.0.0.{SOURCES.get(klass, 1)}"
            if name == "anonymous":
                cached = Caller(self.target, name, source=source)
            else:
                tenant, _, patients = self.key_spec(name)
                cached = Caller(self.target, name, self.keys[name], tenant, patients, source=source)
            self._callers[(name, klass)] = cached
        return cached

    def close(self) -> None:
        for caller in self._callers.values():
            caller.close()

    def marker(self, code: str) -> str:
        return f"MRK{code}{self.run.rng.randrange(10**8):08d}"


def plant(target: Target, run: Run) -> World:
    """Keys, markers and records; the engine warmed (a cold first ask loads the models) so that what the
    probes measure, RSS included, is the server's answer to them and not its start-up."""
    world = World(target, run)
    for name in [*KEYS, "kb_admin"]:
        tenant, role, patients = world.key_spec(name)
        world.keys[name] = target.new_key(tenant, role, patients)
    for (tenant, pid), code in {(TENANT_A, "p1"): "a1", (TENANT_A, "p2"): "a2", (TENANT_B, "p1"): "b1"}.items():
        marker = world.marker(code)
        run.plant(marker, tenant, pid)
        record = chart(pid, marker)
        feed = world.caller("a_service" if tenant == TENANT_A else "b_service", "setup")
        put = feed.call("PUT", f"/v1/patients/{pid}", json_body=record)
        if put.status != 200:
            raise SetupError(f"seeding {tenant}/{pid} answered {put.status}: {put.text[:200]}")
        world.seeded[(tenant, pid)] = record
    warm(world)
    return world


def warm(world: World, seconds: float = 120.0) -> None:
    feed = world.caller("a_service", "setup")
    deadline = time.monotonic() + seconds
    while True:
        reply = feed.call("POST", "/v1/patients/p1/ask", json_body={"question": QUESTION})
        if reply.status == 200:
            break
        if time.monotonic() > deadline or reply.status not in (503, 504, 0):
            raise SetupError(f"the warm-up ask answered {reply.status}: {reply.text[:200]}")
        time.sleep(2)
    feed.call("POST", "/v1/patients/p1/pack", json_body={"query": QUESTION, "window": 512})
    feed.call("POST", "/v1/search", json_body={"query": "penicillin allergy", "k": 3})
    world.caller("kb_admin", "setup").call("GET", "/v1/kb/stats")


def v1_routes(world: World) -> list[tuple[str, str]]:
    """Every (method, path) under /v1 in the server's OpenAPI, with its parameters filled in."""
    spec = world.caller("anonymous", "setup").call("GET", "/openapi.json").json() or {}
    routes = []
    for path, operations in sorted(spec.get("paths", {}).items()):
        if path.startswith("/v1/"):
            filled = re.sub(r"\{doc_id(:path)?\}", "guides/doc.md", path.replace("{pid}", "p1"))
            routes += [(method.upper(), filled) for method in operations if method in ("get", "post", "put",
                                                                                      "delete", "patch")]
    return routes


# ---------------------------------------------------------------------------------------------- /ui sign-in

_HIDDEN = re.compile(r"<input[^>]*type=[\"']?hidden[^>]*>", re.IGNORECASE)
_ATTR = re.compile(r"(name|value)=[\"']?([^\"' >]*)", re.IGNORECASE)


def hidden_fields(page: str) -> dict[str, str]:
    """The hidden inputs of a form (a CSRF token, when the sign-in form carries one)."""
    fields = {}
    for tag in _HIDDEN.findall(page):
        attrs = dict((k.lower(), v) for k, v in _ATTR.findall(tag))
        if "name" in attrs:
            fields[attrs["name"]] = attrs.get("value", "")
    return fields


_FORM = re.compile(r"<form[^>]*action=[\"']?([^\"' >]+)[^>]*>(.*?)</form>", re.IGNORECASE | re.DOTALL)


def forms(page: str) -> list[tuple[str, dict[str, str]]]:
    """(action, hidden fields) of every form on a page."""
    return [(action, hidden_fields(inner)) for action, inner in _FORM.findall(page)]


def cookies_of(reply: Reply) -> dict[str, str]:
    """The cookies an answer sets (a cleared one, empty or Max-Age=0, is left out)."""
    jar = {}
    for cookie in reply.set_cookies:
        name, _, rest = cookie.partition("=")
        value = rest.split(";")[0]
        if name.strip() and value and "max-age=0" not in cookie.lower().replace(" ", ""):
            jar[name.strip()] = value
    return jar


def ui_sign_in(caller: Caller, key: str, origin: str = "") -> tuple[Reply, dict[str, str]]:
    """Sign in as a browser would: open the form (its cookies and hidden fields), post the key from this
    server's own origin (or `origin`); returns the answer and the session cookies."""
    form = caller.call("GET", "/ui", authorized=False)
    jar = cookies_of(form)
    body = urlencode({**hidden_fields(form.text), "key": key}).encode()
    reply = caller.call("POST", "/ui/login", content=body, authorized=False, cookies=jar,
                        headers={"Content-Type": "application/x-www-form-urlencoded",
                                 "Origin": origin or caller.target.url})
    return reply, {**jar, **cookies_of(reply)}


# ---------------------------------------------------------------------------------------------- MCP


class McpSession:
    """JSON-RPC over MCP's streamable HTTP with plain HTTP calls (the answers of each call are checked like any
    other; the SDK's client would hide them)."""

    def __init__(self, caller: Caller, url: str) -> None:
        self.caller, self.url, self.session = caller, url, ""
        self._id = 0

    def headers(self) -> dict[str, str]:
        return {"Accept": "application/json, text/event-stream",
                **({"Mcp-Session-Id": self.session} if self.session else {})}

    def post(self, message: Any, headers: dict[str, str] | None = None, authorized: bool = True) -> Reply:
        return self.caller.call("POST", "", json_body=message, headers={**self.headers(), **(headers or {})},
                                authorized=authorized, base=self.url)

    def open(self) -> Reply:
        reply = self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "ebmrag-probe", "version": "1"}})
        self.session = reply.headers.get("mcp-session-id", "")
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def rpc(self, method: str, params: dict[str, Any]) -> Reply:
        self._id += 1
        return self.post({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})

    def tool(self, name: str, arguments: dict[str, Any]) -> tuple[Reply, dict[str, Any] | None]:
        reply = self.rpc("tools/call", {"name": name, "arguments": arguments})
        return reply, rpc_result(reply)


def rpc_result(reply: Reply) -> dict[str, Any] | None:
    """The JSON-RPC `result` of an answer sent as JSON or as server-sent events (None: an error or nothing)."""
    messages: Sequence[Any] = [reply.json()] if reply.headers.get("content-type", "").startswith(
        "application/json") else [json.loads(line[5:]) for line in reply.text.splitlines()
                                  if line.startswith("data:") and line[5:].strip()]
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("result"), dict):
            return dict(message["result"])
    return None
