"""Failed credentials throttled without locking out valid ones, and throttled refusals audited by the burst.

**Failures only.** A credential (an API key, a CDS client's JWT) is always checked first; only a check that fails
is counted, against the client's address and against the credential it named (a key's id; a CDS issuer and key
id). Past FAILED_BURST failures on either, refilling at FAILED_PER_SECOND, a failure is answered 429 with
Retry-After instead of 401. A valid credential is never refused for what other requests from its address or under
its name did: an attacker behind a shared proxy or NAT, or one sending bad secrets under a known key id, cannot lock
out a good key or an EHR's tokens. This gives a guesser nothing either: what stops guessing is the secret's size (a
key's 256 random bits, a JWT's signature), which no number of attempts reaches, and a valid key was always told
from an invalid one by the answer. What the throttle bounds is the noise of failures: the 401s a client is told
to stop sending, and the audit rows they write (below).

**Bounded memory.** The counts are token buckets by name, the least recently touched forgotten first past
MAX_TRACKED (a forgotten bucket is a full one, so a flood of new addresses only forgets old, idle ones). IPv6
addresses count by their /64, the block one subscriber is usually given, so walking through a block gains nothing.

**The audit.** A 429 is refused without its work, and a client that ignores Retry-After can send thousands a
second: one audit row each would let it grow the log, and the chain every process appends to, at network speed.
`ThrottledAudit` writes the first 429 of a burst as usual (its request id is found in the log like any refusal's),
counts the rest by who was throttled (the key, else the address) and where, and writes one summary row — "N more
... from <who> between t0 and t1" — when the burst has been quiet for QUIET_SECONDS, every SUMMARY_SECONDS while it
lasts, and when the service stops. The counts are per worker process.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from ebmrag.store.audit import AuditEntry
from ebmrag.store.database import now

FAILED_BURST = 20  # failures an address (or a credential) may have at once before they are answered 429
FAILED_PER_SECOND = 0.5  # ... and the rate at which that allowance comes back
MAX_TRACKED = 100_000  # buckets kept per kind; the least recently touched go first
QUIET_SECONDS = 10.0  # a burst of 429s this long without another has ended: its summary is written
SUMMARY_SECONDS = 60.0  # a burst that goes on is summarised this often
MAX_BURSTS = 10_000  # bursts followed at once; past it the least recently active is summarised and forgotten
log = logging.getLogger(__name__)
_KEY_ID = re.compile(r"^\s*Bearer\s+ebm_([0-9a-f]{12})_", re.IGNORECASE)  # the key format of store.access


class _Buckets:
    """Token buckets by name (FAILED_BURST, refilling at FAILED_PER_SECOND), least recently touched forgotten first."""

    def __init__(self, burst: float, rate: float, capacity: int, clock: Callable[[], float]) -> None:
        self.burst, self.rate, self.capacity, self.clock = burst, rate, capacity, clock
        self._left: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def spend(self, name: str) -> float:
        """Take one token: 0.0 when there was one, else the seconds until there is. A spend without a token still
        counts (the bucket stays empty while failures keep coming faster than it refills)."""
        moment = self.clock()
        tokens, last = self._left.pop(name, (self.burst, moment))
        tokens = min(self.burst, tokens + (moment - last) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        self._left[name] = (max(0.0, tokens - 1), moment)
        if len(self._left) > self.capacity:
            self._left.popitem(last=False)
        return wait


class FailedCredentials:
    """Failed attempts per client address and per credential (see the module doc). Shared by every way in — /v1
    and MCP (serve.guard), the /ui sign-in, CDS Hooks — so switching between them gains nothing."""

    def __init__(self, burst: float = FAILED_BURST, rate: float = FAILED_PER_SECOND, capacity: int = MAX_TRACKED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1 or rate <= 0 or capacity < 1:
            raise ValueError(f"burst must be >= 1, rate > 0 and capacity >= 1, got {burst}, {rate}, {capacity}")
        self._addresses = _Buckets(burst, rate, capacity, clock)
        self._credentials = _Buckets(burst, rate, capacity, clock)
        self._lock = threading.Lock()

    def failed(self, address: str, credential: str | None = None) -> float:
        """Count one failed check from `address` naming `credential` (None: it named none that can be told apart);
        the seconds the caller is to wait (0.0: not throttled, answer 401; else 429 with Retry-After)."""
        with self._lock:
            wait = self._addresses.spend(address_block(address))
            if credential:
                wait = max(wait, self._credentials.spend(credential))
        return wait


def address_block(address: str) -> str:
    """What an address counts as: itself, or for IPv6 its /64."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def key_credential(authorization: str | None) -> str | None:
    """The API key an Authorization header names, as a throttle name ("key:<id>"), or None when it names none."""
    match = _KEY_ID.match(authorization or "")
    return f"key:{match.group(1)}" if match else None


