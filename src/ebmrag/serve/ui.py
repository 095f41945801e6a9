"""`/ui`: a server-rendered trace viewer, no build step and no outside assets.

A clinician or engineer signs in with an API key, opens a patient — fragments by tier — asks a question, and
reads the result: the answer with citations linked to the cited line, the packed context in tier colours,
every dropped fragment with its reason, the gate's decision and the timings. Every piece of record text is
HTML-escaped: a note that contains markup is shown as text, never run.

The browser never holds the key. Signing in starts a server-side session (`store.sessions`): the cookie
carries a random token that ends at sign-out, after [serve] ui_session_hours, after ui_idle_minutes unused,
and as soon as its key is revoked. Every form that changes something (sign-in included) carries a
synchroniser token and is refused when the browser says it came from another site; a refusal is a 403 page
and an audit row. A failed sign-in counts toward the same per-address throttle as a bad key on /v1.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from ebmrag.serve.guard import ASGIApp, Message, Receive, Scope, Send
from ebmrag.serve.problems import client_address
from ebmrag.serve.service import Service, bounded_body
from ebmrag.serve.throttle import key_credential
from ebmrag.store.access import READ, AccessError, authenticate, require, valid_name
from ebmrag.store.keys import ApiKey
from ebmrag.store.sessions import UiSessions

COOKIE = "ebmrag_session"  # the session token
LOGIN_COOKIE = "ebmrag_login"  # the sign-in form's token, before there is a session
LEGACY_COOKIE = "ebmrag_key"  # where versions before sessions kept the key itself: cleared when seen
LOGIN_FORM_SECONDS = 15 * 60
CSRF_FIELD = "csrf"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
NOT_VALID = "the API key is not valid"  # the only thing a failed sign-in says, whatever was wrong with the key

APP_HEADERS = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}
CSP = ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
# same-origin, not no-referrer, on /ui: under no-referrer a browser sends `Origin: null` with the page's own form
# posts, and the cross-site check needs the real origin; the page's URL still never leaves this server
UI_HEADERS = {"x-frame-options": "DENY", "content-security-policy": CSP, "cache-control": "no-store",
              "referrer-policy": "same-origin"}

TIER_COLOURS = {"T1": "#b3261e", "T2": "#1f5fa8", "T3": "#2e7d32", "T4": "#6d6d6d"}
STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:70rem;margin:1.5rem auto;padding:0 1rem;color:#1b1b1b}
h1{font-size:1.3rem}h2{font-size:1.1rem;margin-top:1.6rem}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:.3rem .4rem;text-align:left;vertical-align:top}
.tier{font-weight:600;color:#fff;border-radius:3px;padding:0 .35rem}.ctx{font-family:ui-monospace,monospace;
white-space:pre-wrap;font-size:13px}.answer{white-space:pre-wrap;background:#f6f6f6;padding:.8rem}
form{margin:.6rem 0}input[type=text],input[type=password]{width:28rem;padding:.3rem}.muted{color:#666}
form.out{display:inline;margin:0 0 0 .6rem}
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


@dataclass(frozen=True)
class SignedIn:
    """A live session and the key it acts for."""

    key: ApiKey
    token: str

    @property
    def csrf(self) -> str:
        """The session's form token: derived from the session token, so nothing more is stored, and useless
        without the cookie (a page that leaks it leaks no session)."""
        return hmac.new(self.token.encode(), b"ebmrag /ui form", hashlib.sha256).hexdigest()


class UiError(Exception):
    """A refused /ui request: shown as a page and audited (under the key when there is one)."""

    def __init__(self, status: int, detail: str, key: ApiKey | None = None, patient: str = "",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.key, self.patient = status, detail, key, patient
        self.headers = headers or {}


def page(title: str, body: str, signed: SignedIn | None = None, status: int = 200) -> HTMLResponse:
    who = (f'<div class=muted>tenant {e(signed.key.tenant)} · role {e(signed.key.role)}'
           f'<form class=out method=post action="/ui/logout">{_csrf_input(signed.csrf)}'
           '<button type=submit>Sign out</button></form></div>') if signed else ""
    return HTMLResponse(f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>"
                        f"<style>{STYLE}</style></head><body><h1>ebmrag · {e(title)}</h1>{who}{body}</body></html>",
                        status)


def tier(value: str) -> str:
    return f'<span class=tier style="background:{TIER_COLOURS.get(value, "#444")}">{e(value)}</span>'


def _csrf_input(token: str) -> str:
    return f'<input type=hidden name={CSRF_FIELD} value="{e(token)}">'


async def form_fields(request: Request) -> dict[str, str]:
    """application/x-www-form-urlencoded without python-multipart; a form is small (64 KB at most)."""
    body = await bounded_body(request, limit=64 * 1024)
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def same_token(expected: str, given: str) -> bool:
    """Constant-time, and false for an empty expectation (a missing cookie is no token)."""
    return bool(expected) and hmac.compare_digest(expected.encode(), given.encode())


def cross_site(request: Request) -> bool:
    """The browser says the request comes from another site. Sec-Fetch-Site is the browser's own verdict;
    Origin must name this server as the client reached it (a proxy must pass the Host header through).
    Neither header is required: a client that sends neither is not a browser carrying a victim's cookies."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    return origin is not None and _authority(origin) != _authority("//" + request.headers.get("host", ""))


