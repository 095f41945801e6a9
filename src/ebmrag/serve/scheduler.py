"""Fair scheduling of engine work between tenants: a few engine slots, a queue per tenant served in turn, and a
bound on each request's work.

Engine work (embedding a chart, tiering, packing, answering) is CPU-bound, and a cold request on a large chart
runs for a minute; behind one lock, one tenant's such request stalled every other tenant's (issue 32). Here:

- at most `slots` requests do engine work at once in this process, each on its own thread; a tenant has at
  most `tenant_slots` of them started (running or paused), all of them by default: a tenant alone uses every
  core (issue 33), and gives slots back as soon as others need them (below);
- a request that finds no free slot waits in its tenant's queue, and each freed slot goes to the tenant whose
  turn it is: the one with the fewest requests started, then the one served longest ago (round robin among
  equals), so a tenant with many requests, or big ones, waits behind itself and not behind others;
- the queues are bounded: a tenant's own at `tenant_queue` waiting requests (then 429), all together at
  `queue_limit` (then 503), both with Retry-After; memory does not grow with the backlog;
- long work reaches `protocols.checkpoint()` between batches. There it stops (`WorkCancelled`) once its request
  has timed out or gone away, so a 504 frees its slot within one batch; and once it has run for a slice
  (`slice_seconds`) while another tenant waits, it pauses, hands its slot over and resumes in its tenant's next
  turn (a paused request still counts as started, so its tenant's turn comes after idle tenants'). A tenant
  holding more than its fair share of the slots (slots / tenants with work, rounded up) while another tenant
  waits pauses at its next checkpoint without finishing its slice. One large request therefore delays another
  tenant's small one by about a slice even with one slot, and by one batch when its tenant held more than its
  share. Work with no checkpoint (a long model call) keeps its slot: `tenant_slots` below `slots` keeps one free
  for others.
- a request that has just started runs alone for its first slice: another tenant's request that has run for more
  than a slice waits at its next checkpoint (keeping its slot) until that slice ends or the newcomer finishes.
  Engine work is mostly Python, so two requests in one process share one core's worth of the interpreter lock;
  without this, a small request beside a large one took several times its own time (issue 33: another tenant's
  small request during the largest ask). A long request waits at most a slice for each newcomer.

Background work (preparing a chart after it was stored: serve/prepare.py) has a lane of its own below every
tenant's queue: it gets a slot only while no request's engine work runs or waits, and pauses at its next
checkpoint as soon as a request arrives (one embedding batch, not a slice). It never counts as a tenant's started
work, so it changes no tenant's turn, and it is never refused: its producer bounds it (one job at a time).

Outbound EHR work (a pull, an export, a CDS fetch) waits on the network, which must not hold a slot: it waits on a
lane of its own (serve/outbound.py), and only its CPU-bound steps come here, each one job of its tenant's.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ebmrag.config import ServeSettings
from ebmrag.observe.tracing import bind
from ebmrag.protocols import WorkCancelled, checkpoints
from ebmrag.serve.problems import ProblemError

T = TypeVar("T")
SLICE_SECONDS = 0.25  # a request runs at least this long before it pauses for another tenant's waiting one
STARTED_PER_SLOT = 4  # started requests (running or paused) per slot: paused ones hold a thread and their state


@dataclass(eq=False)
class Job:
    """One request's engine work, from its admission to its end."""

    tenant: str
    work: Callable[[], Any]
    deadline: float  # time.monotonic() after which the work is stopped at its next checkpoint
    future: Future[Any] = field(default_factory=Future)
    wake: threading.Event = field(default_factory=threading.Event)  # set when a paused job may go on
    started: bool = False  # has a thread (running or paused)
    holds_slot: bool = False
    cancelled: bool = False
    slice_end: float = 0.0
    background: bool = False  # the lane below the tenants' queues (module doc)
    first_dispatch: float = 0.0  # time.monotonic() when it first got a slot

    def expired(self) -> bool:
        return self.cancelled or time.monotonic() >= self.deadline


