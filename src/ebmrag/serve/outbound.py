"""Outbound EHR calls (a chart pull, a Group export, a CDS hook's prefetch fetch): their network waits kept off the
engine slots, bounded per tenant and in all, and stopped with their connections closed.

A pull mostly waits on the EHR. Run as engine work it would hold a slot while it waits (another tenant's small read
queued behind a slow server); run on the event loop's thread pool, several pulls from a server that drips its
answer held threads every other route reads the store with (issue 43: another tenant's small read took 16 s). So:

- each call runs on a thread of its lane (`OutboundLane`), never an engine slot or the event loop's pool; a lane
  runs at most `calls` at once, a tenant at most `tenant_calls` of them; one more is refused at once (429 for the
  tenant, 503 for all) with Retry-After: the time until the earliest of them must end (its deadline);
- the call's CPU-bound steps (reading the kept resources, building the chart, storing it; reading an export's
  files; the cards) go to the fair scheduler as the tenant's engine work (`EngineSteps`), in its turn like any ask;
- a call is stopped at its request's deadline, when its client goes away, or when its patient is erased
  (`stop_patient`): its thread stops at its next `protocols.checkpoint()` (between two requests, two chunks of an
  answer, two batches of a step), its engine step leaves the queue or stops at its checkpoint, and the sockets of
  its HTTP client are shut down, so a server that holds a request open (headers dripped a byte at a time, or no
  answer at all) cannot keep the thread in a read. The request is answered once the thread has ended (within
  `STOP_GRACE` seconds), so a 504 means the call's place in the lane is free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from ebmrag.observe.tracing import bind
from ebmrag.protocols import WorkCancelled, checkpoints
from ebmrag.serve.problems import ProblemError
from ebmrag.serve.scheduler import Job

T = TypeVar("T")
STOP_GRACE = 5.0  # seconds a stopped call's thread is waited for before its request is answered anyway
DEADLINE, GONE, ERASED = "deadline", "client gone", "patient erased"  # why a call was stopped


class OutboundCall:
    """One request's outbound work, from its admission to the end of its thread."""

    def __init__(self, tenant: str, patient: str, seconds: float) -> None:
        self.tenant, self.patient = tenant, patient
        self.deadline = time.monotonic() + seconds
        self.stopped = ""  # why it was stopped (DEADLINE, GONE, ERASED); empty while it may go on
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stops: dict[int, Callable[[], None]] = {}  # what stops with it: its engine step in flight
        self._clients: list[httpx.Client] = []

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """The checkpoint hook on the call's thread."""
        if self.stopped or time.monotonic() >= self.deadline:
            raise WorkCancelled()

    def stop(self, why: str) -> None:
        """Stop the call: its thread at its next checkpoint, its engine step, its sockets now (module doc)."""
        with self._lock:
            if self.stopped:
                return
            self.stopped = why
            sockets, stops = list(self._sockets), list(self._stops.values())
        for sock in sockets:
            _shut(sock)
        for stop in stops:
            stop()

    def http(self, timeout: float) -> httpx.Client:
        """An HTTP client for this call's requests whose sockets `stop` shuts down; closed when the call ends.
        (httpcore reports each connection it opens to a request's `trace` extension; the request hook adds it.)"""
        client = httpx.Client(timeout=timeout, follow_redirects=False,
                              event_hooks={"request": [self._traced]})
        self._clients.append(client)
        return client

    def _traced(self, request: httpx.Request) -> None:
        previous = request.extensions.get("trace")  # the exchange's own (ehr.wire: its deadline's sockets)

        def trace(name: str, info: dict[str, Any]) -> None:
            self._connection_event(name, info)
            if previous is not None:
                previous(name, info)

        request.extensions["trace"] = trace

    def _connection_event(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's trace: a connection opened (TCP, then TLS over it) hands us its socket."""
        if not name.endswith((".connect_tcp.complete", ".start_tls.complete")):
            return
        sock = getattr(info.get("return_value"), "get_extra_info", lambda _: None)("socket")
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.append(sock)
            stopped = bool(self.stopped)
        if stopped:  # stopped while it connected
            _shut(sock)

    def also_stops(self, key: int, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops[key] = stop
            stopped = bool(self.stopped)
        if stopped:
            stop()

    def done_with(self, key: int) -> None:
        with self._lock:
            self._stops.pop(key, None)

    def close(self) -> None:
        for client in self._clients:
            client.close()


def _shut(sock: socket.socket) -> None:
    """Wake whoever reads `sock` (the call's thread) with an end of stream. The plain socket's shutdown, also for
    a TLS one: the TLS layer's own shutdown would tear its state down under the reading thread."""
    with contextlib.suppress(OSError):  # closed already
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class OutboundLane:
    """Threads for outbound calls: `calls` at once, `tenant_calls` of them per tenant (module doc)."""

    def __init__(self, calls: int, tenant_calls: int, name: str = "ehr") -> None:
        if calls < 1 or not 1 <= tenant_calls <= calls:
            raise ValueError(f"need calls >= 1 and 1 <= tenant_calls <= calls, got {calls}, {tenant_calls}")
        self.calls, self.tenant_calls, self.name = calls, tenant_calls, name
        self._lock = threading.Lock()
        self._running: list[OutboundCall] = []
        self._pool = ThreadPoolExecutor(calls, thread_name_prefix=f"ebmrag-{name}")
        self.counts: Counter[str] = Counter()  # refusals and stops, for the metrics

    def admit(self, tenant: str, patient: str, seconds: float) -> OutboundCall:
        """A place in the lane for `seconds`, or a 429 (the tenant's calls are all taken) / 503 (every call is)."""
        with self._lock:
            mine = [c for c in self._running if c.tenant == tenant]
            if len(mine) >= self.tenant_calls:
                self.counts["refused_429"] += 1
                raise ProblemError(429, "tenant-busy", f"this tenant already has {len(mine)} EHR calls running "
                                                       f"([serve] tenant_ehr_calls)",
                                   {"Retry-After": _retry_after(mine)})
            if len(self._running) >= self.calls:
                self.counts["refused_503"] += 1
                raise ProblemError(503, "server-busy", f"{len(self._running)} EHR calls are running ([serve] "
                                                       "ehr_calls); retry shortly",
                                   {"Retry-After": _retry_after(self._running)})
            call = OutboundCall(tenant, patient, seconds)
            self._running.append(call)
        return call

    async def run(self, call: OutboundCall, work: Callable[[OutboundCall], T]) -> T:
        """`work(call)` on a thread of the lane, its result or its exception; WorkCancelled when the call was
        stopped (its deadline, its client gone, its patient erased: `call.stopped` says which), once its thread
        has ended or `STOP_GRACE` has passed."""
        try:
            future = self._pool.submit(bind(lambda: self._execute(call, work)))
        except BaseException:  # the pool is shut down: the process is ending
            self._release(call)
            raise
        waiting = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), call.left() or 0.001)
        except asyncio.CancelledError:
            call.stop(GONE)  # nobody waits for the answer: no grace
            waiting.add_done_callback(_ignore_outcome)
            raise
        except BaseException:
            if waiting.done() and not call.stopped:
                raise  # the work's own outcome (a refusal, or its own deadline's WorkCancelled)
            call.stop(DEADLINE)  # the loop's timer (a call stopped already keeps its reason)
        self.counts["stopped"] += 1
        await asyncio.wait({waiting}, timeout=STOP_GRACE)
        if waiting.done() and waiting.exception() is None:
            return waiting.result()  # it ended before it saw the stop: what it did stands
        waiting.add_done_callback(_ignore_outcome)
        raise WorkCancelled()

    def _execute(self, call: OutboundCall, work: Callable[[OutboundCall], T]) -> T:
        try:
            with checkpoints(call.check):
                call.check()
                return work(call)
        except BaseException:
            if call.stopped:  # a shut socket surfaces as the server's failure: it was the stop
                raise WorkCancelled() from None
            raise
        finally:
            call.close()
            self._release(call)

    def _release(self, call: OutboundCall) -> None:
        with self._lock:
            self._running.remove(call)

    def stop_patient(self, tenant: str, patient: str) -> int:
        """Erasure: stop the calls working on (tenant, patient); how many there were."""
        with self._lock:
            found = [c for c in self._running if c.tenant == tenant and c.patient == patient and patient]
        for call in found:
            call.stop(ERASED)
        return len(found)

    def state(self) -> dict[str, int]:
        with self._lock:
            return {"calls": self.calls, "running": len(self._running)}