def named(kind: str, *parts: str) -> str:
    """A throttle name for parts a caller chose (a JWT's kid): hashed, so memory per name is bounded."""
    return f"{kind}:" + hashlib.sha256("\x00".join(parts).encode("utf-8", "replace")).hexdigest()[:24]


# --------------------------------------------------------------------------------------------- the audit of 429s
@dataclass
class _Burst:
    entry: AuditEntry  # the first refusal, as written
    who: str
    count: int = 0  # refusals since the last row, not yet written
    since: str = ""  # wall-clock time of the first of them
    until: str = ""  # ... and of the last
    last_request_id: str = ""
    started: float = 0.0  # monotonic: when the counted run began (the first refusal, or the last summary)
    seen: float = 0.0  # monotonic: the last refusal


class ThrottledAudit:
    """429 refusals written to the audit by the burst (see the module doc). `write` appends one entry to the log."""

    def __init__(self, write: Callable[[AuditEntry], object], quiet: float = QUIET_SECONDS,
                 every: float = SUMMARY_SECONDS, capacity: int = MAX_BURSTS,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], str] = now) -> None:
        if quiet <= 0 or every < quiet or capacity < 1:
            raise ValueError(f"quiet must be > 0, every >= quiet and capacity >= 1, got {quiet}, {every}, {capacity}")
        self.write, self.quiet, self.every, self.capacity = write, quiet, every, capacity
        self.clock, self.wall = clock, wall
        self._bursts: OrderedDict[tuple[str, str], _Burst] = OrderedDict()
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()

    def refused(self, entry: AuditEntry, who: str) -> None:
        """One throttled refusal: written when it opens a burst of `who` at `entry.action`, else counted."""
        moment = self.clock()
        with self._lock:
            due = self._take_ended(moment)
            burst = self._bursts.pop((who, entry.action), None)
            if burst is None:
                burst = _Burst(entry, who, started=moment)
                due.append(entry)
            else:
                burst.count += 1
                burst.since = burst.since or self.wall()
                burst.until, burst.last_request_id = self.wall(), entry.request_id
                if moment - burst.started >= self.every:
                    due += _summary(burst)
                    burst.count, burst.since, burst.started = 0, "", moment
            burst.seen = moment
            self._bursts[(who, entry.action)] = burst  # the most recently active last
            while len(self._bursts) > self.capacity:
                due += _summary(self._bursts.popitem(last=False)[1])
            self._start_sweeper()
        for row in due:
            self.write(row)

    def _take_ended(self, moment: float) -> list[AuditEntry]:
        """The summaries of bursts quiet for `quiet` seconds, which are forgotten (they are the least recently
        active, so they are found at the front without a scan)."""
        rows: list[AuditEntry] = []
        while self._bursts:
            name, burst = next(iter(self._bursts.items()))
            if moment - burst.seen < self.quiet:
                break
            rows += _summary(burst)
            del self._bursts[name]
        return rows

    def flush(self, everything: bool = False) -> int:
        """Write the summaries that are due (`everything`: of every burst, which ends them all: at shutdown);
        returns how many rows were written."""
        with self._lock:
            due = self._take_due(self.clock(), everything)
        for row in due:
            self.write(row)
        return len(due)

    def close(self) -> None:
        """Write every burst's summary and stop the sweeper (the service is stopping)."""
        self._stop.set()
        self.flush(everything=True)

    def _take_due(self, moment: float, everything: bool = False) -> list[AuditEntry]:
        """The summary rows due now; an ended burst is forgotten, a long one starts a new count."""
        rows: list[AuditEntry] = []
        for name, burst in list(self._bursts.items()):
            ended = everything or moment - burst.seen >= self.quiet
            if ended or moment - burst.started >= self.every:
                rows += _summary(burst)
                burst.count, burst.since, burst.started = 0, "", moment
            if ended:
                del self._bursts[name]
        return rows

    def _start_sweeper(self) -> None:
        """A daemon thread that writes summaries of bursts that have ended while nothing else is refused; it ends
        when no burst is left (and starts again with the next)."""
        if self._sweeper is not None or self._stop.is_set():
            return

        def sweep() -> None:
            while not self._stop.wait(self.quiet / 2):
                try:
                    self.flush()
                except Exception as exc:  # the store unreachable: said loudly, and the sweeper goes on
                    log.error("a summary of throttled refusals could not be written to the audit (%s)",
                              type(exc).__name__)
                with self._lock:
                    if not self._bursts:
                        self._sweeper = None
                        return

        self._sweeper = threading.Thread(target=sweep, name="ebmrag-throttled-audit", daemon=True)
        self._sweeper.start()


def _summary(burst: _Burst) -> list[AuditEntry]:
    """The row counting a burst's refusals since its last row (none when there were none)."""
    if not burst.count:
        return []
    action = (f"{burst.entry.action}: {burst.count} more from {burst.who} between {burst.since} and "
              f"{burst.until}")
    return [replace(burst.entry, patient="", action=action, request_id=burst.last_request_id, fragments=())]
