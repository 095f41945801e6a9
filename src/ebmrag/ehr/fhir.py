"""A FHIR REST client for pulling charts: bearer auth, paging, and patience with a busy or failing server.

What a server refuses becomes one `EhrError` line naming the operation ("search Observation", never the patient
id or the URL, which holds it), the status and the OperationOutcome's issue codes, so an operator can act without
a traceback; never the server's free text, which may echo the bearer token to whoever the error reaches (a key
limited to one patient). Retries follow what the server says:

- 429 and 503 are retried (`[ehr] retries`) after their `Retry-After` (seconds or an HTTP date), or after an
  exponential backoff when it is absent; a server asking for more than `max_retry_after_seconds` is an error,
  since retrying sooner than asked only earns another 429;
- other 5xx and network errors are retried `error_retries` times after the backoff;
- a 401 gets one fresh token (the cached one may have expired early, or been revoked) and one more try.

The token is sent only to the FHIR base's origin: a `next` link, a Bulk Data status or file URL elsewhere is
refused rather than followed, since following it would hand the bearer token to whoever wrote the link (a Bulk
Data file may be on an origin the connection lists, `bulk_file_origins`, and nowhere else, token or not).

A pull is bounded as a whole, not only per answer: `[ehr] max_pull_mb` over every answer together and
`pull_seconds` of wall clock (waits included), both checked between the chunks of an answer, where the service's
request deadline can stop it too (`protocols.checkpoint`): a server that drips one byte per read cannot keep a
worker past either; each exchange has its own total deadline and a body inflated a bounded piece at a time
(`ehr.wire`). Whatever goes wrong in an exchange (a body that does not decode, a URL that does not parse) is an
`EhrError` line, never a traceback.

Only a whole answer is used: a read takes a 200 of FHIR JSON and nothing else (a redirect with a body, a 204, a
login page would otherwise read as a chart without allergies), and a search fails when its pages hold fewer
entries than its `total`, or carry an OperationOutcome of errors.
"""

from __future__ import annotations

import email.utils
import logging
import time
import unicodedata
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, Protocol
from urllib.parse import urljoin, urlsplit

import httpx

from ebmrag.ehr.ids import safe_path
from ebmrag.ehr.params import EhrParams
from ebmrag.ehr.wire import AnswerTimeout, Exchange
from ebmrag.errors import EbmragError, RecordError
from ebmrag.protocols import checkpoint
from ebmrag.records.limits import load_json
from ebmrag.rules import rule_file

log = logging.getLogger(__name__)
FHIR_JSON = "application/fhir+json"
FIRST_BACKOFF = 0.5  # seconds; doubled per retry up to [ehr] max_backoff_seconds
_EXCERPT = 240  # characters of a server's words (a media type, an origin) kept in an error line
MB = 2**20
Origin = tuple[str, str]


class EhrError(EbmragError):
    """A FHIR server (or its token endpoint) refused or could not be reached: one line naming the operation, the
    status (None: no answer at all) and what the server said."""

    def __init__(self, message: str, *, status: int | None = None, operation: str = "",
                 unreachable: bool = False) -> None:
        """`unreachable`: no answer at all (a network error, a timeout), not a refusal."""
        super().__init__(" ".join(message.split()))
        self.status, self.operation, self.unreachable = status, operation, unreachable


class Authorizer(Protocol):
    """Hands out bearer tokens (ehr.smart.TokenSource)."""

    def token(self) -> str: ...

    def refresh(self) -> str: ...


@dataclass(frozen=True)
class Answer:
    """A response read whole (within `max_response_mb`)."""

    status: int
    headers: httpx.Headers
    body: bytes
    url: str
    size: int = 0  # bytes received (the body's, or what went to a sink)

    def json(self, operation: str) -> Any:
        try:
            return load_json(self.body, operation)  # depth-bounded, like every other input from outside
        except RecordError as exc:
            raise EhrError(f"{operation}: the FHIR server answered {self.status} with a body that is not valid "
                           f"JSON ({exc.problem})", status=self.status, operation=operation) from None


