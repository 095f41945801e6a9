"""One HTTP exchange with an EHR, inside bounds the server cannot stretch: a total deadline, and a body decoded a
bounded piece at a time.

httpx bounds each socket operation, not the exchange: a server that sends its headers a byte every few seconds
keeps a request open for ever, each byte resetting the read timeout. And httpx undoes a Content-Encoding a whole
network chunk at a time, stacked encodings included, so 32 KB of nested gzip becomes a gibibyte in memory before
anyone can count it (issue 43). Here:

- the headers must arrive by `header_seconds` after the request starts (connect and send included), the body by
  `until`; at either moment a watchdog shuts the sockets of the exchange's HTTP client, which wakes the reading
  thread with an end of stream, and the exchange raises `AnswerTimeout` (a body cut short by it is never taken as
  whole);
- only `gzip` and `deflate`, once, are asked for (`Accept-Encoding`); an answer in another or a stacked encoding is
  refused (`UnaskedEncoding`), and the body is inflated `PIECE` bytes at a time, so whoever takes the pieces stops
  a bomb at its own limit, having held at most one piece more;
- a compressed body that ends before its compressed stream does is a truncated answer (`httpx.DecodingError`).

The sockets are found through httpcore's connection trace (the `trace` request extension): each connection a
client opens is remembered with that client, so a deadline also reaches a kept-alive connection the exchange
reuses. A client is meant to serve one caller's exchanges at a time (a pull's, a call's): a deadline shuts every
connection of its client.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx

ACCEPT_ENCODING = "gzip, deflate"  # what is asked for; each is undone here, bounded (identity is always acceptable)
PIECE = 64 * 1024  # bytes of decoded body handed on at a time

Trace = Callable[[str, dict[str, Any]], None]


class AnswerTimeout(httpx.TimeoutException):
    """The exchange's total deadline passed: `phase` is "headers" (no complete answer head in time) or "body"."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"no complete answer {phase} within {seconds:g} s")
        self.phase, self.seconds = phase, seconds


KNOWN_CODINGS = frozenset({"gzip", "x-gzip", "deflate", "identity", "br", "zstd", "compress", "x-compress"})


class UnaskedEncoding(httpx.DecodingError):
    """The answer's Content-Encoding is not one that was asked for (or is several stacked)."""

    def __init__(self, encoding: str) -> None:
        codings = [c.strip().lower() for c in encoding.split(",")]
        shown = ", ".join(c if c in KNOWN_CODINGS else "an unknown coding" for c in codings)  # never its own words
        super().__init__(f"Content-Encoding {shown!r} was not asked for (gzip or deflate, once)")


