"""What every probe of bench/probe_service.py shares: callers, raw HTTP, the checks every answer meets, the tally.

A probe sends one hostile request and hands the answer to `Run.check`, which applies the rules every
answer meets whatever the probe (no 5xx, the documented error shape, no traceback, no planted marker of a
patient the caller may not see) plus the probe's own expectation, and remembers each refused answer
(401/403/404/413/429) so the audit table can be matched against it after the run. A failure is kept as a
class, a probe, a status and a short snippet, never a whole body; the run goes on.

Requests that an HTTP client would tidy up (a `..` path segment, a control character in a header, a
body of hundreds of megabytes that must stop as soon as the server answers) go through `raw_request`,
a plain socket that sends exactly the bytes it is given.
"""

from __future__ import annotations

import json
import logging
import random
import select
import socket
import time
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

log = logging.getLogger("probe")
REFUSED = frozenset({401, 403, 404, 413, 429})
PROTOCOL_400 = b"Invalid HTTP request received."  # uvicorn's own answer to a request its parser rejects
T = TypeVar("T")


@dataclass
class Target:
    """A running `ebmrag serve` (and optionally `ebmrag mcp --transport http` on the same store)."""

    url: str
    backend: str
    new_key: Callable[[str, str, tuple[str, ...]], str]  # (tenant, role, patients) -> the key
    revoke: Callable[[str], None]  # a key -> revoked
    audit_rows: Callable[[], list[tuple[Any, ...]]]
    rss_mb: Callable[[], float]  # the server process's resident memory (VmRSS)
    request_seconds: float
    max_body_mb: float
    kb_admin_tenant: str = "ebmrag"
    mcp_url: str = ""
    audit_intact: Callable[[], list[str]] | None = None  # problems `ebmrag audit verify` reports
    settle: Callable[[], None] | None = None  # until the servers have audited every burst of 429s (serve.throttle)

    @property
    def host_port(self) -> tuple[str, int]:
        url = httpx.URL(self.url)
        return url.host, int(url.port or 80)


@dataclass
class Reply:
    """One answer (status 0: none came, see `error`)."""

    method: str
    path: str
    status: int
    headers: dict[str, str]
    body: bytes
    elapsed: float
    error: str = ""
    sent_bytes: int = 0
    set_cookies: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def request_id(self) -> str:
        return self.headers.get("x-request-id", "")

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True)
class Failure:
    backend: str
    klass: str
    probe: str
    status: int
    problem: str
    snippet: str


@dataclass(frozen=True)
class Refusal:
    """A refused answer, to be found in the audit table by its request id."""

    klass: str
    probe: str
    status: int
    path: str
    request_id: str
    detail: str = ""  # the problem's detail ("Not Found": no route matched)


@dataclass(frozen=True)
class Owner:
    """Whose planted marker a string is: a tenant and a patient."""

    tenant: str
    patient: str


class Caller:
    """A key (or none) acting from one loopback address: the server throttles bad keys per address, so each
    class of probe gets its own 127.0.0.x and one class's bad keys never slow down another's."""

    def __init__(self, target: Target, name: str, key: str = "", tenant: str = "", patients: Sequence[str] = (),
                 source: str = "127.0.0.1", timeout: float = 60.0) -> None:
        self.target, self.name, self.key, self.tenant = target, name, key, tenant
        self.patients = tuple(patients)  # empty: every patient of the tenant
        self.source = source
        self._http = httpx.Client(base_url=target.url, timeout=timeout, follow_redirects=False,
                                  transport=httpx.HTTPTransport(local_address=source))

    def may_see(self, owner: Owner) -> bool:
        return bool(self.tenant) and owner.tenant == self.tenant and (not self.patients or
                                                                      owner.patient in self.patients)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def call(self, method: str, path: str, *, json_body: Any = None, content: bytes | None = None,
             headers: dict[str, str] | None = None, cookies: dict[str, str] | None = None,
             authorized: bool = True, base: str = "") -> Reply:
        sent = {**(self.auth() if authorized else {}), **(headers or {})}
        if cookies:
            sent["Cookie"] = "; ".join(f"{name}={value}" for name, value in cookies.items())
        if json_body is not None:
            content = json.dumps(json_body).encode()
            sent.setdefault("Content-Type", "application/json")
        started = time.monotonic()
        shown = httpx.URL(base).path + path if base else path
        try:
            response = self._http.request(method, (base or self.target.url) + path, content=content, headers=sent)
        except httpx.HTTPError as exc:
            return Reply(method, shown, 0, {}, b"", time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        finally:
            self._http.cookies.clear()  # a probe's cookies are its own, never the next probe's
        return Reply(method, shown, response.status_code, {k.lower(): v for k, v in response.headers.items()},
                     response.content, time.monotonic() - started,
                     set_cookies=response.headers.get_list("set-cookie"))

    def raw(self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]] = (),
            body: bytes | Iterable[bytes] = b"", *, chunked: bool = False, length: int | None = None,
            authorized: bool = True, timeout: float = 30.0, url: str = "") -> Reply:
        sent = [(b"Authorization", f"Bearer {self.key}".encode())] if self.key and authorized else []
        host, port = (httpx.URL(url).host, int(httpx.URL(url).port or 80)) if url else self.target.host_port
        return raw_request(host, port, method, target, [*sent, *headers], body, chunked=chunked, length=length,
                           source=self.source, timeout=timeout)

    def close(self) -> None:
        self._http.close()


