"""A hostile FHIR server on 127.0.0.1 for the EHR client's tests and the probe (bench/probe_ehr.py).

One server, open (a token is handed to whoever asks, and never checked), one patient whose true chart holds a
penicillin allergy, a problem and a creatinine, served honestly or in one of the ways an EHR, a proxy in front of
it or a file store can fail or attack (`VARIANTS`; `SMART_VARIANTS` need a SMART connection). Each variant breaks
what the allergy record travels in; the client must then fail the pull or mark the allergies "not known", never
store "no allergy recorded" (issue 43). A Bulk Data export also holds a second patient, truly without allergies:
a file lost is lost for every chart of the export, so its "none recorded" must turn "not known" too.
"""

from __future__ import annotations

import gzip
import json
import secrets
import socket
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATIENT = "p1"
GIB = 2**30
FHIR_JSON = "application/fhir+json"
JSON = "application/json"
NDJSON = "application/fhir+ndjson"
# $everything's variants, then the Bulk Data export's (the allergy file's, and the manifest's)
PULL_VARIANTS = ("honest", "redirect-body", "redirect-empty", "no-content", "accepted", "html", "next-500",
                 "next-truncated", "next-cut", "next-cut-chunked", "short-total", "error-entry", "nul", "bomb",
                 "bomb-stacked", "br", "drip-headers", "drip-body", "search-without-allergy-search",
                 "allergy-without-id")
BULK_VARIANTS = ("bulk-honest", "bulk-redirect", "bulk-204", "bulk-html", "bulk-403", "bulk-truncated", "bulk-nul",
                 "bulk-error-entry", "bulk-gzip-members", "bulk-identifier-only", "bulk-cut", "bulk-gzip-cut")
VARIANTS = PULL_VARIANTS + BULK_VARIANTS
# the variants that need a SMART connection (a token to echo, a grant narrower than asked): an open server that
# leaves records out says nothing a client could see, so these are not in VARIANTS (bench/probe_ehr.py pulls openly)
SMART_VARIANTS = ("unauthorized-echo", "narrow-scope", "bulk-narrow-scope")
NARROW_SCOPE = "system/Patient.rs system/Condition.rs system/Observation.rs"  # granted, whatever was asked
DIAGNOSTICS = "HOSTILE-DIAGNOSTICS"  # in every OperationOutcome's free text: never to be relayed
SECOND = "p2"  # the Bulk Data export's second patient, truly without allergies


def chart() -> dict[str, dict[str, Any]]:
    """The patient's true chart, by resource type."""
    ours = {"reference": f"Patient/{PATIENT}"}
    return {
        "Patient": {"resourceType": "Patient", "id": PATIENT, "gender": "female", "birthDate": "1961-04-02"},
        "AllergyIntolerance": {"resourceType": "AllergyIntolerance", "id": "a1", "patient": ours,
                               "clinicalStatus": {"coding": [{"code": "active"}]},
                               "code": {"text": "penicillin"},
                               "reaction": [{"manifestation": [{"text": "anaphylaxis"}]}]},
        "Condition": {"resourceType": "Condition", "id": "c1", "subject": ours,
                      "code": {"text": "chronic kidney disease"}, "clinicalStatus": {"coding": [{"code": "active"}]}},
        "Observation": {"resourceType": "Observation", "id": "o1", "subject": ours, "status": "final",
                        "code": {"coding": [{"system": "http://loinc.org", "code": "2160-0"}], "text": "Creatinine"},
                        "valueQuantity": {"value": 2.9, "unit": "mg/dL"}, "effectiveDateTime": "2026-11-20"},
    }


def bundle(resources: list[dict[str, Any]], total: int | None = None, next_url: str = "",
           extra: list[dict[str, Any]] | None = None) -> bytes:
    entry = [{"fullUrl": f"urn:{r['resourceType']}/{r.get('id', 'no-id')}", "resource": r, "search": {"mode": "match"}}
             for r in resources]
    found = {"resourceType": "Bundle", "type": "searchset", "total": len(resources) if total is None else total,
             "link": [{"relation": "next", "url": next_url}] if next_url else [], "entry": [*entry, *(extra or [])]}
    return json.dumps(found).encode()


