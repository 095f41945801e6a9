"""Probes of who may reach what: bodies without a key, bad keys, other tenants' and patients' ids in every
disguise, the /ui session, MCP over HTTP, and the audit of every refusal (bench/probe_service.py runs them)."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlencode

from probe_inputs import id_tricks
from probe_kit import REFUSED, Caller, Reply
from probe_world import QUESTION, TENANT_A, McpSession, World, cookies_of, forms, ui_sign_in, v1_routes

RSS_LIMIT_MB = 100.0
FORGED_KEY = "ebm_000000000000_" + "A" * 43


def _chunks(megabytes: int, first: bytes = b'{"question": "') -> Iterator[bytes]:
    block = b" " * 2**20
    yield first + block[len(first):]
    for _ in range(megabytes - 1):
        yield block


# ---------------------------------------------------------------------------------------------- bodies


def unauthenticated_bodies(world: World) -> None:
    """Hundreds of megabytes, chunked or declared, without a (valid) key on every /v1 route, /ui and /mcp: the
    server answers before reading them, and its resident memory does not grow (issue 32 finding 1)."""
    klass, target, run = "unauth-bodies", world.target, world.run
    caller, huge_mb = world.caller("anonymous", klass), world.run.huge_mb
    routes = [(m, p, target.url) for m, p in v1_routes(world)] + [("POST", "/ui/login", target.url),
                                                                 ("POST", "/ui/patients/p1/ask", target.url)]
    if target.mcp_url:
        routes.append(("POST", "/mcp", target.mcp_url))
    variants: dict[str, tuple[list[tuple[bytes, bytes]], bool]] = {
        "chunked-no-key": ([], True), "declared-length-no-key": ([], False),
        "chunked-forged-key": ([(b"Authorization", f"Bearer {FORGED_KEY}".encode())], True),
        "chunked-basic-auth": ([(b"Authorization", b"Basic dXNlcjpwYXNz")], True),
        "chunked-key-as-cookie": ([(b"Cookie", f"ebmrag_key={world.keys['a_service']}".encode())], True)}
    allowed = 4 * 2**20 + 2 * int(target.max_body_mb * 2**20)  # socket buffers, then at most the limit twice
    before = peak = target.rss_mb()
    for (method, path, url), name in run.take(klass, list(itertools.product(routes, variants))):
        headers, chunked = variants[name]
        reply = caller.raw(method, path.encode(), [(b"Content-Type", b"application/json"), *headers],
                           _chunks(huge_mb), chunked=chunked, length=None if chunked else huge_mb * 2**20,
                           authorized=False, timeout=60, url=url)
        probe = f"{name} {method} {path}"
        run.check(reply, klass, probe, None, lambda r: "" if r.status >= 400 else f"accepted ({r.status})")
        if reply.sent_bytes > allowed:
            run.fail(klass, probe, reply.status, f"read {reply.sent_bytes / 2**20:.0f} MB before answering")
        peak = max(peak, target.rss_mb())
    after = target.rss_mb()
    growth = max(after, peak) - before
    run.measures["rss"] = (f"{before:.0f} MB before, {peak:.0f} MB peak, {after:.0f} MB after "
                           f"({growth:+.0f} MB; limit {RSS_LIMIT_MB:.0f} MB)")
    if growth >= RSS_LIMIT_MB:
        run.fail(klass, "rss", 0, f"the server grew by {growth:.0f} MB for unauthenticated traffic")
    _over_limit_with_key(world, klass, huge_mb)


def _body_routes(world: World) -> list[tuple[str, str]]:
    return [(m, p) for m, p in v1_routes(world) if m in ("POST", "PUT", "PATCH")]


def _over_limit_with_key(world: World, klass: str, huge_mb: int) -> None:
    """A valid key does not buy an unbounded body: past [serve] max_body_mb the answer is 413."""
    caller = world.caller("a_service", "body-limits")  # not the address the anonymous bodies were throttled on
    megabytes = min(huge_mb, int(world.target.max_body_mb * 3) + 1)
    for method, path in world.run.take(klass, _body_routes(world)):
        reply = caller.raw(method, path.encode(), [(b"Content-Type", b"application/json")], _chunks(megabytes),
                           chunked=True, timeout=60)
        world.run.check(reply, klass, f"over-limit-with-key {method} {path}", caller, {413})


# ---------------------------------------------------------------------------------------------- bad keys


def bad_keys(world: World, burst: int = 45) -> None:
    """Keys guessed at network speed are throttled per address (429 with Retry-After) and every attempt is
    audited; neither another address nor a valid key from the same address is locked out (finding 10, issue 43)."""
    klass, run = "bad-keys", world.run
    caller = world.caller("anonymous", klass)
    valid = world.keys["a_service"]
    revoked = world.target.new_key(TENANT_A, "clinician", ())
    world.target.revoke(revoked)
    key_id = valid.split("_")[1]
    attempts = {  # the Authorization header sent ("": none)
        "empty-bearer": "Bearer ", "malformed": "Bearer ebm_x", "wrong-secret": f"Bearer ebm_{key_id}_{'B' * 43}",
        "unknown-id": f"Bearer {FORGED_KEY}", "revoked": f"Bearer {revoked}", "token-scheme": f"Token {valid}",
        "two-keys": f"Bearer {valid}, Bearer {valid}", "basic": "Basic dXNlcjpwYXNz", "none": "",
        "nul-after-key": f"Bearer {valid}\x00", "key-as-cookie": ""}
    paths = ["/v1/patients/p1/fragments", "/v1/kb/stats", "/v1/patients/p2/fragments?api_key=" + valid]
    statuses = []
    for n, (form, path) in enumerate(zip(itertools.cycle(attempts), itertools.cycle(paths), strict=False)):
        if n >= burst or run.left(klass) <= 0:
            break
        headers = [(b"Authorization", attempts[form].encode())] if attempts[form] else []
        if form == "key-as-cookie":
            headers = [(b"Cookie", f"ebmrag_key={valid}; ebmrag_session={valid}".encode())]
        reply = caller.raw("GET", path.encode(), headers, authorized=False)
        statuses.append(reply.status)
        refused = {400, 401, 429} if "nul" in form else {401, 429}  # uvicorn refuses a NUL in a header itself
        run.check(reply, klass, f"{form} {path.split('?')[0]}", None, refused)
        if reply.status == 429 and not reply.headers.get("retry-after"):
            run.fail(klass, f"{form} retry-after", 429, "429 without Retry-After", reply.text)
    if len(statuses) >= 30 and 429 not in statuses:
        run.fail(klass, "throttling", 401, f"{len(statuses)} bad keys from one address, none throttled (429)")
    elif 429 in statuses and statuses.index(429) > 30:
        run.fail(klass, "throttling", 429, f"throttled only after {statuses.index(429)} bad keys")
    elsewhere = world.caller("a_service", "other-address")
    run.check(elsewhere.call("GET", "/v1/patients/p1/fragments"), klass, "valid key from another address",
              elsewhere, {200})
    same = world.caller("a_service", klass)
    run.check(same.call("GET", "/v1/patients/p1/fragments"), klass, "valid key from the throttled address", same,
              {200})


# ---------------------------------------------------------------------------------------------- isolation

HEADER_TRICKS: list[dict[str, str]] = [
    {}, {"X-Tenant": TENANT_A}, {"X-Tenant-ID": TENANT_A, "X-Patient-ID": "p2"},
    {"Forwarded": "for=127.0.0.1;host=internal"}, {"X-Original-URL": "/v1/patients/p2/fragments"},
    {"X-Rewrite-URL": "/v1/patients/p2/fragments"}, {"X-HTTP-Method-Override": "GET"},
    {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"}]
ATTACKERS = {"b_admin": ("p1", "p2"), "b_clinician": ("p1", "p2"), "b_service": ("p1", "p2"), "a_limited": ("p2",)}


def isolation(world: World) -> None:
    """Another tenant's or another patient's record through every route, id trick, header and body field: not a
    marker leaks (checked on every answer by Run.check), and nothing of tenant A's changes."""
    klass, run = "isolation", world.run
    cases = [(who, pid, trick) for who, pids in ATTACKERS.items() for pid in pids for trick in id_tricks(pid, TENANT_A)]
    routes = ["fragments", "ask", "pack", "ui", "append", "mcp"]
    sessions = {who: _ui_session(world, who, klass) for who in ATTACKERS}
    mcp = {who: _mcp_session(world, who, klass) for who in ATTACKERS} if world.target.mcp_url else {}
    erasures = []
    for n, (who, pid, (trick, segment)) in enumerate(run.take(klass, cases)):
        caller, extra = world.caller(who, klass), HEADER_TRICKS[n % len(HEADER_TRICKS)]
        for route in ("fragments", routes[n % len(routes)]):
            _attempt(world, caller, route, segment, extra, f"{who}->{pid} {trick} {route}", sessions[who],
                     mcp.get(who))
        if who == "b_admin":
            erasures.append((caller, segment, f"{who}->{pid} {trick} erase"))
    _body_fields(world, klass)
    for caller, segment, probe in erasures:  # last: an erasure that worked on B's own p1 must not hide others
        reply = caller.raw("DELETE", b"/v1/patients/" + segment)
        run.check(reply, klass, probe, caller)
    _tenant_a_intact(world, klass)


