"""Charts prepared when they are written: everything an ask computes per fragment whatever the question, computed
after the write instead of at the first question.

An ask on a stored chart used to embed the whole chart at question time (a cold ask on 3,000 fragments took a
minute, one of 10,001 timed out) although the chart was stored long before. After a write (PUT, append, a result
from the gateway) the patient joins a bounded queue, coalesced (queued twice: prepared once), and one worker
prepares it in the background:

- incrementally: only the fragments whose text has no vector yet (the caches are keyed by content, so "cached" is
  the test; the text's vector is computed last, so a cached text means a prepared fragment);
- per batch of `BATCH` fragments: the tier decision, the compressed state (state B), the vectors of both
  (`Resources.prepare`); then, once for the chart, the vectors of the sentences the gate searches the knowledge
  base with (`Engine.prepare`, all cache hits for the fragments). Token counts are not kept: an ask counts whole
  context lines, whose citation header depends on the question's numbering, and counting is cheap beside embedding;
- as background engine work (the scheduler's lane below every request: serve/scheduler.py), so it never delays
  an ask by more than one embedding step (`EMBED_STEP` texts). The ask computes whatever is still missing itself.

Erasure: `discard` drops the patient's queued preparation and stops a running one at its next checkpoint. The
worker reads the chart from the store while it counts as reading the record (the service's erasure waits for it
and forgets again), and after writing it reads the store once more and forgets what it prepared for fragments that
are gone meanwhile; so a preparation never leaves cache entries of an erased chart, even one running in another
process (the results gateway) that the erasing service cannot wait for.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from ebmrag.answer.engine import Engine
from ebmrag.compose import Resources
from ebmrag.protocols import WorkCancelled, checkpoints
from ebmrag.records.fragment import PatientRecord
from ebmrag.store.patients import PatientStore

log = logging.getLogger(__name__)
BATCH = 128  # fragments per background job: the unit a preparation is stopped, paused or resumed at
EMBED_STEP = 16  # texts per embedding call: an ask that arrives waits for at most one such forward pass


@dataclass
class Running:
    """Background work handed to a host: its outcome, and how to stop it (at its next checkpoint)."""

    future: Future[None]
    cancel: Callable[[], None]


# (tenant, patient, work) -> the work started in the background, counted as reading that patient's record
Host = Callable[[str, str, Callable[[], None]], Running]
Hold = Callable[[str, str], Callable[[], None]]  # (tenant, patient) -> release: erasure waits until released


def own_thread(tenant: str, patient: str, work: Callable[[], None]) -> Running:
    """A host without a scheduler (the results gateway): the work runs on a thread of its own, stopped at its next
    checkpoint when cancelled."""
    future: Future[None] = Future()
    stop = threading.Event()

    def check() -> None:
        if stop.is_set():
            raise WorkCancelled()

    def run() -> None:
        try:
            with checkpoints(check):
                work()
        except BaseException as exc:  # the preparer reads it from the future
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=run, name="ebmrag-prepare-work", daemon=True).start()
    return Running(future, stop.set)


def no_hold(tenant: str, patient: str) -> Callable[[], None]:
    return lambda: None


class ChartPreparer:
    """A bounded, coalesced queue of (tenant, patient) to prepare, and one worker thread that runs while the queue
    holds work (module doc)."""

    def __init__(self, store: PatientStore, resources: Callable[[], Resources], engine: Callable[[], Engine],
                 host: Host = own_thread, hold: Hold = no_hold, *, queue_limit: int = 10_000,
                 max_fragments: int = 10_000) -> None:
        """`resources` and `engine`: the shared models and the engine built from them, whose caches an ask reads
        (both built on first use); `host` runs each batch (the service: its scheduler's background lane);
        `hold` counts the work as reading a record; `queue_limit`: patients queued at most (one more is dropped:
        its first ask prepares it); `max_fragments`: a larger chart is not prepared (ask and pack refuse it)."""
        if queue_limit < 1:
            raise ValueError(f"queue_limit must be >= 1, got {queue_limit}")
        self.store, self._resources, self._engine, self._host, self._hold = store, resources, engine, host, hold
        self.queue_limit, self.max_fragments = queue_limit, max_fragments
        self._lock = threading.Condition()
        self._queue: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._current: tuple[str, str] | None = None
        self._running: Running | None = None
        self._discarded = False  # the current patient was erased meanwhile
        self._worker: threading.Thread | None = None
        self.counts = {"prepared": 0, "fragments": 0, "dropped": 0, "discarded": 0, "failed": 0}

    # --- the writers' side ----------------------------------------------------------------------------------

    def enqueue(self, tenant: str, patient: str) -> bool:
        """Prepare (tenant, patient)'s chart in the background; returns at once. False when the queue is full (the
        first ask prepares it instead). A patient already queued is not queued twice."""
        with self._lock:
            if (tenant, patient) in self._queue:
                return True
            if len(self._queue) >= self.queue_limit:
                self.counts["dropped"] += 1
                log.warning("chart preparation queue full (%d patients): a chart is left to its first ask",
                            self.queue_limit)
                return False
            self._queue[(tenant, patient)] = None
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="ebmrag-prepare", daemon=True)
                self._worker.start()
            return True

    def discard(self, tenant: str, patient: str) -> None:
        """Erasure: the patient's queued preparation is dropped, a running one stopped at its next checkpoint."""
        with self._lock:
            if self._queue.pop((tenant, patient), None) is not None or self._current == (tenant, patient):
                self.counts["discarded"] += 1
            if self._current == (tenant, patient):
                self._discarded = True
                if self._running is not None:
                    self._running.cancel()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until nothing is queued or running (tests, a shutdown); whether that happened within `timeout`."""
        with self._lock:
            return self._lock.wait_for(lambda: self._worker is None, timeout)

    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + (self._current is not None)

    # --- the worker -----------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    self._lock.notify_all()
                    return
                self._current, _ = self._queue.popitem(last=False)
                self._discarded = False
            tenant, patient = self._current
            try:
                self._prepare(tenant, patient)
            except (WorkCancelled, TimeoutError):
                log.info("a chart preparation was stopped (erased, or no slot in time)")
            except Exception as exc:  # the ask prepares what is missing itself; the worker goes on with the next
                self.counts["failed"] += 1
                log.warning("a chart preparation failed (%s)", type(exc).__name__)
            finally:
                with self._lock:
                    self._current, self._running = None, None

    def _prepare(self, tenant: str, patient: str) -> None:
        release = self._hold(tenant, patient)  # before the store is read: an erasure from now on waits for us
        record: PatientRecord | None = None
        try:
            record = self.store.record(tenant, patient)
            if record is None or not record.fragments:
                return
            if len(record.fragments) > self.max_fragments:
                log.info("a chart of %d fragments is not prepared (over %d)", len(record.fragments),
                         self.max_fragments)
                return
            self._prepare_record(tenant, patient, record)
        finally:
            release()
            if record is not None:
                self._forget_if_gone(tenant, patient, record)

    def _prepare_record(self, tenant: str, patient: str, record: PatientRecord) -> None:
        resources = self._resources()
        todo = [f for f, done in zip(record.fragments, resources.prepared(record.fragments), strict=True) if not done]
        for start in range(0, len(todo), BATCH):
            self._in_background(tenant, patient, partial(resources.prepare, todo[start : start + BATCH], EMBED_STEP))
        if todo:
            engine = self._engine()
            self._in_background(tenant, patient, lambda: engine.prepare(record))  # the gate's sentences
            self.counts["fragments"] += len(todo)
        self.counts["prepared"] += 1

    def _in_background(self, tenant: str, patient: str, work: Callable[[], None]) -> None:
        with self._lock:
            if self._discarded:
                raise WorkCancelled()
            self._running = self._host(tenant, patient, work)
            running = self._running
        running.future.result()

    def _forget_if_gone(self, tenant: str, patient: str, record: PatientRecord | None) -> None:
        """What this preparation wrote for fragments no longer stored (erased meanwhile, perhaps by another
        process) is forgotten: the store is read after the caches were written, so an erasure is either seen here
        or happened after the writes (and its own forgetting removed them)."""
        if record is None:
            return
        now = self.store.record(tenant, patient)
        kept = {(f.id, f.text) for f in now.fragments} if now is not None else set()
        gone = [f for f in record.fragments if (f.id, f.text) not in kept]
        if gone:
            with checkpoints(_never_stop):
                self._resources().forget(gone)


def _never_stop() -> None:
    """Erasure runs to its end, whoever asks to stop the work around it."""