def second_chart() -> dict[str, dict[str, Any]]:
    """The export's second patient: a problem and no allergy, so its "none recorded" is true, unless a file was lost."""
    ours = {"reference": f"Patient/{SECOND}"}
    return {"Patient": {"resourceType": "Patient", "id": SECOND, "gender": "male", "birthDate": "1950-01-30"},
            "Condition": {"resourceType": "Condition", "id": "c-p2", "subject": ours, "code": {"text": "gout"},
                          "clinicalStatus": {"coding": [{"code": "active"}]}}}


def bomb_chunks() -> Iterator[bytes]:
    """1 GiB of zeros as gzip (about 1 MB), compressed as it is sent: a client that stops early costs little."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(2**20)
    for _ in range(GIB // len(zeros)):
        if packed := squeeze.compress(zeros):
            yield packed
    yield squeeze.flush()


class HostileFhir:
    """`with HostileFhir() as server:` serving `server.variant` at `server.base` (changeable between requests)."""

    def __init__(self, variant: str = "honest") -> None:
        self.variant = variant
        self.requests: list[str] = []
        self.tokens: list[str] = []  # every access token handed out
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                try:
                    outer.answer(self)
                except OSError:  # the client went away (a drip it cut off)
                    self.close_connection = True

            do_DELETE = do_GET  # noqa: N815 (http.server's name)

            def do_POST(self) -> None:  # the token endpoint
                outer.requests.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.grant(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/fhir"

    def __enter__(self) -> HostileFhir:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------------------------------------ routes
    def answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?")[0].removeprefix("/fhir")
        if path == "/.well-known/smart-configuration":
            return send(h, 200, json.dumps({"token_endpoint": f"{self.base}/token"}).encode(), content_type=JSON)
        if path == "/metadata":
            return send(h, 200, json.dumps(self.capability()).encode())
        if path == f"/Patient/{PATIENT}/$everything":
            return self.everything(h)
        if path == "/page2":
            return self.second_page(h)
        if path == "/Group/g1/$export":
            return send(h, 202, b"", extra={"Content-Location": f"{self.base}/status/1"})
        if path == "/status/1":
            return send(h, 202, b"") if h.command == "DELETE" else send(h, 200, json.dumps(self.manifest()).encode())
        if path.startswith("/files/"):
            return self.bulk_file(h, path.removeprefix("/files/").removesuffix(".ndjson"))
        kind = path.strip("/")
        if kind in chart():  # a search: Patient?_id=p1, Condition?patient=p1, ...
            return send(h, 200, bundle([chart()[kind]]))
        return send(h, 404, json.dumps({"resourceType": "OperationOutcome",
                                        "issue": [{"severity": "error", "code": "not-found",
                                                   "diagnostics": f"{DIAGNOSTICS}: {h.path}"}]}).encode())

    def grant(self, h: BaseHTTPRequestHandler) -> None:
        """An access token for any assertion (who asks is not checked here), remembered in `tokens`; in the
        narrow-scope variants granted for less than was asked, as a token endpoint may."""
        token = f"hostile-{secrets.token_urlsafe(16)}"
        self.tokens.append(token)
        scope = NARROW_SCOPE if self.variant.endswith("narrow-scope") else "system/*.rs"
        send(h, 200, json.dumps({"access_token": token, "token_type": "bearer", "expires_in": 300,
                                 "scope": scope}).encode(), content_type=JSON)

    def capability(self) -> dict[str, Any]:
        search_only = self.variant == "search-without-allergy-search"
        resources = [{"type": kind, "searchParam": [] if search_only and kind == "AllergyIntolerance" else
                      [{"name": "patient", "type": "reference"}]} for kind in chart() if kind != "Patient"]
        patient = {"type": "Patient", "searchParam": [{"name": "_id", "type": "token"}],
                   "operation": [] if search_only else [{"name": "everything"}]}
        return {"resourceType": "CapabilityStatement", "status": "active", "kind": "instance", "fhirVersion": "4.0.1",
                "format": ["json"], "rest": [{"mode": "server", "resource": [patient, *resources]}]}

    def everything(self, h: BaseHTTPRequestHandler) -> None:
        resources = list(chart().values())
        whole = bundle(resources)
        patient_only = bundle([chart()["Patient"]])
        first_half = bundle(halves()[0], total=4, next_url=f"{self.base}/page2")
        v = self.variant
        if v in ("honest", "search-without-allergy-search"):
            return send(h, 200, whole)
        if v in ("redirect-body", "redirect-empty"):
            return send(h, 302, patient_only if v == "redirect-body" else b"", extra={"Location": "/elsewhere"})
        if v in ("no-content", "accepted"):
            return send(h, 204 if v == "no-content" else 202, b"")
        if v == "html":
            return send(h, 200, patient_only, content_type="text/html; charset=utf-8")
        if v.startswith("next-"):
            return send(h, 200, first_half)
        if v == "short-total":
            return send(h, 200, bundle(halves()[0], total=4))
        if v == "error-entry":
            outcome = {"resource": {"resourceType": "OperationOutcome", "issue": [
                {"severity": "error", "code": "too-costly", "diagnostics": f"{DIAGNOSTICS}: allergies left out"}]},
                "search": {"mode": "outcome"}}
            return send(h, 200, bundle([r for r in resources if r["resourceType"] != "AllergyIntolerance"],
                                       extra=[outcome]))
        if v == "unauthorized-echo":  # its free text repeats the bearer token the request carried
            said = h.headers.get("Authorization", "")
            issue = {"severity": "error", "code": "login", "diagnostics": f"{DIAGNOSTICS}: {said} is not valid",
                     "details": {"text": said}}
            return send(h, 401, json.dumps({"resourceType": "OperationOutcome", "issue": [issue]}).encode(),
                        extra={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{said}"'})
        if v == "narrow-scope":  # what the token may not see is left out, silently, as servers do
            return send(h, 200, bundle([r for r in resources if r["resourceType"] != "AllergyIntolerance"]))
        if v == "allergy-without-id":
            allergy = {k: v for k, v in chart()["AllergyIntolerance"].items() if k != "id"}
            return send(h, 200, bundle([r if r["resourceType"] != "AllergyIntolerance" else allergy
                                        for r in resources]))
        if v == "nul":
            allergy = {**chart()["AllergyIntolerance"], "code": {"text": "penicillin\u0000"}}
            return send(h, 200, bundle([r if r["resourceType"] != "AllergyIntolerance" else allergy
                                        for r in resources]))
        if v == "bomb":
            return stream(h, bomb_chunks(), extra={"Content-Encoding": "gzip"})
        if v == "bomb-stacked":
            return send(h, 200, gzip.compress(gzip.compress(whole)), extra={"Content-Encoding": "gzip, gzip"})
        if v == "br":
            return send(h, 200, whole, extra={"Content-Encoding": "br"})
        if v == "drip-headers":
            return drip(h, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: 1\r\n" * 10_000, every=0.5)
        if v == "drip-body":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/fhir+json\r\nConnection: close\r\n\r\n")
            return drip(h, whole)
        raise AssertionError(f"no $everything for {v}")

    def second_page(self, h: BaseHTTPRequestHandler) -> None:
        """The page that holds the allergy (halves)."""
        rest = bundle(halves()[1], total=4)
        if self.variant == "next-500":
            return send(h, 500, json.dumps({"resourceType": "OperationOutcome", "issue": [
                {"severity": "fatal", "code": "exception", "diagnostics": f"{DIAGNOSTICS}: page lost"}]}).encode())
        if self.variant == "next-truncated":
            return send(h, 200, rest[: len(rest) // 2])
        if self.variant == "next-cut":  # says more than it sends, then hangs up
            return cut_short(h, rest, FHIR_JSON)
        if self.variant == "next-cut-chunked":  # half the body in a chunk, then hangs up without the last chunk
            return stream(h, [rest[: len(rest) // 2]], cut=True)
        return send(h, 200, rest)

    def manifest(self) -> dict[str, Any]:
        found = {"transactionTime": "2026-11-28T08:00:00Z", "request": f"{self.base}/Group/g1/$export",
                 "requiresAccessToken": False,
                 "output": [{"type": kind, "url": f"{self.base}/files/{kind}.ndjson"} for kind in chart()
                            if not (kind == "AllergyIntolerance" and self.variant == "bulk-narrow-scope")],
                 "error": []}
        if self.variant == "bulk-error-entry":
            found["error"] = [{"type": "OperationOutcome", "url": f"{self.base}/files/errors.ndjson"}]
        return found

    def bulk_file(self, h: BaseHTTPRequestHandler, kind: str) -> None:
        lines = b"".join(json.dumps(c[kind]).encode() + b"\n" for c in (chart(), second_chart()) if kind in c)
        v = self.variant if kind == "AllergyIntolerance" else "bulk-honest"
        if v == "bulk-redirect":
            return send(h, 302, b"", extra={"Location": "/elsewhere"})
        if v == "bulk-204":
            return send(h, 204, b"")
        if v == "bulk-403":
            return send(h, 403, b"")
        if v == "bulk-html":
            return send(h, 200, b"<html><body>Sign in</body></html>", content_type="text/html")
        if v == "bulk-truncated":
            return send(h, 200, lines[: len(lines) // 2], content_type="application/fhir+ndjson")
        if v == "bulk-gzip-members":  # two gzip members, as a file store may write a file in parts
            condition = {**chart()["Condition"], "id": "c2"}
            body = gzip.compress(json.dumps(condition).encode() + b"\n") + gzip.compress(lines)
            return send(h, 200, body, content_type="application/fhir+ndjson", extra={"Content-Encoding": "gzip"})
        if v == "bulk-identifier-only":  # whose it is said by identifier only: no chart of the export can take it
            allergy = {**chart()["AllergyIntolerance"], "patient": {"identifier": {"value": PATIENT}}}
            return send(h, 200, json.dumps(allergy).encode() + b"\n", content_type="application/fhir+ndjson")
        if v == "bulk-cut":  # says more than it sends, then hangs up
            return cut_short(h, lines, NDJSON)
        if v == "bulk-gzip-cut":  # HTTP-wise whole, but its gzip stream stops after the first line (a second, a
            squeeze = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # latex allergy, never comes)
            body = squeeze.compress(lines) + squeeze.flush(zlib.Z_FULL_FLUSH)  # decodes to whole lines exactly
            return send(h, 200, body, content_type=NDJSON, extra={"Content-Encoding": "gzip"})
        if v == "bulk-nul":
            nul = {**chart()["AllergyIntolerance"], "code": {"text": "penicillin\u0000"}}
            return send(h, 200, json.dumps(nul).encode() + b"\n", content_type="application/fhir+ndjson")
        return send(h, 200, lines, content_type="application/fhir+ndjson")


def halves() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The patient's resources on two search pages: the allergy is on the second, which the next-* variants spoil."""
    found = chart()
    return [found["Patient"], found["Condition"]], [found["AllergyIntolerance"], found["Observation"]]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up on a drip or a cut answer is what the variant is for, not an error."""


def send(h: BaseHTTPRequestHandler, status: int, body: bytes, *, content_type: str = FHIR_JSON,
         extra: dict[str, str] | None = None) -> None:
    h.send_response(status)
    if body or status == 200:
        h.send_header("Content-Type", content_type)
    for name, value in (extra or {}).items():
        h.send_header(name, value)
    if status not in (204, 304):
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def stream(h: BaseHTTPRequestHandler, chunks: Iterable[bytes], *, cut: bool = False,
           extra: dict[str, str] | None = None) -> None:
    """A 200 of FHIR JSON in chunks, sent as they are made; `cut`: the connection is shut without the last chunk."""
    h.send_response(200)
    for name, value in {"Content-Type": FHIR_JSON, "Transfer-Encoding": "chunked", **(extra or {})}.items():
        h.send_header(name, value)
    h.end_headers()
    for data in chunks:
        if data:  # an empty chunk would end the body
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    if cut:
        return hang_up(h)
    h.wfile.write(b"0\r\n\r\n")


def cut_short(h: BaseHTTPRequestHandler, body: bytes, content_type: str) -> None:
    """A 200 whose Content-Length says the whole body, of which 40 bytes come before the connection is shut."""
    h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                  % (content_type.encode(), len(body), body[:40]))
    hang_up(h)


def hang_up(h: BaseHTTPRequestHandler) -> None:
    h.close_connection = True
    h.connection.shutdown(socket.SHUT_RDWR)


def drip(h: BaseHTTPRequestHandler, data: bytes, every: float = 0.2, most: float = 60.0) -> None:
    """`data` one byte at a time, until the client hangs up or `most` seconds have passed."""
    started = time.monotonic()
    for byte in _bytes(data):
        if time.monotonic() - started > most:
            break
        h.wfile.write(byte)
        h.wfile.flush()
        time.sleep(every)
    h.close_connection = True


def _bytes(data: bytes) -> Iterator[bytes]:
    return (data[n:n + 1] for n in range(len(data)))