def _attempt(world: World, caller: Caller, route: str, segment: bytes, extra: dict[str, str], probe: str,
             session: dict[str, str], mcp: McpSession | None) -> None:
    headers = [(k.encode(), v.encode()) for k, v in extra.items()]
    json_type = [(b"Content-Type", b"application/json")]
    base = b"/v1/patients/" + segment
    if route == "fragments":
        reply = caller.raw("GET", base + b"/fragments", headers)
    elif route == "ask":
        reply = caller.raw("POST", base + b"/ask", [*headers, *json_type], b'{"question": "%s"}' % QUESTION.encode())
    elif route == "pack":
        reply = caller.raw("POST", base + b"/pack", [*headers, *json_type], b'{"query": "allergy", "window": 512}')
    elif route == "append" and caller.name != "b_clinician" and caller.name != "a_limited":
        body = b'{"patient_id": "x", "fragments": [{"id": "probe-append", "text": "Weight 70 kg."}]}'
        reply = caller.raw("POST", base + b"/fragments", [*headers, *json_type], body)
    elif route == "ui" and session:
        cookie = "; ".join(f"{k}={v}" for k, v in session.items()).encode()
        reply = caller.raw("GET", b"/ui/patients/" + segment, [*headers, (b"Cookie", cookie)], authorized=False)
    elif route == "mcp" and mcp is not None:
        reply, _ = mcp.tool("patient_fragments", {"patient_id": unquote(segment.decode())})
    else:
        return
    world.run.check(reply, "isolation", probe, caller)