class FairScheduler:
    """Runs blocking engine work on its own threads: `slots` at a time, tenants served in turn (module doc)."""

    def __init__(self, slots: int, tenant_slots: int, tenant_queue: int, queue_limit: int,
                 slice_seconds: float = SLICE_SECONDS) -> None:
        if slots < 1 or not 1 <= tenant_slots <= slots or tenant_queue < 1 or queue_limit < 1:
            raise ValueError(f"need slots >= 1, 1 <= tenant_slots <= slots, tenant_queue >= 1 and queue_limit >= 1; "
                             f"got {slots}, {tenant_slots}, {tenant_queue}, {queue_limit}")
        self.slots, self.tenant_slots, self.slice_seconds = slots, tenant_slots, slice_seconds
        self.tenant_queue, self.queue_limit = tenant_queue, queue_limit
        self._max_started = slots * STARTED_PER_SLOT
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)  # a request ended: those giving way look again
        self._newcomers: dict[Job, float] = {}  # requests in their first slice: when it ends
        self._queues: dict[str, deque[Job]] = {}  # tenants with waiting jobs; paused jobs first, then new ones
        self._background: deque[Job] = deque()  # background jobs waiting for a slot; paused ones first
        self._requests_running = 0  # jobs holding a slot that are not background work
        self._served: dict[str, int] = {}  # the dispatch count when each tenant last got a slot: who waited longest
        self._dispatches = 0
        self._running = 0  # jobs holding a slot
        self._started = 0  # jobs with a thread: running or paused
        self._active: Counter[str] = Counter()  # started jobs per tenant
        self._holding: Counter[str] = Counter()  # slots held per tenant (requests only)
        self._waiting = 0  # admitted jobs not started yet
        self._pool = ThreadPoolExecutor(self._max_started, thread_name_prefix="ebmrag-engine")
        self.counts: Counter[str] = Counter()  # pauses, cancellations, refusals: for /metrics

    @classmethod
    def for_service(cls, serve: ServeSettings) -> FairScheduler:
        """[serve] engine_slots (0: the CPU count), tenant_slots (0: all of them), the queue bounds."""
        slots = serve.engine_slots or os.cpu_count() or 1
        return cls(slots, min(serve.tenant_slots or slots, slots), serve.tenant_queue, serve.queue_limit)

    # --- entry points --------------------------------------------------------------------------------------

    async def run(self, tenant: str, work: Callable[[], T], seconds: float) -> T:
        """`work` on an engine slot, its result or its exception; TimeoutError after `seconds` (the work is then
        stopped at its next checkpoint, or taken out of its queue). 429/503 ProblemError when the queue is full."""
        return await self.wait(self.submit(tenant, work, seconds), seconds)  # type: ignore[no-any-return]

    async def wait(self, job: Job, seconds: float) -> Any:
        """The submitted job's result; TimeoutError after `seconds`, and the job is cancelled."""
        waiting = asyncio.wrap_future(job.future)
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), seconds)
        except BaseException:  # timed out, or the client went away (CancelledError): nobody wants the answer
            self.cancel(job)
            waiting.add_done_callback(_ignore_outcome)
            raise

    def submit(self, tenant: str, work: Callable[[], Any], seconds: float, background: bool = False) -> Job:
        """Admit `work` to its tenant's queue (429/503 ProblemError when full); its future is done once its
        thread has ended, or once it leaves the queue unstarted. `background`: the lane below every request
        (module doc), never refused. The work runs under the caller's trace context (its spans are children of
        the request's span; a thread of the pool does not inherit it)."""
        work = bind(work)
        if background:
            with self._lock:
                job = Job(tenant, work, time.monotonic() + seconds, background=True)
                self._enqueue(job)
                self._dispatch()
            return job
        with self._lock:
            queued = sum(1 for job in self._queues.get(tenant, ()) if not job.started)
            if queued >= self.tenant_queue:
                self.counts["refused_429"] += 1
                raise ProblemError(429, "tenant-busy", f"this tenant already has {queued} requests waiting for the "
                                                       "engine", {"Retry-After": self._retry_after()})
            if self._waiting >= self.queue_limit:
                self.counts["refused_503"] += 1
                raise ProblemError(503, "server-busy", f"{self._waiting} requests are waiting for the engine; "
                                                       "retry shortly", {"Retry-After": self._retry_after()})
            job = Job(tenant, work, time.monotonic() + seconds)
            self._enqueue(job)
            self._waiting += 1
            self._dispatch()
        return job

    def cancel(self, job: Job) -> None:
        """Nobody wants this job's result: a waiting one leaves its queue, a running or paused one stops at its
        next checkpoint (a paused one is woken to stop)."""
        with self._lock:
            if job.cancelled or job.future.done():
                return
            job.cancelled = True
            self.counts["cancelled"] += 1
            if job.holds_slot or not self._withdraw(job):
                return
            if job.started:
                job.wake.set()  # paused: it wakes without a slot, sees it is cancelled and ends
            else:
                self._waiting -= not job.background
                job.future.set_exception(_stopped())

    def state(self) -> dict[str, int]:
        with self._lock:
            return {"slots": self.slots, "running": self._running, "started": self._started,
                    "waiting": self._waiting, "background": len(self._background) + self._running
                    - self._requests_running}

    def render(self) -> str:
        """Prometheus text lines: slots, running, paused and waiting work, pauses, cancellations, refusals."""
        with self._lock:
            gauges = {"slots": self.slots, "running": self._running, "paused": self._started - self._running,
                      "waiting": self._waiting, "background_running": self._running - self._requests_running}
            counts = dict(self.counts)
        lines = ["# HELP ebmrag_engine_work Engine work of this process by state (slots: how many may run).",
                 "# TYPE ebmrag_engine_work gauge"]
        lines += [f'ebmrag_engine_work{{state="{name}"}} {value}' for name, value in gauges.items()]
        lines += ["# HELP ebmrag_engine_events_total Pauses for another tenant, cancellations, refusals.",
                  "# TYPE ebmrag_engine_events_total counter"]
        lines += [f'ebmrag_engine_events_total{{event="{name}"}} {counts.get(name, 0)}'
                  for name in ("paused", "gave_way", "cancelled", "refused_429", "refused_503")]
        return "\n".join(lines) + "\n"

    # --- the worker's side ---------------------------------------------------------------------------------

    def _execute(self, job: Job) -> None:
        outcome: tuple[bool, Any] = (False, None)
        try:
            with checkpoints(lambda: self._checkpoint(job)):
                self._checkpoint(job)  # it may have waited past its deadline
                outcome = (True, job.work())
        except WorkCancelled:
            outcome = (False, _stopped())
        except BaseException as exc:  # the caller gets it
            outcome = (False, exc)
        finally:
            self._finish(job)
        if outcome[0]:
            job.future.set_result(outcome[1])
        else:
            job.future.set_exception(outcome[1])

    def _checkpoint(self, job: Job) -> None:
        if job.expired():
            raise WorkCancelled()
        if not job.background and self._newcomers:  # a hint without the lock, checked under it
            self._give_way(job)
        if not self._queues and not job.background:  # nobody waits (read without the lock: a hint, checked below)
            return
        with self._lock:
            if not self._yields(job):
                return
            self._release(job)  # pause: the slot goes to another tenant's turn
            self.counts["paused"] += 1
            job.wake.clear()
            self._enqueue(job, paused=True)
            self._dispatch()
        self._resume(job)

    def _give_way(self, job: Job) -> None:
        """Wait, keeping the slot, while another tenant's request that started after this one is in its first
        slice (module doc), once this one has run for a slice itself (two new requests share); stop when this job's
        deadline passes or it is cancelled meanwhile."""
        if time.monotonic() < job.first_dispatch + self.slice_seconds:
            return
        with self._finished:
            while True:
                now = time.monotonic()
                if job.expired():
                    raise WorkCancelled()
                ends = [end for other, end in self._newcomers.items()
                        if other.tenant != job.tenant and other.first_dispatch > job.first_dispatch and end > now]
                if not ends:
                    return
                self.counts["gave_way"] += 1
                self._finished.wait(max(0.0, min(max(ends), job.deadline) - now))

    def _resume(self, job: Job) -> None:
        """Wait for a slot again; stop when the deadline passes first or the job is cancelled meanwhile."""
        job.wake.wait(timeout=max(0.0, job.deadline - time.monotonic()))
        with self._lock:
            if not job.holds_slot:  # deadline passed while paused, or woken to stop
                self._withdraw(job)
                raise WorkCancelled()
        if job.expired():
            raise WorkCancelled()

    def _yields(self, job: Job) -> bool:
        """Whether `job` pauses at this checkpoint: a request when another tenant's work may start; background
        work whenever a request runs beside it or waits."""
        if job.background:
            return self._requests_running > 0 or any(self._eligible(queue[0]) for queue in self._queues.values())
        others = [t for t, queue in self._queues.items() if t != job.tenant and self._eligible(queue[0])]
        if not others:
            return False
        if time.monotonic() >= job.slice_end:
            return True
        tenants = len(set(others) | {t for t, held in self._holding.items() if held})
        return self._holding[job.tenant] > -(-self.slots // tenants)  # over its share (rounded up): give one back

    def _finish(self, job: Job) -> None:
        with self._lock:
            if self._newcomers.pop(job, None) is not None:
                self._finished.notify_all()
            self._release(job)
            self._started -= 1
            if not job.background:
                self._active[job.tenant] -= 1
                if not self._active[job.tenant]:
                    del self._active[job.tenant]
            self._dispatch()

    # --- the queue (under self._lock) ----------------------------------------------------------------------

    def _enqueue(self, job: Job, paused: bool = False) -> None:
        """A new job joins the back of its tenant's queue; a paused one the front (it is its tenant's oldest)."""
        queue = self._background if job.background else self._queues.setdefault(job.tenant, deque())
        if paused:
            queue.appendleft(job)
        else:
            queue.append(job)

    def _withdraw(self, job: Job) -> bool:
        queue = self._background if job.background else self._queues.get(job.tenant)
        if queue is None or job not in queue:
            return False
        queue.remove(job)
        if not queue and not job.background:
            del self._queues[job.tenant]
        return True

    def _eligible(self, job: Job) -> bool:
        """A paused job may always go on; a new one only under its tenant's cap and the cap on started jobs."""
        return job.started or (self._active[job.tenant] < self.tenant_slots and self._started < self._max_started)

    def _dispatch(self) -> None:
        """Free slots go to the tenants whose turn it is (`_next`)."""
        while self._running < self.slots:
            job = self._next()
            if job is None:
                return
            self._running += 1
            self._requests_running += not job.background
            self._holding[job.tenant] += not job.background
            job.holds_slot = True
            job.slice_end = time.monotonic() + self.slice_seconds
            if job.started:
                job.wake.set()
                continue
            job.started = True
            job.first_dispatch = time.monotonic()
            self._started += 1
            if not job.background:
                self._waiting -= 1
                self._active[job.tenant] += 1
                self._newcomers[job] = job.slice_end
            self._pool.submit(self._execute, job)

    def _next(self) -> Job | None:
        """The first job of the tenant whose turn it is, among those whose first job may start: the fewest jobs
        started, then the longest since its last slot (never served: first)."""
        ready = [tenant for tenant, queue in self._queues.items() if self._eligible(queue[0])]
        if not ready:
            return self._next_background()
        tenant = min(ready, key=lambda t: (self._active[t], self._served.get(t, -1)))
        self._dispatches += 1
        self._served[tenant] = self._dispatches
        queue = self._queues[tenant]
        job = queue.popleft()
        if not queue:
            del self._queues[tenant]
        return job

    def _next_background(self) -> Job | None:
        """The first background job, when no request's work runs (a paused background job may always go on;
        a new one needs a free thread)."""
        if not self._background or self._requests_running:
            return None
        job = self._background[0]
        if not job.started and self._started >= self._max_started:
            return None
        return self._background.popleft()

    def _release(self, job: Job) -> None:
        if job.holds_slot:
            job.holds_slot = False
            self._running -= 1
            self._requests_running -= not job.background
            if not job.background:
                self._holding[job.tenant] -= 1
                if not self._holding[job.tenant]:
                    del self._holding[job.tenant]

    def _retry_after(self) -> str:
        return str(max(1, math.ceil(self._waiting / self.slots)))


class Deadline:
    """Checkpoints for work that needs no engine slot (tiering a chart to list it): stopped, not paused."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.cancelled = False

    def check(self) -> None:
        if self.cancelled or time.monotonic() >= self.deadline:
            raise WorkCancelled()

    def run(self, work: Callable[[], T]) -> T:
        with checkpoints(self.check):
            return work()


def _stopped() -> TimeoutError:
    return TimeoutError("the work was stopped: its request timed out or went away")


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    """The answer of a request that timed out: read so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
