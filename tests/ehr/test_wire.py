"""ehr.wire: a total deadline per exchange (the socket is shut), and bodies inflated a bounded piece at a time."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator

import httpx
import pytest

from ebmrag.ehr.wire import PIECE, AnswerTimeout, Decoder, Exchange, UnaskedEncoding

Behaviour = Callable[[socket.socket, int], None]  # (connection, number of the request on it)


class RawServer:
    """An HTTP/1.1 server on 127.0.0.1 that answers each request with `behaviour`, byte by byte where it likes."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            for number in range(10):
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    request += chunk
                try:
                    self.behaviour(conn, number)
                except OSError:
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], RawServer]]:
    servers: list[RawServer] = []

    def start(behaviour: Behaviour) -> RawServer:
        servers.append(RawServer(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _drip(conn: socket.socket, data: bytes, every: float) -> None:
    for byte in data:
        conn.sendall(bytes([byte]))
        time.sleep(every)


def _ok(body: bytes = b'{"resourceType": "Bundle"}') -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/fhir+json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _read(http: httpx.Client, url: str, header_seconds: float, until: float = float("inf")) -> bytes:
    with Exchange(http, http.build_request("GET", url), header_seconds=header_seconds, until=until) as exchange:
        return b"".join(exchange.pieces())


def test_headers_dripped_a_byte_at_a_time_are_cut_at_the_deadline(serve: Callable[[Behaviour], RawServer]) -> None:
    server = serve(lambda conn, _: _drip(conn, b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n", 0.1))
    deadline = 1.0  # the head takes 23 s to drip
    with httpx.Client(timeout=30) as http:  # each byte would reset a read timeout: only the total deadline ends it
        started = time.monotonic()
        with pytest.raises(AnswerTimeout) as caught:
            _read(http, server.url, header_seconds=deadline)
    assert caught.value.phase == "headers"
    assert time.monotonic() - started < 3 * deadline


def test_a_kept_alive_connection_is_cut_too(serve: Callable[[Behaviour], RawServer]) -> None:
    """The second request reuses the first one's connection: no new socket is opened, the deadline still reaches it."""

    def answer(conn: socket.socket, number: int) -> None:
        if number == 0:
            conn.sendall(_ok())
        else:
            _drip(conn, b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 100, 0.1)

    server = serve(answer)
    with httpx.Client(timeout=30) as http:
        assert _read(http, server.url, header_seconds=5.0) == b'{"resourceType": "Bundle"}'
        deadline = 1.0  # the head takes a minute to drip
        started = time.monotonic()
        with pytest.raises(AnswerTimeout):
            _read(http, server.url, header_seconds=deadline)
        assert time.monotonic() - started < 3 * deadline
    assert server.connections == 1


def test_a_body_cut_by_its_deadline_is_never_taken_as_whole(serve: Callable[[Behaviour], RawServer]) -> None:
    """A close-delimited body ends when the socket is shut: that end must not read as the body's."""

    def answer(conn: socket.socket, _: int) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/fhir+json\r\nConnection: close\r\n\r\n")
        _drip(conn, b'{"resourceType": "Bundle", "entry": [' + b" " * 400, 0.02)

    server = serve(answer)
    with httpx.Client(timeout=30) as http, pytest.raises(AnswerTimeout) as caught:
        _read(http, server.url, header_seconds=5.0, until=time.monotonic() + 1.0)
    assert caught.value.phase == "body"


def test_a_gzip_bomb_is_inflated_one_bounded_piece_at_a_time() -> None:
    bomb = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    compressed = bomb.compress(b"\0" * (256 * 2**20)) + bomb.flush()  # 256 MiB of zeros in ~250 KB
    assert len(compressed) < 2**20
    tracemalloc.start()
    try:
        taken = 0
        for piece in Decoder("gzip").feed(compressed):
            assert len(piece) <= PIECE
            taken += len(piece)
            if taken >= 8 * 2**20:  # the reader's limit: it stops here
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"peak {peak} bytes while taking 8 MiB piece by piece"


@pytest.mark.parametrize("header", ["gzip, gzip", "br", "zstd", "compress", "gzip, deflate"])
def test_encodings_not_asked_for_or_stacked_are_refused(header: str) -> None:
    with pytest.raises(UnaskedEncoding):
        Decoder(header)


def test_gzip_deflate_raw_deflate_and_identity_decode() -> None:
    text = b"Observation " * 20_000
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    for header, body in [("gzip", gzip.compress(text)), ("deflate", zlib.compress(text)),
                         ("deflate", raw.compress(text) + raw.flush()), ("identity", text), (None, text)]:
        decoder = Decoder(header)
        assert b"".join(decoder.feed(body[:100]) ) + b"".join(decoder.feed(body[100:])) == text
        decoder.finish()


def test_a_compressed_body_cut_short_is_an_error() -> None:
    body = gzip.compress(b"AllergyIntolerance " * 5_000)
    decoder = Decoder("gzip")
    list(decoder.feed(body[: len(body) // 2]))
    with pytest.raises(httpx.DecodingError, match="cut short"):
        decoder.finish()


def test_the_exchange_asks_only_for_what_it_can_bound(serve: Callable[[Behaviour], RawServer]) -> None:
    seen: list[bytes] = []

    def answer(conn: socket.socket, _: int) -> None:
        conn.sendall(_ok())

    server = serve(answer)
    with httpx.Client() as http:
        request = http.build_request("GET", server.url)
        with Exchange(http, request, header_seconds=5.0, until=float("inf")) as exchange:
            seen.append(exchange.reply.request.headers["accept-encoding"].encode())
            b"".join(exchange.pieces())
    assert seen == [b"gzip, deflate"]


def test_gzip_members_one_after_another_are_all_read_and_trailing_junk_is_an_error() -> None:
    """RFC 1952 allows several members in one file; a Bulk Data file written in parts would lose its later lines."""
    body = gzip.compress(b'{"a": 1}\n') + gzip.compress(b'{"b": 2}\n') + gzip.compress(b'{"c": 3}\n')
    for cut in (5, len(body) // 2, len(body) - 3):
        decoder = Decoder("gzip")
        assert b"".join([*decoder.feed(body[:cut]), *decoder.feed(body[cut:])]) == b'{"a": 1}\n{"b": 2}\n{"c": 3}\n'
        decoder.finish()
    with pytest.raises(httpx.DecodingError, match="after its compressed stream"):
        list(Decoder("gzip").feed(gzip.compress(b"x") + b"<html>"))


def test_a_deflate_body_whose_first_chunk_is_one_byte_decodes() -> None:
    body = zlib.compress(b"Condition " * 1000)
    decoder = Decoder("deflate")
    assert b"".join([*decoder.feed(body[:1]), *decoder.feed(body[1:])]) == b"Condition " * 1000
    decoder.finish()


def test_an_alarm_never_outlives_an_exchange_whose_send_failed(serve: Callable[[Behaviour], RawServer]) -> None:
    """A refused connection used to leave its header alarm armed: a later healthy exchange on the same client was
    cut when it rang."""

    def slow_answer(conn: socket.socket, _: int) -> None:
        time.sleep(1.5)
        conn.sendall(_ok())

    server = serve(slow_answer)
    with httpx.Client(timeout=30) as http:
        with pytest.raises(httpx.ConnectError):
            _read(http, "http://127.0.0.1:9/", header_seconds=1.0)
        assert _read(http, server.url, header_seconds=5.0) == b'{"resourceType": "Bundle"}'
