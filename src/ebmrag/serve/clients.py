"""The address a request comes from: the peer of the connection, or, behind a reverse proxy listed in [serve]
trusted_proxies, the address that proxy saw.

A forwarded header (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`) is text the client wrote until a proxy we trust has
written to it, so it is read only when the peer is such a proxy, and only the header that proxy writes ([serve]
forwarded_header): a proxy that appends to `X-Forwarded-For` passes a client's own `Forwarded` header on untouched,
and reading that one would let the client name its own address. The chain is read from the right (the standard
rule): each trusted proxy vouches for the hop to its left, so the client is the right-most address that is not a
trusted proxy. Whatever the client put further left is never read. A hop a trusted proxy wrote that is not an
address ("unknown", an obfuscated RFC 7239 identifier) ends the walk at that proxy.

The server's own proxy handling must be off (uvicorn's `--no-proxy-headers`; `ebmrag serve` and `ebmrag mcp` run it
with SERVER_OPTIONS): uvicorn otherwise replaces the peer with the last `X-Forwarded-For` hop of any request from
127.0.0.1, and this module would never see the real peer.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

from ebmrag.config import FORWARDED_HEADERS, proxy_networks

SERVER_OPTIONS: dict[str, Any] = {"proxy_headers": False}  # uvicorn: forwarded headers are read here, never there
UNKNOWN = "unknown"  # a connection without a peer address (a Unix socket, a test calling the app)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class ClientAddresses:
    """Who is calling, by address (see the module doc)."""

    def __init__(self, trusted_proxies: Sequence[str] = (), header: str = "x-forwarded-for") -> None:
        if header not in FORWARDED_HEADERS:
            raise ValueError(f"forwarded_header must be one of {', '.join(FORWARDED_HEADERS)}, got {header!r}")
        self.trusted, self.header = proxy_networks(trusted_proxies), header

    def of(self, scope: MutableMapping[str, Any]) -> str:
        """The client's address as text (IPv4-mapped IPv6 written as IPv4), or the peer's own text when it is no IP
        address."""
        client = scope.get("client")
        host = str(client[0]) if client else UNKNOWN
        peer = _address(host)
        if peer is None:
            return host[:64]
        if not self._trusted(peer):
            return str(peer)
        nearest = peer
        for hop in reversed(self._chain(scope.get("headers") or ())):
            address = _address(hop)
            if address is None:
                break
            if not self._trusted(address):
                return str(address)
            nearest = address
        return str(nearest)

    def _trusted(self, address: Address) -> bool:
        return any(address in network for network in self.trusted)

    def _chain(self, headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
        """The hops of the configured header, left (farthest) to right (nearest); header lines in their order."""
        name = self.header.encode()
        values = [v.decode("latin-1") for k, v in headers if k.lower() == name]
        if not values:
            return []
        if self.header == "x-real-ip":
            return [values[-1].strip()]  # one address, set (not appended) by the proxy
        joined = ",".join(values)
        return _forwarded_for(joined) if self.header == "forwarded" else [hop.strip() for hop in joined.split(",")]


def _forwarded_for(value: str) -> list[str]:
    """The `for=` of each element of an RFC 7239 Forwarded header ("" for an element without one), quoted strings
    read whole (a comma or semicolon inside quotes separates nothing)."""
    hops: list[str] = []
    found, pair, quoted, escaped = "", [], False, False
    for char in value + ",":
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                continue
            elif char == '"':
                quoted = False
                continue
            pair.append(char)
        elif char == '"':
            quoted = True
        elif char in ";,":
            name, equals, text = "".join(pair).partition("=")
            if equals and name.strip().lower() == "for":
                found = text.strip()
            pair = []
            if char == ",":
                hops.append(found)
                found = ""
        else:
            pair.append(char)
    return hops


def _address(hop: str) -> Address | None:
    """An IP address from a hop as proxies write it: "192.0.2.7", "192.0.2.7:4711", "[2001:db8::7]:4711",
    "2001:db8::7"; None for anything else ("unknown", "_hidden", text)."""
    text = hop.strip().strip('"')
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address