def render_lanes(lanes: Sequence[OutboundLane]) -> str:
    """Prometheus text lines: each lane's running calls and bound, its refusals and stops."""
    lines = ["# HELP ebmrag_ehr_calls Outbound EHR calls of this process by lane (calls: how many may run).",
             "# TYPE ebmrag_ehr_calls gauge"]
    lines += [f'ebmrag_ehr_calls{{lane="{lane.name}",state="{name}"}} {value}'
              for lane in lanes for name, value in lane.state().items()]
    lines += ["# HELP ebmrag_ehr_call_events_total Outbound EHR calls refused (lane full) or stopped (deadline, "
              "client gone, erasure).", "# TYPE ebmrag_ehr_call_events_total counter"]
    lines += [f'ebmrag_ehr_call_events_total{{lane="{lane.name}",event="{event}"}} {lane.counts.get(event, 0)}'
              for lane in lanes for event in ("refused_429", "refused_503", "stopped")]
    return "\n".join(lines) + "\n"


def _retry_after(calls: list[OutboundCall]) -> str:
    return str(max(1, math.ceil(min(c.left() for c in calls)))) if calls else "1"


class EngineSteps:
    """A call's CPU-bound steps as its tenant's engine work on the fair scheduler (`ehr.pull.StepRunner`): each
    waits for a slot in the tenant's turn, runs under the call's deadline, and stops when the call is stopped."""

    def __init__(self, call: OutboundCall, admit: Callable[[Callable[[], Any], float], Job],
                 cancel: Callable[[Job], None]) -> None:
        """`admit(step, seconds)` puts a step in the tenant's queue (the service's, which also counts it as reading
        the call's patient); `cancel(job)` takes it out or stops it."""
        self.call, self._admit, self._cancel = call, admit, cancel

    def __call__(self, step: Callable[[], T]) -> T:
        self.call.check()
        job = self._admit(step, self.call.left())
        self.call.also_stops(id(job), lambda: self._cancel(job))
        future: Future[T] = job.future
        try:
            return future.result(timeout=self.call.left() + STOP_GRACE)
        except TimeoutError:  # waited past the deadline, or the scheduler stopped the step (its deadline, a stop)
            self._cancel(job)
            raise WorkCancelled() from None
        finally:
            self.call.done_with(id(job))


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    """The outcome of a call nobody waits for: read so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