def _ui_session(world: World, who: str, klass: str) -> dict[str, str]:
    reply, cookies = ui_sign_in(world.caller(who, klass), world.keys[who])
    return cookies if reply.status in (200, 303) else {}


def _mcp_session(world: World, who: str, klass: str) -> McpSession:
    session = McpSession(world.caller(who, klass), world.target.mcp_url)
    session.open()
    return session


def _body_fields(world: World, klass: str) -> None:
    """Body fields naming another tenant or patient: refused or ignored, never obeyed."""
    run = world.run
    message = {"tenant": TENANT_A, "patient_id": "p1", "result_id": "probe-cross", "kind": "lab",
               "producer": "probe", "produced_at": "2026-03-14T08:00:00Z", "text": "Potassium 2.1 mmol/L."}
    b_feed, a_limited = world.caller("b_service", klass), world.caller("a_limited_service", klass)
    b_ask = {"question": QUESTION, "tenant": TENANT_A, "patient_id": "p2"}
    for caller, method, path, body, probe in [
        (b_feed, "POST", "/v1/results", [message], "results naming tenant A"),
        (a_limited, "POST", "/v1/results", [dict(message, patient_id="p2")],
         "results naming a patient outside the key"),
        (a_limited, "POST", "/v1/patients/p1/fragments", {"patient_id": "p2", "fragments": [
            {"id": "probe-owner", "text": "Weight 71 kg.", "patient_id": "p2"}]}, "fragments naming another patient"),
        (b_feed, "POST", "/v1/patients/p1/ask", b_ask, "ask body naming tenant A"),
        (b_feed, "POST", "/v1/patients/p1/pack", {"query": "allergy", "window": 512, "tenant": TENANT_A},
         "pack body naming tenant A"),
    ]:
        if run.left(klass) > 0:
            run.check(caller.call(method, path, json_body=body), klass, probe, caller)


def _tenant_a_intact(world: World, klass: str) -> None:
    owner = world.caller("a_service", klass)
    for (tenant, pid), record in world.seeded.items():
        if tenant != TENANT_A:
            continue
        reply = owner.call("GET", f"/v1/patients/{pid}/fragments")
        stored = {f["id"]: f["text"] for f in (reply.json() or {}).get("fragments", [])}
        for fragment in record["fragments"]:
            if stored.get(fragment["id"]) != fragment["text"]:
                world.run.fail(klass, f"{tenant}/{pid} after the attacks", reply.status,
                               f"fragment {fragment['id']} changed or gone", reply.text)
        planted = {"result:probe:probe-cross", "probe-append"} | ({"probe-owner"} if pid == "p2" else set())
        foreign = sorted(planted & set(stored))  # p1's own limited key may write p1 ("probe-owner")
        if foreign:
            world.run.fail(klass, f"{tenant}/{pid} after the attacks", reply.status,
                           f"written by another key: {foreign}")


