"""`/ui`: a server-rendered trace viewer, no build step and no outside assets.

A clinician or engineer signs in with an API key (kept in an HttpOnly, SameSite=Strict cookie, so the
browser sends it only to this server), opens a patient — fragments by tier — asks a question, and reads
the result: the answer with citations linked to the cited line, the packed context in tier colours,
every dropped fragment with its reason, the gate's decision and the timings. Every piece of record text
is HTML-escaped: a note that contains markup is shown as text, never run.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ebmrag.serve.service import bounded_body
from ebmrag.store.access import READ, AccessError, authenticate, require, valid_name

COOKIE = "ebmrag_key"
TIER_COLOURS = {"T1": "#b3261e", "T2": "#1f5fa8", "T3": "#2e7d32", "T4": "#6d6d6d"}
STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:70rem;margin:1.5rem auto;padding:0 1rem;color:#1b1b1b}
h1{font-size:1.3rem}h2{font-size:1.1rem;margin-top:1.6rem}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:.3rem .4rem;text-align:left;vertical-align:top}
.tier{font-weight:600;color:#fff;border-radius:3px;padding:0 .35rem}.ctx{font-family:ui-monospace,monospace;
white-space:pre-wrap;font-size:13px}.answer{white-space:pre-wrap;background:#f6f6f6;padding:.8rem}
form{margin:.6rem 0}input[type=text],input[type=password]{width:28rem;padding:.3rem}.muted{color:#666}
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>"
                        f"<style>{STYLE}</style></head><body><h1>ebmrag · {e(title)}</h1>{body}</body></html>")


def tier(value: str) -> str:
    return f'<span class=tier style="background:{TIER_COLOURS.get(value, "#444")}">{e(value)}</span>'


async def form_fields(request: Request) -> dict[str, str]:
    """application/x-www-form-urlencoded without python-multipart; a form is small (64 KB at most)."""
    body = await bounded_body(request, limit=64 * 1024)
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def install_ui(app: FastAPI, service: Any, stored: Callable[..., Awaitable[Any]]) -> None:
    store = service.store

    async def signed_in(request: Request) -> Any:
        return await service.run(lambda: authenticate(store, f"Bearer {request.cookies.get(COOKIE, '')}"))

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    async def home(request: Request) -> Response:
        try:
            key = await signed_in(request)
        except AccessError:
            return page("sign in", '<form method=post action="/ui/login"><p><label>API key '
                                   '<input type=password name=key autocomplete=off></label> '
                                   '<button type=submit>Sign in</button></p></form>')
        return page("patients", f"<p class=muted>tenant {e(key.tenant)} · role {e(key.role)}</p>"
                                '<form method=get action="/ui/open"><label>Patient id <input type=text name=pid>'
                                '</label> <button type=submit>Open</button></form>')

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        key = (await form_fields(request)).get("key", "").strip()
        response = RedirectResponse("/ui", status_code=303)
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict")
        return response

    @app.get("/ui/open", include_in_schema=False)
    async def open_patient(pid: str = "") -> Response:
        return RedirectResponse(f"/ui/patients/{quote(pid, safe='')}", status_code=303)

    @app.get("/ui/patients/{pid}", response_class=HTMLResponse, include_in_schema=False)
    async def patient(pid: str, request: Request) -> Response:
        key, record = await _open(request, pid)
        classified = await service.run(lambda: service.classify(record))
        service.audit(key, pid, "ui_read", request, tuple(f.id for f in classified.fragments))
        rows = "".join(f'<tr id="f-{e(f.id)}"><td>{tier(f.tier.value)}</td><td>{e(f.section or "")}</td>'
                       f'<td>{e(f.timestamp.date() if f.timestamp else "")}</td><td>{e(f.text)}</td></tr>'
                       for f in classified.fragments)
        return page(f"patient {pid}", _ask_form(pid) + f"<h2>Fragments ({len(classified.fragments)})</h2>"
                                                       f"<table><tr><th>tier</th><th>section</th><th>date</th>"
                                                       f"<th>text</th></tr>{rows}</table>")

    @app.post("/ui/patients/{pid}/ask", response_class=HTMLResponse, include_in_schema=False)
    async def ask(pid: str, request: Request) -> Response:
        key, record = await _open(request, pid)
        fields = await form_fields(request)
        question = fields.get("question", "").strip()
        window = int(fields["window"]) if fields.get("window", "").isdigit() else None
        result = await service.run(lambda: service.engine().ask(question, record, window))
        service.audit(key, pid, "ui_ask", request, tuple(i.id for i in result.items))
        return page(f"patient {pid}", _ask_form(pid, question) + result_html(result.to_json()))

    async def _open(request: Request, pid: str) -> tuple[Any, Any]:
        try:
            key = await signed_in(request)
            valid_name(pid, "patient id")
            require(key, READ, pid)
            return key, await stored(service, key, pid)
        except (AccessError, ValueError) as exc:
            status = exc.status if isinstance(exc, AccessError) else 404
            raise UiError(status, "no such patient" if status == 404 else str(exc)) from None

    @app.exception_handler(UiError)
    async def on_ui_error(request: Request, exc: UiError) -> Response:
        body = page("error", f"<p>{e(exc.detail)}</p><p><a href=/ui>back</a></p>")
        body.status_code = exc.status
        return body


class UiError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def _ask_form(pid: str, question: str = "") -> str:
    return (f'<form method=post action="/ui/patients/{e(quote(pid, safe=""))}/ask"><label>Question '
            f'<input type=text name=question value="{e(question)}"></label> <label>Window '
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
