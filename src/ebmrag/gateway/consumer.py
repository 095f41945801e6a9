"""The results gateway: Redis Streams in, the patient store out, at least once and never twice.

A consumer in a consumer group reads entries (`XREADGROUP`), turns each into a fragment and upserts it
into the store under the message's tenant and patient; only then does it acknowledge the entry
(`XACK`). The upsert is keyed by the result's fragment id, so an entry delivered again (a consumer died
after storing, before acknowledging) replaces the same fragment. Entries left pending by a dead consumer
are claimed after `claim_idle_ms` (`XAUTOCLAIM`). When Redis goes away the consumer reconnects with
backoff; SIGTERM ends it after the entry in hand.

No entry can block the stream. Entries are handled one at a time, and what happens to one never stops
the others of its batch, claimed or new:
- a message that cannot become a fragment (not UTF-8, invalid JSON, a field of the wrong type, an id
  with a control character, a FHIR resource of the wrong shape or that fails to render) or that names a
  tenant the store does not know goes to the dead-letter stream with the reason and is acknowledged;
- a store failure leaves the entry pending, to be claimed and tried again; when the store then does not
  answer a probe (`ping`), it is an outage: the batch stops, and nothing more is claimed until the store
  answers, so an outage does not use up deliveries;
- an entry delivered `max_deliveries` times without being stored (the store refuses that one entry, or
  the consumer died in the middle of it, again and again) is dead-lettered: "delivered N times without
  being stored". The delivery count is Redis's own (`XPENDING`).
Logs and dead-letter reasons name the entry and the problem, never the payload (it holds patient text).

`on_stored(tenant, patient)` is called after each result stored (`ebmrag gateway run --prepare` passes a chart
preparer's queue: serve/prepare.py); it must return at once, and its failure never affects the entry.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ebmrag.errors import require_extra
from ebmrag.observe.instruments import Consumed, consumed
from ebmrag.store.patients import PatientStore
from ebmrag.store.results import MessageError, ResultMessage, apply_message, parse_message

log = logging.getLogger(__name__)
STREAM, GROUP, DEAD = "ebmrag:results", "ebmrag", "ebmrag:results:dead"
MAX_DELIVERIES = 5
_DEAD_PAYLOAD = 100_000  # bytes of the payload kept in the dead-letter stream


@dataclass
class ConsumerStats:
    stored: int = 0
    pending: int = 0  # announcements of results still to come
    dead: int = 0  # dead-lettered, for whatever reason
    capped: int = 0  # ... of which: delivered max_deliveries times without being stored
    claimed: int = 0
    reconnects: int = 0
    failures: int = 0  # attempts the store failed: the entry stayed pending, to be tried again
    outages: int = 0  # store failures after which the store did not answer either: the batch was stopped
    reasons: list[str] = field(default_factory=list)


class StoreUnavailableError(Exception):
    """The store failed an entry and then did not answer a probe: an outage, not the entry's fault."""