# ---------------------------------------------------------------------------------------------- /ui


SECURITY_HEADERS: dict[str, Callable[[dict[str, str]], bool]] = {
    "x-frame-options or CSP frame-ancestors": lambda h: h.get("x-frame-options", "").upper() in ("DENY", "SAMEORIGIN")
    or "frame-ancestors" in h.get("content-security-policy", ""),
    "content-security-policy": lambda h: bool(h.get("content-security-policy")),
    "cache-control: no-store": lambda h: "no-store" in h.get("cache-control", ""),
}
EVIL = "http://evil.example"


def ui(world: World) -> None:
    """The /ui session: security headers, a cookie that is not the key and expires, sign-out that ends the
    session on the server, and no cross-origin POST (sign-in CSRF included) (finding 8)."""
    klass, run = "ui", world.run
    browser = world.caller("a_service", klass)  # a browser of tenant A's user: no Authorization header is sent
    key = world.keys["a_service"]
    home = browser.call("GET", "/ui", authorized=False)
    run.check(home, klass, "GET /ui", browser, {200})
    _headers_present(world, klass, "GET /ui", home)
    login, cookies = ui_sign_in(browser, key)
    run.check(login, klass, "same-origin sign-in", browser, {200, 303})
    _cookie_rules(world, klass, login, key)
    page = browser.call("GET", "/ui/patients/p1", cookies=cookies, authorized=False)
    run.check(page, klass, "patient page after sign-in", browser, {200})
    _headers_present(world, klass, "GET /ui/patients/p1", page)
    for name in {*cookies_of(login), "ebmrag_key"}:
        raw_key = browser.call("GET", "/ui/patients/p1", cookies={name: key}, authorized=False)
        run.check(raw_key, klass, f"the raw API key as cookie {name}", browser,
                  lambda r: "the raw API key works as a /ui session" if r.status == 200 else "")
    ask_form = next(((a, h) for a, h in forms(page.text) if a.endswith("/ask")), ("/ui/patients/p1/ask", {}))
    same = _post_form(browser, ask_form[0], {**ask_form[1], "question": QUESTION}, cookies, world.target.url)
    run.check(same, klass, "same-origin ask with the page's form", browser, {200})
    session_names = set(cookies_of(login))
    cross_site = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"}
    for probe, headers in [("Origin: evil", {"Origin": EVIL}), ("Origin: null", {"Origin": "null"}),
                           ("Origin: evil, Sec-Fetch-Site: cross-site", cross_site)]:
        cross = _post_form(browser, "/ui/login", {"key": key}, {}, "", headers)
        run.check(cross, klass, f"cross-origin sign-in ({probe})", browser,
                  lambda r: "a cross-origin sign-in was accepted" if r.status < 400 or session_names & set(
                      cookies_of(r)) else "")
        ask = _post_form(browser, "/ui/patients/p1/ask", {"question": QUESTION}, cookies, "", headers)
        run.check(ask, klass, f"cross-origin ask ({probe})", browser,
                  lambda r: "a cross-origin POST was accepted" if r.status < 400 else "")
    _sign_out(world, klass, browser, cookies)


def _post_form(browser: Caller, action: str, fields: dict[str, str], cookies: dict[str, str], origin: str,
               headers: dict[str, str] | None = None) -> Reply:
    sent = {"Content-Type": "application/x-www-form-urlencoded", **({"Origin": origin} if origin else {}),
            **(headers or {})}
    return browser.call("POST", action, content=urlencode(fields).encode(), cookies=cookies, authorized=False,
                        headers=sent)


def _headers_present(world: World, klass: str, probe: str, reply: Reply) -> None:
    for name, present in SECURITY_HEADERS.items():
        if not present(reply.headers):
            world.run.fail(klass, probe, reply.status, f"missing {name}")