class Decoder:
    """Undoes one Content-Encoding (or none) a bounded piece at a time."""

    def __init__(self, header: str | None) -> None:
        codings = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise UnaskedEncoding(header or "")
        self.coding = {"x-gzip": "gzip"}.get(codings[0], codings[0]) if codings else ""
        self._inflater = self._new(raw=False)
        self._started = False
        self._head = b""  # deflate: the first two bytes say whether it is zlib-wrapped or raw

    def _new(self, raw: bool) -> Any:
        if self.coding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded pieces of `data`, each at most PIECE bytes."""
        if not self.coding:
            for start in range(0, len(data), PIECE):
                yield data[start:start + PIECE]
            return
        if not self._started:
            data, self._head = self._head + data, b""
            if self.coding == "deflate" and len(data) < 2:  # a first chunk of one byte cannot say which deflate
                self._head = data
                return
            self._started = bool(data)
            if self.coding == "deflate" and data and not _zlib_header(data):  # raw deflate, as httpx accepts
                self._inflater = self._new(raw=True)
        yield from self._inflate(data)

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._inflater.eof:  # a compressed stream ended: what follows it, if anything
                data = self._next_member(self._inflater.unused_data + data)
                if not data:
                    return
            try:
                piece = self._inflater.decompress(data, PIECE)
            except zlib.error as exc:
                raise httpx.DecodingError(f"the {self.coding} body does not decode ({exc})") from None
            data = self._inflater.unconsumed_tail
            if piece:
                yield piece
            elif not data and not self._inflater.eof:
                return  # more input needed

    def _next_member(self, rest: bytes) -> bytes:
        """After a gzip member another may follow (RFC 1952: a file may hold several, as storage services write
        them): a fresh inflater reads it. Anything else after the end of the compressed data is an error, never
        silently dropped: the lines after it would be lost."""
        if not rest:
            return b""
        if self.coding == "gzip" and rest[:2] == b"\x1f\x8b":
            self._inflater = self._new(raw=False)
            return rest
        raise httpx.DecodingError(f"the {self.coding} body holds data after its compressed stream")

    def finish(self) -> None:
        """The body ended: a compressed one must have ended its compressed stream too."""
        if self._head:
            raise httpx.DecodingError(f"the {self.coding} body is one byte long")
        if self.coding and self._started and not self._inflater.eof:
            raise httpx.DecodingError(f"the {self.coding} body ends before its compressed stream does (cut short)")


def _zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class Exchange:
    """One request and its answer: `with Exchange(...) as exchange:` sends and waits for the head (by the header
    deadline; `exchange.reply` is the response), then `exchange.pieces()` yields the decoded body (by `until`)."""

    def __init__(self, http: httpx.Client, request: httpx.Request, *, header_seconds: float, until: float) -> None:
        """`until`: a `time.monotonic()` instant (inf: none beyond the header deadline's own)."""
        self.http, self.request = http, request
        self.header_seconds, self.until = header_seconds, until
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING
        self._sockets = _sockets_of(http)
        request.extensions["trace"] = _recorder(self._sockets, request.extensions.get("trace"))
        self._alarm: list[Any] | None = None
        self._token: object | None = None  # the armed alarm's: a ring of an earlier one is ignored
        self._rang = ""
        self._reply: httpx.Response | None = None

    def __enter__(self) -> Exchange:
        start = time.monotonic()
        self._arm(min(self.until, start + self.header_seconds), "headers")
        try:
            self._reply = self.http.send(self.request, stream=True)
        except httpx.TransportError:
            self._disarm()  # __exit__ does not run when __enter__ raises: the alarm must not outlive the exchange
            self._raise_if_rang()
            raise
        except BaseException:
            self._disarm()
            raise
        self._arm(self.until, "body")
        return self

    @property
    def reply(self) -> httpx.Response:
        assert self._reply is not None, "reply inside the with block"
        return self._reply

    def pieces(self) -> Iterator[bytes]:
        """The body, decoded, PIECE bytes at a time (UnaskedEncoding before the first: nothing is read)."""
        decoder = Decoder(self.reply.headers.get("content-encoding"))
        try:
            for raw in self.reply.iter_raw():
                yield from decoder.feed(raw)
            self._raise_if_rang()  # a body ended by the watchdog's shutdown is cut short, not whole
            decoder.finish()
        except httpx.TransportError:
            self._raise_if_rang()
            raise

    def __exit__(self, *exc: object) -> None:
        self._disarm()
        if self._reply is not None:
            with contextlib.suppress(httpx.HTTPError, OSError):
                self._reply.close()

    def _arm(self, when: float, phase: str) -> None:
        self._disarm()
        if when != float("inf"):
            token = self._token = object()
            self._alarm = _WATCHDOG.call_at(when, lambda: self._ring(token, phase))

    def _disarm(self) -> None:
        _WATCHDOG.cancel(self._alarm)
        self._alarm, self._token = None, None

    def _ring(self, token: object, phase: str) -> None:
        if self._token is not token:  # taken off the heap just as it was disarmed: that exchange is over
            return
        self._rang = phase
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):  # closed already; the plain socket's shutdown, also under TLS
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _raise_if_rang(self) -> None:
        if self._rang:
            raise AnswerTimeout(self._rang, self.header_seconds if self._rang == "headers" else 0.0)


# ------------------------------------------------------------------------------------------- sockets per client
_CLIENT_SOCKETS: weakref.WeakKeyDictionary[httpx.Client, set[socket.socket]] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def _sockets_of(http: httpx.Client) -> set[socket.socket]:
    with _REGISTRY_LOCK:
        found = _CLIENT_SOCKETS.get(http)
        if found is None:
            found = _CLIENT_SOCKETS[http] = set()
        for sock in [s for s in found if s.fileno() == -1]:  # closed connections
            found.discard(sock)
        return found


def _recorder(sockets: set[socket.socket], previous: Trace | None) -> Trace:
    """A trace that remembers each socket a connection opens (TCP, then TLS over it), then calls `previous`."""

    def trace(name: str, info: dict[str, Any]) -> None:
        if name.endswith((".connect_tcp.complete", ".start_tls.complete")):
            sock = getattr(info.get("return_value"), "get_extra_info", lambda _: None)("socket")
            if isinstance(sock, socket.socket):
                with _REGISTRY_LOCK:
                    sockets.add(sock)
        if previous is not None:
            previous(name, info)

    return trace


# ------------------------------------------------------------------------------------------------- watchdog
class _Watchdog:
    """One daemon thread that runs each armed action at its moment (`time.monotonic()`), unless cancelled."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._heap: list[tuple[float, int, list[Any]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def call_at(self, when: float, action: Callable[[], None]) -> list[Any]:
        handle: list[Any] = [action]
        with self._ready:
            heapq.heappush(self._heap, (when, next(self._order), handle))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ebmrag-ehr-deadlines", daemon=True)
                self._thread.start()
            self._ready.notify()
        return handle

    @staticmethod
    def cancel(handle: list[Any] | None) -> None:
        if handle is not None:
            handle[0] = None

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._heap and self._heap[0][2][0] is None:
                    heapq.heappop(self._heap)  # cancelled
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is None or wait > 0:
                    self._ready.wait(wait)
                    continue
                action = heapq.heappop(self._heap)[2][0]
            if action is not None:
                with contextlib.suppress(Exception):  # a failing action must not end the watchdog
                    action()


_WATCHDOG = _Watchdog()