def raw_request(host: str, port: int, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]],
                body: bytes | Iterable[bytes], *, chunked: bool = False, length: int | None = None,
                source: str = "127.0.0.1", timeout: float = 30.0) -> Reply:
    """Send exactly these bytes; stop sending the body as soon as an answer arrives (a server that answers
    before reading must not be made to read anyway) and return the answer with the bytes sent."""
    head = [f"{method} ".encode() + target + b" HTTP/1.1", f"Host: {host}:{port}".encode(), b"Connection: close"]
    head += [name + b": " + value for name, value in headers]
    if chunked:
        head.append(b"Transfer-Encoding: chunked")
    elif length is not None or isinstance(body, bytes):
        declared = length if length is not None else len(body) if isinstance(body, bytes) else 0
        head.append(f"Content-Length: {declared}".encode())
    started = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0))
    except OSError as exc:
        return Reply(method, target.decode("latin-1"), 0, {}, b"", 0.0, f"connect: {exc}")
    with sock:
        sent, answered = _send_until_answered(sock, b"\r\n".join(head) + b"\r\n\r\n",
                                              [body] if isinstance(body, bytes) else body, chunked,
                                              started + timeout)
        status, headers_in, content, error = _read_answer(sock, started + timeout)
    if status == 0 and not error:
        error = "the connection closed without an answer" if answered else "no answer in time"
    cookies = [c for c in headers_in.pop("set-cookie", "").split("\n") if c]
    return Reply(method, target.decode("latin-1"), status, headers_in, content, time.monotonic() - started, error,
                 sent, cookies)


def _send_until_answered(sock: socket.socket, head: bytes, chunks: Iterable[bytes], chunked: bool,
                         deadline: float) -> tuple[int, bool]:
    """Bytes of the body sent, and whether the server answered (or hung up) before all of it went."""
    sent = 0
    try:
        sock.sendall(head)
        for chunk in chunks:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable or time.monotonic() > deadline:
                return sent, True
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
            sent += len(chunk)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        return sent, True
    return sent, False


def _read_answer(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes, str]:
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
        head, _, rest = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/"):
            return 0, {}, b"", ""
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        headers["set-cookie"] = "\n".join(line.partition(":")[2].strip() for line in lines[1:]
                                          if line.lower().startswith("set-cookie:"))
        while time.monotonic() < deadline and not _complete(headers, rest):
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            piece = sock.recv(65536)
            if not piece:
                break
            rest += piece
    except OSError as exc:
        return (int(data.split(b" ")[1]) if data.startswith(b"HTTP/") else 0), {}, b"", f"read: {exc}"
    body = _dechunk(rest) if headers.get("transfer-encoding", "").lower() == "chunked" else rest
    return int(lines[0].split(" ")[1]), headers, body, ""


def _complete(headers: dict[str, str], rest: bytes) -> bool:
    if headers.get("content-length", "").isdigit():
        return len(rest) >= int(headers["content-length"])
    return headers.get("transfer-encoding", "").lower() == "chunked" and rest.endswith(b"0\r\n\r\n")


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def snippet(text: str, around: str = "", width: int = 140) -> str:
    """A short, printable excerpt (control characters escaped), centred on `around` when given."""
    start = max(0, text.find(around) - width // 2) if around and around in text else 0
    cut = text[start:start + width]
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return shown.replace("|", "\\|") + ("…" if len(text) > start + width else "")


def folded(text: str) -> str:
    """Text as a reader would see it: NFKC, format characters (zero-width, bidi) removed."""
    return "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")