def origin(url: str) -> Origin:
    """(scheme, host:port) with the default port written out: the unit a token may be sent to. A ValueError for a
    URL that does not parse ("http://[::1", a port that is not a number)."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return parts.scheme.lower(), f"{(parts.hostname or '').lower()}:{port}"


def excerpt(text: str, limit: int = _EXCERPT) -> str:
    """A server's words as an error line may repeat them: no control or format characters (no terminal escapes,
    no bidi overrides), one line, at most `limit` characters."""
    kept = "".join(c if unicodedata.category(c)[0] != "C" else " " for c in text)
    kept = " ".join(kept.split())
    return kept[:limit] + ("…" if len(kept) > limit else "")


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def diagnostics(body: Any) -> str:
    """What may be repeated of a server's error, on one line: an OperationOutcome's issue codes, an OAuth error
    body's error code: words of fixed vocabularies (rules/ehr/answers.toml), never the server's free text, which may
    echo what the request carried (the bearer token, the client assertion, the patient id)."""
    relayed = _answers()["relayed"]
    said: list[str] = []
    if isinstance(body, Mapping) and body.get("resourceType") == "OperationOutcome":
        issues = body.get("issue")
        codes = [str(i.get("code")) for i in (issues[:10] if isinstance(issues, list) else [])
                 if isinstance(i, Mapping)]
        said = [f"issue {code}" for code in dict.fromkeys(codes) if code in relayed["issue_codes"]]
    elif isinstance(body, Mapping) and isinstance(body.get("error"), str):
        said = [body["error"] if body["error"] in relayed["oauth_errors"] else "an error code that is not OAuth's"]
    return ", ".join(said)


def refusal(answer: Answer, operation: str) -> EhrError:
    try:
        said = diagnostics(load_json(answer.body, operation)) if answer.body else ""
    except RecordError:
        said = ""
    reason = httpx.codes.get_reason_phrase(answer.status)
    return EhrError(f"{operation}: the FHIR server refused ({answer.status} {reason}" + (f"; {said})" if said else ")"),
                    status=answer.status, operation=operation)


@rule_file("ehr/answers.toml")
def _answers(table: Mapping[str, Any]) -> Mapping[str, Any]:
    """Media types and error code lists (rules/ehr/answers.toml)."""
    return table


def media_type(answer: Answer) -> str:
    """The answer's media type, lower case, without parameters ("" when it names none)."""
    return str(answer.headers.get("content-type", "")).split(";")[0].strip().lower()


def check_media(answer: Answer, kind: str, operation: str) -> None:
    """An answer labelled as something other than `kind` ("json", "ndjson": rules/ehr/answers.toml) is refused unread:
    a login page or an XML error read as a FHIR answer holds nothing, and its nothing would read as an absence."""
    found = media_type(answer)
    if found and found not in _answers()["media"][kind]:
        shown = found if found in _answers()["media"]["named"] else "another media type"  # never its own words
        raise EhrError(f"{operation}: the FHIR server answered {answer.status} with {shown}, not "
                       f"{'FHIR JSON' if kind == 'json' else 'NDJSON'}; not read", status=answer.status,
                       operation=operation)