def _cookie_rules(world: World, klass: str, login: Reply, key: str) -> None:
    secret = key.split("_", 2)[2]  # ebm_<hex id>_<secret>: the secret itself may hold "_"
    set_now = [c for c in login.set_cookies if c.split(";")[0].partition("=")[0].strip() in cookies_of(login)]
    if not set_now:
        world.run.fail(klass, "sign-in cookie", login.status, "no cookie set", login.text)
    for cookie in set_now:
        attributes = cookie.lower()
        problems = [what for what, bad in [
            ("holds the API key", secret in cookie), ("not HttpOnly", "httponly" not in attributes),
            ("no SameSite", "samesite" not in attributes),
            ("never expires (no Max-Age or Expires)", "max-age" not in attributes and "expires" not in attributes)]
            if bad]
        for problem in problems:
            world.run.fail(klass, "sign-in cookie", login.status, f"the cookie {problem}",
                           cookie.replace(secret, "<secret>"))


def _sign_out(world: World, klass: str, browser: Caller, cookies: dict[str, str]) -> None:
    """Sign out with the signed-in page's own sign-out form (its CSRF token included); the old cookie must
    then be worthless on the server, not only cleared in the browser."""
    run = world.run
    home = browser.call("GET", "/ui", cookies=cookies, authorized=False)
    found = [(a, h) for a, h in forms(home.text) if re.search(r"log-?out|sign-?out", a)]
    candidates = found or [("/ui/logout", {}), ("/ui/signout", {}), ("/ui/sign-out", {})]
    for action, hidden in candidates:
        reply = _post_form(browser, action, hidden, cookies, world.target.url)
        if reply.status in (404, 405):
            continue
        run.check(reply, klass, f"sign-out POST {action}", browser, lambda r: "" if r.status < 400 else
                  "the page's own sign-out form was refused")
        after = browser.call("GET", "/ui/patients/p1", cookies=cookies, authorized=False)
        run.check(after, klass, "the session cookie after sign-out", browser,
                  lambda r: "the session still works after sign-out" if r.status == 200 else "")
        return
    run.fail(klass, "sign-out", 404, "no sign-out form or route (/ui/logout, /ui/signout, /ui/sign-out)")


# ---------------------------------------------------------------------------------------------- MCP


def mcp(world: World, burst: int = 35) -> None:
    """MCP over HTTP meets the HTTP API's limits: key checks, throttling of bad keys, 4,000-character
    queries, bounded bodies and nesting (finding 13)."""
    klass, run = "mcp", world.run
    if not world.target.mcp_url:
        run.note("no MCP server in this run (ebmrag serve does not mount /mcp): class mcp skipped")
        return
    session = McpSession(world.caller("a_service", klass), world.target.mcp_url)
    run.check(session.open(), klass, "initialize", session.caller, {200})
    huge = "penicillin " * 100_000
    calls: list[tuple[str, dict[str, Any]]] = [
        ("search", {"query": "x" * 4001}), ("search", {"query": huge}), ("ask", {"patient_id": "p1", "question": huge}),
        ("pack", {"patient_id": "p1", "question": huge, "window": 512}),
        ("patient_fragments", {"patient_id": "p1" + "\u0000"}), ("ddx", {"findings": ["fever"] * 100_000})]
    for tool, arguments in calls:
        if run.left(klass) <= 0:
            break
        reply, result = session.tool(tool, arguments)
        size = max(len(str(value)) for value in arguments.values())
        accepted = result is not None and not result.get("isError")
        run.check(reply, klass, f"{tool} with a {size:,}-character argument", session.caller)
        if accepted:
            run.fail(klass, f"{tool} with a {size:,}-character argument", reply.status, "accepted", reply.text)
    deep = b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    reply = session.caller.call("POST", "", content=deep, base=world.target.mcp_url,
                                headers={**session.headers(), "Content-Type": "application/json"})
    run.check(reply, klass, "JSON nested 100,000 deep", session.caller)
    _mcp_bad_keys(world, klass, burst)


def _mcp_bad_keys(world: World, klass: str, burst: int) -> None:
    run = world.run
    anonymous = McpSession(world.caller("anonymous", "mcp-bad-keys"), world.target.mcp_url)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    statuses = []
    for n in range(burst):
        headers = {"Authorization": f"Bearer ebm_{n:012x}_{'C' * 43}"} if n % 2 else {}
        reply = anonymous.post(message, headers=headers, authorized=False)
        statuses.append(reply.status)
        run.check(reply, klass, "bad key" if n % 2 else "no key", None, {401, 429})
    if 429 not in statuses:
        run.fail(klass, "throttling", 401, f"{burst} bad keys on /mcp from one address, none throttled (429)")


# ---------------------------------------------------------------------------------------------- audit