def _authority(url: str) -> str:
    """host:port, lower case, with the scheme's default port left out ("null" and garbage give "")."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ""
    default = {"http": 80, "https": 443}.get(parts.scheme)
    host = (parts.hostname or "").lower()
    return host if port is None or port == default or (not parts.scheme and port in (80, 443)) else f"{host}:{port}"


def security_headers(app: ASGIApp) -> ASGIApp:
    """Every response gets nosniff and no-referrer; every /ui response also may not be framed, runs no script
    and loads nothing from elsewhere (CSP), is not cached (it holds patient text), and names itself as referrer
    to this server only."""

    async def with_headers(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        wanted = {**APP_HEADERS, **(UI_HEADERS if path == "/ui" or path.startswith("/ui/") else {})}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.decode("latin-1").lower() not in wanted]
                message["headers"] = kept + [(k.encode(), v.encode()) for k, v in wanted.items()]
            await send(message)

        await app(scope, receive, send_with_headers)

    return with_headers


def install_security_headers(app: FastAPI) -> None:
    """Wrap the whole middleware stack, so the guard's own answers (401, 413, 429) and the last-resort 500
    carry the headers too; `add_middleware` would place the layer inside the guard."""
    build = app.build_middleware_stack

    def build_with_headers() -> ASGIApp:
        return security_headers(build())

    app.build_middleware_stack = build_with_headers  # type: ignore[method-assign]


def install_ui(app: FastAPI, service: Service, stored: Callable[..., Awaitable[Any]]) -> None:
    install_security_headers(app)
    store, serve = service.store, service.settings.serve
    sessions = UiSessions(store)
    lifetime, idle = timedelta(hours=serve.ui_session_hours), timedelta(minutes=serve.ui_idle_minutes)

    def resume(token: str) -> SignedIn | None:
        """The session of this token when it is alive and its key still in force (not revoked, not expired:
        `authenticate`'s checks after the secret); a dead one is removed."""
        found = sessions.find(token) if _TOKEN.fullmatch(token) else None
        if found is None:
            return None
        moment = datetime.now(UTC)
        key = store.key(found.key_id)
        if not found.alive(moment, idle) or key is None or key.revoked or key.expired(moment):
            sessions.end(token)
            return None
        sessions.touch(token, moment)
        return SignedIn(key, token)

    async def current(request: Request) -> SignedIn | None:
        return await run_in_threadpool(resume, request.cookies.get(COOKIE, ""))

    async def signed_in(request: Request, patient: str = "") -> SignedIn:
        """The session, or a 401 (the sign-in page); its key's request rate is limited as on /v1."""
        signed = await current(request)
        if signed is None:
            raise UiError(401, "sign in to continue (the session has ended, or there was none)", patient=patient)
        wait = service.limiter.take(signed.key.key_id)
        if wait > 0:
            raise UiError(429, "too many requests for this key; try again shortly", signed.key, patient,
                          {"Retry-After": str(max(1, round(wait)))})
        return signed

    def refuse_forged(request: Request, fields: dict[str, str], expected: str, key: ApiKey | None,
                      patient: str = "") -> None:
        """403 unless the form carries the expected token and the browser does not call it cross-site."""
        if cross_site(request) or not same_token(expected, fields.get(CSRF_FIELD, "")):
            raise UiError(403, "this form is out of date or did not come from this site; open /ui and try again",
                          key, patient)

    def secure(request: Request) -> bool:
        return serve.ui_secure_cookie or request.url.scheme == "https"

    def sign_in_page(request: Request, message: str = "", status: int = 200) -> Response:
        """The form with a fresh pre-session token (or the one the browser holds, so two tabs both work), bound
        to a short-lived cookie; a dead session's cookie and a legacy key cookie are cleared."""
        held = request.cookies.get(LOGIN_COOKIE, "")
        form_token = held if _TOKEN.fullmatch(held) else secrets.token_urlsafe(32)
        notice = f"<p role=alert>{e(message)}</p>" if message else ""
        response = page("sign in", f'{notice}<form method=post action="/ui/login">{_csrf_input(form_token)}'
                                   '<p><label>API key <input type=password name=key autocomplete=off></label> '
                                   '<button type=submit>Sign in</button></p></form>', status=status)
        response.set_cookie(LOGIN_COOKIE, form_token, max_age=LOGIN_FORM_SECONDS, path="/ui", secure=secure(request),
                            httponly=True, samesite="strict")
        if COOKIE in request.cookies:
            response.delete_cookie(COOKIE, path="/ui", secure=secure(request), httponly=True, samesite="strict")
        if LEGACY_COOKIE in request.cookies:
            response.delete_cookie(LEGACY_COOKIE)
        return response

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    async def home(request: Request) -> Response:
        signed = await current(request)
        if signed is None:
            return sign_in_page(request)
        return page("patients", '<form method=get action="/ui/open"><label>Patient id <input type=text name=pid>'
                                '</label> <button type=submit>Open</button></form>', signed)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        fields = await form_fields(request)
        refuse_forged(request, fields, request.cookies.get(LOGIN_COOKIE, ""), None)
        typed = f"Bearer {fields.get('key', '').strip()}"
        try:  # checked first: a valid key signs in whatever its address sent before
            key = await run_in_threadpool(authenticate, store, typed)
        except AccessError as exc:  # unknown, malformed, revoked or expired: the page says only "not valid"
            wait = service.failed_keys.failed(client_address(request), key_credential(typed))
            if wait > 0:
                raise UiError(429, "too many failed sign-ins from this address or with this key; try again later",
                              exc.key, "", {"Retry-After": str(max(1, round(wait)))}) from None
            await audit_refused(request, 401, exc.key)  # the audit names a revoked or expired key; the page does not
            return sign_in_page(request, NOT_VALID, 401)
        return await start_session(request, key)

    async def start_session(request: Request, key: ApiKey) -> Response:
        """A new token at every sign-in (a session planted before it is worthless); the old one ends."""
        old = request.cookies.get(COOKIE, "")

        def start() -> str:
            if _TOKEN.fullmatch(old):
                sessions.end(old)
            sessions.end_expired(idle)
            return sessions.start(key.key_id, lifetime)

        token = await run_in_threadpool(start)
        service.audit(key, "", "ui_sign_in", request)
        response = RedirectResponse("/ui", status_code=303)
        response.set_cookie(COOKIE, token, max_age=max(1, round(lifetime.total_seconds())), path="/ui",
                            secure=secure(request), httponly=True, samesite="strict")
        response.delete_cookie(LOGIN_COOKIE, path="/ui", secure=secure(request), httponly=True, samesite="strict")
        if LEGACY_COOKIE in request.cookies:
            response.delete_cookie(LEGACY_COOKIE)
        return response

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        fields = await form_fields(request)
        signed = await current(request)
        if signed is not None:
            refuse_forged(request, fields, signed.csrf, signed.key)
            await run_in_threadpool(sessions.end, signed.token)
            service.audit(signed.key, "", "ui_sign_out", request)
        response = RedirectResponse("/ui", status_code=303)
        response.delete_cookie(COOKIE, path="/ui", secure=secure(request), httponly=True, samesite="strict")
        return response

    @app.get("/ui/open", include_in_schema=False)
    async def open_patient(pid: str = "") -> Response:
        return RedirectResponse(f"/ui/patients/{quote(pid, safe='')}", status_code=303)

    @app.get("/ui/patients/{pid}", response_class=HTMLResponse, include_in_schema=False)
    async def patient(pid: str, request: Request) -> Response:
        signed, record = await _open(request, pid)
        key = signed.key
        classified = await service.run(lambda: service.classify(record), tenant=key.tenant, patient=pid,
                                       engine=False)
        service.audit(key, pid, "ui_read", request, tuple(f.id for f in classified.fragments))
        rows = "".join(f'<tr id="f-{e(f.id)}"><td>{tier(f.tier.value)}</td><td>{e(f.section or "")}</td>'
                       f'<td>{e(f.timestamp.date() if f.timestamp else "")}</td><td>{e(f.text)}</td></tr>'
                       for f in classified.fragments)
        return page(f"patient {pid}", _ask_form(pid, signed.csrf) + f"<h2>Fragments ({len(classified.fragments)})"
                                                                    f"</h2><table><tr><th>tier</th><th>section</th>"
                                                                    f"<th>date</th><th>text</th></tr>{rows}</table>",
                    signed)

    @app.post("/ui/patients/{pid}/ask", response_class=HTMLResponse, include_in_schema=False)
    async def ask(pid: str, request: Request) -> Response:
        signed = await signed_in(request, pid)
        fields = await form_fields(request)
        refuse_forged(request, fields, signed.csrf, signed.key, pid)
        signed, record = await _open(request, pid, signed)
        key = signed.key
        question = fields.get("question", "").strip()
        sent = fields.get("window", "")
        window = int(sent) if sent.isascii() and sent.isdigit() and len(sent) <= 7 else None
        result = await service.run(lambda: service.engine().ask(question, service.check_chart(record), window),
                                   tenant=key.tenant, patient=pid)
        service.audit(key, pid, "ui_ask", request, tuple(i.id for i in result.items))
        return page(f"patient {pid}", _ask_form(pid, signed.csrf, question) + result_html(result.to_json()), signed)

    async def _open(request: Request, pid: str, signed: SignedIn | None = None) -> tuple[SignedIn, Any]:
        signed = signed or await signed_in(request, pid)
        try:
            valid_name(pid, "patient id")
        except ValueError:
            raise UiError(404, "no such patient", signed.key) from None  # not a patient id: not audited as one
        try:
            require(signed.key, READ, pid)
            return signed, await stored(service, signed.key, pid)
        except AccessError as exc:
            raise UiError(exc.status, "no such patient" if exc.status == 404 else exc.detail, signed.key, pid) from None

    async def audit_refused(request: Request, status: int, key: ApiKey | None, patient: str = "") -> None:
        route = getattr(request.scope.get("route"), "path", "unmatched")  # never the path the caller sent
        await run_in_threadpool(service.audit_refused, key, status, route,
                                getattr(request.state, "request_id", ""), patient, client_address(request))

    @app.exception_handler(UiError)
    async def on_ui_error(request: Request, exc: UiError) -> Response:
        await audit_refused(request, exc.status, exc.key, exc.patient)
        if exc.status == 401:
            return sign_in_page(request, exc.detail, 401)
        body = page("error", f"<p>{e(exc.detail)}</p><p><a href=/ui>back</a></p>", status=exc.status)
        body.headers.update(exc.headers)
        return body


def _ask_form(pid: str, csrf: str, question: str = "") -> str:
    return (f'<form method=post action="/ui/patients/{e(quote(pid, safe=""))}/ask">{_csrf_input(csrf)}'
            f'<label>Question <input type=text name=question value="{e(question)}"></label> <label>Window '
            '<input type=text name=window size=6 placeholder=4096></label> <button type=submit>Ask</button></form>')


def result_html(data: dict[str, Any]) -> str:
    trace, decision = data["trace"], data["decision"]
    anchors = {c["n"]: f"#line-{c['n']}" for c in data["citations"]}
    answer = e(data["answer"])
    for n, anchor in anchors.items():
        answer = answer.replace(f"[{n}]", f'<a href="{anchor}">[{n}]</a>')
    lines = "".join(f'<tr id="line-{p["n"]}"><td>{p["n"]}</td><td>{tier(p["tier"])}</td><td>{e(p["kind"])}</td>'
                    f'<td>{e(p["id"])}</td><td>{e(p["state"])}</td><td>{e(p["reason"])}</td></tr>'
                    for p in trace["packed"])
    dropped = "".join(f'<tr><td>{d["n"]}</td><td>{tier(d["tier"])}</td><td>{e(d["id"])}</td>'
                      f'<td>{e(d["reason"])}</td><td>{e(d.get("detail", ""))}</td></tr>' for d in trace["dropped"])
    timings = ", ".join(f"{e(k)} {v:.0f} ms" for k, v in trace["timings_ms"].items())
    return (f'<h2>Answer</h2><div class=answer id=answer>{answer}</div>'
            f'<h2>Gate</h2><p id=gate>{e(decision["action"])} · completeness {decision["completeness"]:.2f} · '
            f'{e(decision.get("question_type", ""))} · {e(decision.get("reason", ""))}</p>'
            f'<h2>Packed context ({trace["tokens_used"]} of {trace["context_budget"]} tokens)</h2>'
            f'<table id=packed><tr><th>n</th><th>tier</th><th>kind</th><th>id</th><th>state</th><th>reason</th></tr>'
            f'{lines}</table><div class=ctx>{e(trace["context"])}</div>'
            f'<h2>Dropped ({len(trace["dropped"])})</h2><table id=dropped><tr><th>n</th><th>tier</th><th>id</th>'
            f'<th>reason</th><th>detail</th></tr>{dropped}</table><h2>Timings</h2><p>{timings}</p>')