class FhirClient:
    """Requests to one FHIR base on one `httpx.Client`; `requests` counts what was sent (retries included),
    `received` the bytes of every answer (the `[ehr] max_pull_mb` budget, `bound` sets another)."""

    def __init__(self, base: str, params: EhrParams, *, auth: Authorizer | None = None,
                 http: httpx.Client | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        """`auth`: None for an open server; `sleep`: how a wait is spent (tests count them). The pull's budget
        starts now."""
        self.base, self.params, self.auth, self.sleep = base.rstrip("/"), params, auth, sleep
        self.origin = origin(self.base)
        self.http = http or httpx.Client(timeout=params.timeout_seconds, follow_redirects=False)
        self.requests = 0
        self.received = 0
        self._limit, self._limit_mb, self._limit_key, self._deadline, self._seconds = 0, 0.0, "", 0.0, 0.0
        self.bound(params.max_pull_mb, "max_pull_mb", params.pull_seconds)

    def close(self) -> None:
        self.http.close()

    def bound(self, total_mb: float, key: str, seconds: float) -> None:
        """From now on at most `total_mb` received in all (counting what was received already; `key` names the
        setting in the error) and `seconds` of wall clock, waits included."""
        self._limit, self._limit_mb, self._limit_key = int(total_mb * MB), total_mb, key
        self._deadline, self._seconds = time.monotonic() + seconds, seconds

    def last_request(self) -> None:
        """A budget of its own for one last small request (a cancel must go out although the budget spent or the
        time up is why the work is given up): one answer's worth of bytes, `timeout_seconds` of time."""
        self._limit = self.received + int(self.params.max_response_mb * MB)
        self._deadline = time.monotonic() + self.params.timeout_seconds

    def url(self, path: str, origins: Collection[Origin] = (), operation: str = "") -> str:
        """`path` under the base ("Patient/7/$everything", "/fhir/$export-status/9"), or an absolute URL the
        server gave: on the base's origin or one of `origins` (a Bulk Data file's, as the connection lists them),
        token or not; anything else is refused, never requested."""
        said = f"{operation}: " if operation else ""
        try:
            if "://" in path:
                full = path
            elif not safe_path(path):  # "Patient/..": the base itself, a search of every patient
                raise EhrError(f"{said}refused to request a path with an empty, dot or encoded segment",
                               operation=operation)
            else:  # "Patient/7" is under the base; "/fhir/$export-status/9" under the origin
                full = urljoin(self.base, path) if path.startswith("/") else f"{self.base}/{path}"
            there = origin(full)
        except ValueError:
            raise EhrError(f"{said}the FHIR server sent a link that is not a valid URL; it is not followed",
                           operation=operation) from None
        if there != self.origin and there not in origins:
            raise EhrError(f"{said}the FHIR server sent a link to another server; it is not followed (the access "
                           "token goes to the FHIR server only)", operation=operation)
        return full

    def read(self, path: str, query: Mapping[str, str] | None = None, *, operation: str,
             authorized: bool = True) -> Any:
        """GET a JSON resource (a Bundle, a CapabilityStatement); an error OperationOutcome is an EhrError."""
        answer = self.send("GET", path, operation=operation, query=query, authorized=authorized)
        if answer.status not in (200, 203):  # a redirect (not followed), 204 No Content, 202 Accepted: no resource
            reason = httpx.codes.get_reason_phrase(answer.status)
            raise EhrError(f"{operation}: the FHIR server answered {answer.status} {reason} where a resource was "
                           "expected" + (" (redirects are not followed: the access token goes to the FHIR server "
                                         "only)" if 300 <= answer.status < 400 else ""),
                           status=answer.status, operation=operation)
        check_media(answer, "json", operation)
        body = answer.json(operation)
        if isinstance(body, Mapping) and body.get("resourceType") == "OperationOutcome" and _is_error(body):
            said = diagnostics(body)
            raise EhrError(f"{operation}: the FHIR server answered with an error" + (f" ({said})" if said else ""),
                           status=answer.status, operation=operation)
        return body

    def pages(self, path: str, query: Mapping[str, str], *, operation: str) -> Iterator[Mapping[str, Any]]:
        """Every page of a search: the first from `path`, then each `link[rel=next]` (on the base's origin)."""
        url: str | None = path
        params: Mapping[str, str] | None = query
        seen: set[str] = set()
        total, matched = None, 0
        while url is not None:
            bundle = self.read(url, params, operation=operation)
            if not isinstance(bundle, Mapping) or bundle.get("resourceType") != "Bundle":
                raise EhrError(f"{operation}: the FHIR server answered with something other than a Bundle",
                               operation=operation)
            said_total, count = page_count(bundle, operation)
            total = said_total if total is None else total
            matched += count
            yield bundle
            url, params = next_link(bundle), None
            if url is None and total is not None and matched < total:  # a page left out: what it held is not "none"
                raise EhrError(f"{operation}: the FHIR server's search says it matched {total} but its pages held "
                               f"{matched}; the answer is incomplete and is not used", operation=operation)
            if url is not None:
                try:
                    url = urljoin(self.base + "/", url)
                    there = origin(url)
                except ValueError:
                    raise EhrError(f"{operation}: the FHIR server's next link is not a valid URL; it is not "
                                   "followed", operation=operation) from None
                if there != self.origin:
                    raise EhrError(f"{operation}: the FHIR server's next link points to another server; it is not "
                                   "followed (the access token goes to the FHIR server only)", operation=operation)
                if url in seen:
                    raise EhrError(f"{operation}: the FHIR server's next link repeats an earlier page",
                                   operation=operation)
                seen.add(url)

    def send(self, method: str, path: str, *, operation: str, query: Mapping[str, str] | None = None,
             headers: Mapping[str, str] | None = None, authorized: bool = True, accept: str = FHIR_JSON,
             origins: Collection[Origin] = (), sink: IO[bytes] | None = None) -> Answer:
        """One request with the retries of the module doc; a status of 400 or more that is not retried, or that
        stays after its retries, is an EhrError. 1xx-3xx answers (202 Accepted too) are returned. `origins`: where
        besides the base's origin an absolute `path` may be (a Bulk Data file); `sink`: a successful answer's body
        is written there instead of into memory (the Answer's body is then empty, its `size` says how much)."""
        url = self.url(path, origins, operation)
        busy = failed = 0
        refreshed = False
        while True:
            checkpoint()  # a pull the service no longer waits for stops between two requests
            self._check_time(operation)
            try:
                answer = self._exchange(method, url, query, headers, authorized, accept, operation, origins, sink)
            except httpx.TransportError as exc:
                self._check_time(operation)  # the pull's deadline cut the body: that, not the network, is why
                if failed < self.params.error_retries:
                    failed += 1
                    self.wait(self._backoff(failed), operation, "unreachable")
                    continue
                raise EhrError(f"{operation}: {_unreachable(exc, self.params.timeout_seconds)}", operation=operation,
                               unreachable=True) from None
            except httpx.DecodingError as exc:  # ours (ehr.wire): an encoding not asked for, a cut or bad gzip
                raise EhrError(f"{operation}: the FHIR server's answer could not be read: {exc}",
                               operation=operation) from None
            except httpx.HTTPError as exc:  # too many redirects, a stream read twice, ...
                raise EhrError(f"{operation}: the FHIR server's answer could not be read ({type(exc).__name__})",
                               operation=operation) from None
            except (httpx.InvalidURL, ValueError) as exc:  # a URL httpx cannot send to
                raise EhrError(f"{operation}: the request's URL is not valid ({type(exc).__name__})",
                               operation=operation) from None
            if answer.status < 400:
                return answer
            if answer.status == 401 and authorized and self.auth is not None and not refreshed:
                refreshed = True
                self.auth.refresh()
                continue
            if answer.status in (429, 503) and busy < self.params.retries:
                busy += 1
                self.wait(self._server_wait(answer, busy, operation), operation, str(answer.status))
                continue
            if answer.status >= 500 and answer.status != 503 and failed < self.params.error_retries:
                failed += 1
                self.wait(self._backoff(failed), operation, str(answer.status))
                continue
            raise refusal(answer, operation)

    def _exchange(self, method: str, url: str, query: Mapping[str, str] | None, headers: Mapping[str, str] | None,
                  authorized: bool, accept: str, operation: str, origins: Collection[Origin],
                  sink: IO[bytes] | None) -> Answer:
        """One exchange inside `ehr.wire`'s bounds: its head within `timeout_seconds`, its body by the pull's
        deadline, inflated a bounded piece at a time and counted piece by piece (`_take`)."""
        sent = {"Accept": accept, **(headers or {})}
        if authorized and self.auth is not None:
            if origin(url) != self.origin and origin(url) not in origins:  # url() checked it; here too, at the token
                raise EhrError(f"{operation}: refused to send the access token to another server")
            sent["Authorization"] = f"Bearer {self.auth.token()}"
        self.requests += 1
        request = self.http.build_request(method, url, params=dict(query) if query else None, headers=sent)
        bounds = {"header_seconds": self.params.timeout_seconds, "until": self._deadline}
        with Exchange(self.http, request, **bounds) as exchange:
            reply = exchange.reply
            into = sink if sink is not None and reply.status_code < 300 else None
            if into is not None:  # a retry starts the file again
                into.seek(0)
                into.truncate()
            body, size = bytearray(), 0
            for piece in exchange.pieces():
                size += len(piece)
                self._take(len(piece), size, operation)
                if into is not None:
                    into.write(piece)
                else:
                    body += piece
            checkpoint()  # a stop that shut the socket may look like the end of a body: it is not taken as one
            return Answer(reply.status_code, reply.headers, bytes(body), str(reply.url), size)

    def _take(self, count: int, answer_size: int, operation: str) -> None:
        """Count `count` more bytes against the answer's and the pull's budgets; stop here when either is spent,
        the pull's time is up, or the service no longer waits (a server dripping a byte per read cannot hold a
        worker past any of them)."""
        self.received += count
        if answer_size > self.params.max_response_mb * MB:
            raise EhrError(f"{operation}: the FHIR server's answer is larger than {self.params.max_response_mb:g} MB "
                           "([ehr] max_response_mb)", operation=operation)
        if self.received > self._limit:
            raise EhrError(f"{operation}: more than {self._limit_mb:g} MB received in all ([ehr] "
                           f"{self._limit_key}); stopped, nothing stored", operation=operation)
        checkpoint()
        self._check_time(operation)

    def _check_time(self, operation: str) -> None:
        if time.monotonic() > self._deadline:
            raise EhrError(f"{operation}: not done after {self._seconds:g} s ([ehr] pull_seconds); stopped, nothing "
                           "stored", operation=operation)

    def _server_wait(self, answer: Answer, attempt: int, operation: str) -> float:
        asked = retry_after(answer.headers.get("retry-after"))
        if asked is None:
            return self._backoff(attempt)
        if asked > self.params.max_retry_after_seconds:
            raise EhrError(f"{operation}: the FHIR server is busy ({answer.status}) and asks to wait {asked:g} s, "
                           f"more than [ehr] max_retry_after_seconds ({self.params.max_retry_after_seconds:g} s)",
                           status=answer.status, operation=operation)
        return asked

    def _backoff(self, attempt: int) -> float:
        return float(min(self.params.max_backoff_seconds, FIRST_BACKOFF * 2 ** (attempt - 1)))

    def wait(self, seconds: float, operation: str, why: str) -> None:
        log.info("%s: %s, retrying in %.1f s", operation, why, seconds)
        left = seconds
        while left > 0:
            checkpoint()  # a long Retry-After must not outlive the request that waits for it
            self._check_time(operation)
            self.sleep(min(left, 1.0))
            left -= 1.0


def _unreachable(exc: httpx.TransportError, seconds: float) -> str:
    if isinstance(exc, AnswerTimeout):
        return (f"the FHIR server sent no complete answer within {seconds:g} s ([ehr] timeout_seconds); the "
                "connection was closed")
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return f"the FHIR server could not be reached ({type(exc).__name__})"
    return f"the FHIR server's answer broke off ({type(exc).__name__})"


def page_count(bundle: Mapping[str, Any], operation: str) -> tuple[int | None, int]:
    """(the search's `total` where the page says it, the page's entries), or an EhrError where the page carries
    an OperationOutcome of errors (a server saying it could not answer the search whole)."""
    entries = bundle.get("entry")
    matched = 0
    for entry in entries if isinstance(entries, list) else []:
        search = entry.get("search") if isinstance(entry, Mapping) else None
        mode = search.get("mode") if isinstance(search, Mapping) else None
        resource = entry.get("resource") if isinstance(entry, Mapping) else None
        if mode == "outcome" or (isinstance(resource, Mapping) and resource.get("resourceType") == "OperationOutcome"):
            if isinstance(resource, Mapping) and _is_error(resource):
                said = diagnostics(resource)
                raise EhrError(f"{operation}: the FHIR server's page carries an error" + (f" ({said})" if said else "")
                               + "; the answer is incomplete and is not used", operation=operation)
        else:  # include entries too: servers differ on whether `total` counts them; more received is never short
            matched += 1
    total = bundle.get("total")
    return (total if isinstance(total, int) and not isinstance(total, bool) and total >= 0 else None), matched


def next_link(bundle: Mapping[str, Any]) -> str | None:
    links = bundle.get("link")
    for link in links if isinstance(links, list) else []:
        if isinstance(link, Mapping) and link.get("relation") == "next" and isinstance(link.get("url"), str):
            return str(link["url"])
    return None


def _is_error(outcome: Mapping[str, Any]) -> bool:
    issues = outcome.get("issue")
    return any(isinstance(i, Mapping) and i.get("severity") in ("error", "fatal")
               for i in (issues if isinstance(issues, list) else []))