def audit(world: World) -> None:
    """Every refused answer (401/403/404/413/429) has its audit row, found by the X-Request-ID it carried (a 429 after
    the first of its burst is counted in the burst's summary row instead, issue 43); the stored request ids are
    bounded and hold no names; the chain verifies (finding 7)."""
    klass, run = "audit", world.run
    if world.target.settle:
        world.target.settle()
    rows = world.target.audit_rows()
    actions_of: dict[str, list[str]] = {}  # request id -> the actions audited under it
    for row in rows:
        actions_of.setdefault(str(row[6]), []).append(str(row[5]))
    seen_ids = set(run.request_ids)
    missing: dict[tuple[int, str, str], list[str]] = {}
    without_id: dict[tuple[int, str, str], list[str]] = {}
    summarised = sum(int(m.group(1)) for row in rows for m in [_SUMMARISED.search(str(row[5]))] if m)
    for refusal in run.refusals:
        run.probes[klass] += 1
        group = (refusal.status, _route_kind(refusal.path), refusal.detail)
        if not refusal.request_id:
            without_id.setdefault(group, []).append(f"{refusal.klass}: {refusal.probe}")
        elif not any(f"refused {refusal.status}" in a for a in actions_of.get(refusal.request_id, [])):
            if refusal.status == 429 and summarised > 0:  # a throttled attempt counted in its burst's summary row
                summarised -= 1
                continue
            missing.setdefault(group, []).append(f"{refusal.klass}: {refusal.probe}")
    for (status, kind, detail), probes in sorted(missing.items()):
        run.fail(klass, f"{kind} ({detail or 'no detail'})", status,
                 f"{len(probes)} refused {status} answers without an audit row", "e.g. " + "; ".join(probes[:3]))
    orphans = Counter(int(match.group(1)) for rid, actions in actions_of.items() if rid not in seen_ids
                      for match in (_REFUSED_ACTION.search(a) for a in actions) if match)
    for (status, kind, detail), probes in sorted(without_id.items()):
        run.fail(klass, f"{kind} ({detail or 'no detail'})", status,
                 f"{len(probes)} refused {status} answers carry no X-Request-ID ({orphans[status]} audit rows "
                 "of that status match no answer)", "e.g. " + "; ".join(probes[:3]))
    _stored_ids(world, klass, rows)
    problems = world.target.audit_intact() if world.target.audit_intact else []
    for problem in problems[:5]:
        run.fail(klass, "ebmrag audit verify", 0, problem)
    run.measures["audit"] = (f"{len(run.refusals)} refused answers, {sum(map(len, missing.values()))} without a "
                             f"row, {sum(map(len, without_id.values()))} without X-Request-ID; {len(rows)} audit rows")


_REFUSED_ACTION = re.compile(r"refused (\d{3})")
_SUMMARISED = re.compile(r"^refused 429 \S+: (\d+) more from ")  # serve.throttle.ThrottledAudit's summary rows


def _route_kind(path: str) -> str:
    parts = path.split("?")[0].strip("/").split("/")
    if parts[0] == "v1" and len(parts) >= 3 and parts[1] == "patients":
        return "/v1/patients/{pid}" + ("/" + parts[-1] if len(parts) > 3 else "")
    return "/" + "/".join(parts[:2])


def _stored_ids(world: World, klass: str, rows: list[tuple[Any, ...]]) -> None:
    from probe_inputs import PHI_IN_REQUEST_IDS

    run = world.run
    for row in rows:
        request_id = str(row[6])
        if len(request_id) > 128 or any(p in request_id for p in PHI_IN_REQUEST_IDS):
            run.fail(klass, "stored request id", 0, f"an audit row keeps a request id of {len(request_id):,} "
                                                    "characters or with a name", request_id)
            break
    mcp_ids = Counter(str(r[6]) for r in rows if str(r[5]).startswith("mcp:"))
    repeated = [rid for rid, n in mcp_ids.items() if n > 1]
    if repeated:
        run.fail(klass, "MCP request ids", 0, f"{len(repeated)} MCP request ids repeat", repeated[0])
    repeated_answers = [rid for rid, n in run.request_ids.items() if n > 1]
    if repeated_answers:
        run.fail(klass, "X-Request-ID", 0, f"{len(repeated_answers)} request ids were given to two answers",
                 repeated_answers[0])
    run.probes[klass] += 1
    if not any(status in REFUSED for status in (r.status for r in run.refusals)):
        run.note("no refused answer was seen; the audit class checked nothing")