class ResultConsumer:
    def __init__(self, store: PatientStore, broker: str, stream: str = STREAM, group: str = GROUP,
                 consumer: str | None = None, claim_idle_ms: int = 30_000, batch: int = 100,
                 block_ms: int = 1000, max_deliveries: int = MAX_DELIVERIES,
                 on_stored: Callable[[str, str], object] | None = None) -> None:
        if max_deliveries < 1:
            raise ValueError(f"max_deliveries must be at least 1, got {max_deliveries}")
        self.redis_module = require_extra("redis", "gateway", "the results gateway")
        self.store, self.broker, self.stream, self.group = store, broker, stream, group
        self.dead_stream = f"{stream}:dead"
        self.consumer = consumer or f"{socket.gethostname()}-{time.time_ns()}"
        self.claim_idle_ms, self.batch, self.block_ms = claim_idle_ms, batch, block_ms
        self.max_deliveries = max_deliveries
        self.on_stored = on_stored
        self.stats = ConsumerStats()
        self._stopping = False
        self._store_down = False
        self._client: Any = None

    # ------------------------------------------------------------------ connection
    def _connect(self) -> Any:
        """Bytes, not decoded text: an entry that is not UTF-8 must be one entry's problem (dead-lettered), not
        a decoding error in every read that returns it."""
        client = self.redis_module.Redis.from_url(self.broker, decode_responses=False, socket_timeout=10,
                                                  socket_connect_timeout=5)
        try:
            client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except self.redis_module.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        return client

    def stop(self, *_: Any) -> None:
        self._stopping = True

    # ------------------------------------------------------------------ the loop
    def run(self, until: Callable[[], bool] | None = None, handle_signals: bool = True) -> ConsumerStats:
        """Consume until SIGTERM/SIGINT, `stop()`, or `until()` is true."""
        if handle_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        backoff = 0.2
        while not self._stopping and not (until and until()):
            try:
                if self._client is None:
                    self._client = self._connect()
                self.step()
                backoff = 0.2
            except (self.redis_module.ConnectionError, self.redis_module.TimeoutError) as exc:
                log.warning("Redis unreachable (%s); retrying in %.1f s", type(exc).__name__, backoff)
                self._client = None
                self.stats.reconnects += 1
                backoff = self._pause(backoff)
            except self.redis_module.ResponseError as exc:  # NOGROUP: the stream was removed; else e.g. OOM
                log.warning("Redis refused a command (%s); retrying in %.1f s", str(exc)[:80], backoff)
                self._client = None  # the next connection creates the stream and its group again
                backoff = self._pause(backoff)
            except Exception as exc:  # the store is away: nothing was acknowledged, nothing more is claimed
                cause = str(exc) if isinstance(exc, StoreUnavailableError) else type(exc).__name__
                log.error("the store is unavailable (%s); retrying in %.1f s", cause, backoff)
                self._store_down = True
                backoff = self._pause(backoff)
        return self.stats

    @staticmethod
    def _pause(backoff: float) -> float:
        time.sleep(backoff)
        return min(backoff * 2, 5.0)

    def step(self) -> int:
        """Claim what dead consumers left, else read new entries; handle each; returns entries handled.
        After an outage the store is probed first, so entries are not claimed (and their deliveries not
        counted) while it is away."""
        client = self._client or self._connect()
        self._client = client
        if self._store_down:
            self.store.ping()  # raises while the store is still away
            self._store_down = False
            log.info("the store answers again")
        claimed = client.xautoclaim(self.stream, self.group, self.consumer, self.claim_idle_ms, "0-0",
                                    count=self.batch)
        entries = list(claimed[1]) if claimed else []
        self.stats.claimed += len(entries)
        deliveries = self._deliveries(client, [entry_id for entry_id, _ in entries])
        if not entries:
            read = client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=self.batch,
                                     block=self.block_ms)
            entries = [entry for _, stream_entries in read or [] for entry in stream_entries]
        for entry_id, fields in entries:
            if fields is None:  # claimed but deleted from the stream meanwhile
                client.xack(self.stream, self.group, entry_id)
                continue
            self.handle(client, entry_id, fields, deliveries.get(_text(entry_id), 1))
        return len(entries)

    def _deliveries(self, client: Any, entry_ids: Sequence[Any]) -> dict[str, int]:
        """How often each claimed entry has been delivered, this claim included (XPENDING)."""
        if not entry_ids:
            return {}
        with client.pipeline(transaction=False) as pipe:
            for entry_id in entry_ids:
                pipe.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
            found = pipe.execute()
        return {_text(row["message_id"]): int(row["times_delivered"]) for rows in found for row in rows}

    def handle(self, client: Any, entry_id: Any, fields: dict[Any, Any], deliveries: int = 1) -> None:
        """One entry: stored and acknowledged, dead-lettered and acknowledged, or left pending (a store failure).
        Raises StoreUnavailableError only when the store failed and then did not answer a probe. Each entry is
        a span and counts in the gateway's metrics (observe.instruments.consumed): its kind and outcome, and
        the lag from its arrival on the stream (the entry id's time) to the store."""
        with consumed(self.stream, self.group, _arrival(entry_id)) as report:
            self._handle(client, entry_id, fields, deliveries, report)

    def _handle(self, client: Any, entry_id: Any, fields: dict[Any, Any], deliveries: int, report: Consumed) -> None:
        payload = fields.get(b"message", fields.get("message", b""))
        if deliveries > self.max_deliveries:
            self._dead(client, entry_id, payload, f"delivered {deliveries - 1} times without being stored")
            self.stats.capped += 1
            report.outcome = "dead"
            return
        try:
            message = result_of(payload)
            report.kind = message.kind
            outcome = apply_message(self.store, message)  # MessageError: a tenant the store does not know
        except MessageError as exc:
            self._dead(client, entry_id, payload, str(exc))
            report.outcome = "dead"
            return
        except Exception as exc:  # the store failed: this entry's fault, or an outage?
            report.outcome = "dead" if self._store_failed(client, entry_id, payload, deliveries, exc) else "retry"
            return
        report.outcome = outcome
        self.stats.stored += outcome == "stored"
        self.stats.pending += outcome == "pending"
        client.xack(self.stream, self.group, entry_id)
        if outcome == "stored" and self.on_stored is not None:
            try:
                self.on_stored(message.tenant, message.patient_id)
            except Exception as exc:  # preparing is an optimisation: the entry is stored and acknowledged
                log.warning("entry %s stored; its chart was not queued for preparation (%s)", _text(entry_id),
                            type(exc).__name__)

    def _store_failed(self, client: Any, entry_id: Any, payload: Any, deliveries: int, exc: Exception) -> bool:
        """Whether the entry was dead-lettered (at its delivery cap); else it stays pending."""
        self.stats.failures += 1
        try:
            self.store.ping()
        except Exception:
            self.stats.outages += 1
            raise StoreUnavailableError(type(exc).__name__) from None
        if deliveries >= self.max_deliveries:
            self._dead(client, entry_id, payload,
                       f"delivered {deliveries} times without being stored (last: {type(exc).__name__})")
            self.stats.capped += 1
            return True
        log.warning("entry %s not stored (%s; delivery %d of %d): left pending to be tried again", _text(entry_id),
                    type(exc).__name__, deliveries, self.max_deliveries)
        return False

    def _dead(self, client: Any, entry_id: Any, payload: Any, reason: str) -> None:
        """Dead-letter first, acknowledge second: a crash between them leaves the entry pending (it is dead-
        lettered again), never lost."""
        client.xadd(self.dead_stream, {"message": payload[:_DEAD_PAYLOAD], "reason": reason,
                                       "entry": _text(entry_id)})
        client.xack(self.stream, self.group, entry_id)
        self.stats.dead += 1
        self.stats.reasons.append(reason)
        log.warning("entry %s dead-lettered: %s", _text(entry_id), reason)  # the reason, never the payload (PHI)


def result_of(payload: bytes | str) -> ResultMessage:
    """The message, checked to become a fragment: any failure before the store is reached is the message's
    (MessageError), so it is dead-lettered, never retried as if the store had failed."""
    message = parse_message(payload)
    try:
        message.record()
    except Exception as exc:
        raise MessageError(f"the message could not be turned into a fragment ({type(exc).__name__})") from None
    return message


def _arrival(entry_id: Any) -> float | None:
    """When the entry reached the stream (epoch seconds): Redis ids are `<milliseconds>-<sequence>`."""
    millis = _text(entry_id).partition("-")[0]
    return int(millis) / 1000 if millis.isdigit() else None


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