class Run:
    """The tally of one backend's run: probes and failures per class, refused answers, RSS, notes."""

    def __init__(self, backend: str, budget_seconds: float, sample: int | None = None, huge_mb: int = 300,
                 seed: int = 20261126) -> None:
        """`sample`: at most this many variants of each list (a quick run); `huge_mb`: the size of each
        unauthenticated body."""
        self.backend, self.sample, self.huge_mb = backend, sample, huge_mb
        self.rng = random.Random(seed)
        self.started = time.monotonic()
        self.deadline = self.started + budget_seconds
        self.probes: Counter[str] = Counter()
        self.server_errors: Counter[str] = Counter()
        self.leaks: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.failures: list[Failure] = []
        self.refusals: list[Refusal] = []
        self.request_ids: Counter[str] = Counter()
        self.markers: dict[str, Owner] = {}
        self.notes: list[str] = []
        self.measures: dict[str, str] = {}
        self._class_deadline: dict[str, float] = {}

    # ------------------------------------------------------------------ budget
    def begin(self, klass: str, share: float) -> None:
        """`klass` may use `share` of the time left (the last class takes what remains)."""
        now = time.monotonic()
        self._class_deadline[klass] = now + max(1.0, (self.deadline - now) * share)
        self.probes[klass] += 0

    def left(self, klass: str) -> float:
        return min(self._class_deadline.get(klass, self.deadline), self.deadline) - time.monotonic()

    def take(self, klass: str, items: Sequence[T], sample: int | None = None) -> Iterator[T]:
        """The items in a seeded order (so a cut by the budget or the sample still spans them all), until the
        class's time is up; what was not sent is counted as skipped."""
        chosen = list(items)
        self.rng.shuffle(chosen)
        limit = sample if sample is not None else self.sample
        if limit is not None and len(chosen) > limit:
            self.skipped[klass] += len(chosen) - limit
            chosen = chosen[:limit]
        for index, item in enumerate(chosen):
            if self.left(klass) <= 0:
                self.skipped[klass] += len(chosen) - index
                return
            yield item

    # ------------------------------------------------------------------ checks
    def fail(self, klass: str, probe: str, status: int, problem: str, text: str = "", around: str = "") -> None:
        self.failures.append(Failure(self.backend, klass, probe, status, problem, snippet(text, around)))
        log.warning("FAIL %s %s / %s: %s (%s)", self.backend, klass, probe, problem, status)

    def note(self, line: str) -> None:
        self.notes.append(line)
        log.info("note: %s", line)

    def plant(self, marker: str, tenant: str, patient: str) -> None:
        self.markers[marker] = Owner(tenant, patient)

    def check(self, reply: Reply, klass: str, probe: str, caller: Caller | None,
              expect: Iterable[int] | Callable[[Reply], str] | None = None) -> bool:
        """The rules every answer meets, then `expect` (statuses, or a function returning a problem or "").
        True when nothing failed."""
        self.probes[klass] += 1
        before = len(self.failures)
        if reply.status == 0:
            self.fail(klass, probe, 0, f"no answer ({reply.error})")
            return False
        if reply.request_id:
            self.request_ids[reply.request_id] += 1
        if reply.status >= 500:
            self.server_errors[klass] += 1
            self.fail(klass, probe, reply.status, "5xx", reply.text)
        problem = _shape_problem(reply)
        if problem:
            self.fail(klass, probe, reply.status, problem, reply.text)
        whole = reply.text + "\n" + "\n".join(f"{k}: {v}" for k, v in reply.headers.items())
        for marker, owner in self.markers.items():
            if marker in whole and (caller is None or not caller.may_see(owner)):
                self.leaks[klass] += 1
                self.fail(klass, probe, reply.status, f"leak: {owner.tenant}/{owner.patient}'s marker to "
                                                      f"{caller.name if caller else 'an anonymous caller'}",
                          whole, marker)
        if callable(expect):
            wrong = expect(reply)
            if wrong:
                self.fail(klass, probe, reply.status, wrong, reply.text)
        elif expect is not None and reply.status < 500:  # a 5xx is reported once, above
            allowed = set(expect)
            if reply.status not in allowed:
                self.fail(klass, probe, reply.status, f"expected {sorted(allowed)}, got {reply.status}", reply.text)
        if reply.status in REFUSED:
            data = reply.json()
            detail = str(data.get("detail", "")) if isinstance(data, dict) else reply.headers.get("content-type", "")
            self.refusals.append(Refusal(klass, probe, reply.status, reply.path, reply.request_id, detail[:60]))
        return len(self.failures) == before

    def summary(self) -> dict[str, Any]:
        by_class: dict[str, Counter[str]] = defaultdict(Counter)
        for failure in self.failures:
            by_class[failure.klass]["failures"] += 1
        return {klass: {"probes": self.probes[klass], "5xx": self.server_errors[klass], "leaks": self.leaks[klass],
                        "failures": by_class[klass]["failures"], "skipped": self.skipped[klass]}
                for klass in [*self.probes, *(k for k in by_class if k not in self.probes)]}


def _shape_problem(reply: Reply) -> str:
    """The documented shape: problem+json for errors on /v1 and /mcp, HTML on /ui, uvicorn's plain 400 for a
    request its HTTP parser refuses; never a traceback."""
    if "Traceback (most recent call last)" in reply.text or 'File "/' in reply.text:
        return "a traceback in the answer"
    kind = reply.headers.get("content-type", "").split(";")[0].strip()
    if reply.status == 400 and reply.body.strip() == PROTOCOL_400:
        return ""  # refused by the HTTP parser before the application saw it
    if reply.status < 400:
        return ""
    if reply.path.startswith("/ui") and kind == "text/html":
        return ""
    if reply.path.startswith("/mcp") and kind == "application/json":
        return ""  # a JSON-RPC error (MCP's own transport shape)
    if kind != "application/problem+json":
        return f"error answered as {kind or 'no content type'}, not application/problem+json"
    data = reply.json()
    if not isinstance(data, dict) or not {"type", "title", "status", "detail"} <= set(data) or \
            data.get("status") != reply.status:
        return "problem+json without type, title, detail and the same status"
    return ""


def rss_of(pid: int | str) -> float:
    """VmRSS of a process in MB (0 when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in lines if line.startswith("VmRSS:")), 0.0)
