"""The results gateway: Redis Streams in, the patient store out, at least once and never twice.

A consumer in a consumer group reads entries (`XREADGROUP`), turns each into a fragment and upserts it
into the store under the message's tenant and patient; only then does it acknowledge the entry
(`XACK`). The upsert is keyed by the result's fragment id, so an entry delivered again (a consumer died
after storing, before acknowledging) replaces the same fragment. Entries left pending by a dead consumer
are claimed after `claim_idle_ms` (`XAUTOCLAIM`). A message that fails validation, or names a tenant the
store does not know, goes to the dead-letter stream with the reason and is acknowledged; it is never
stored. When Redis goes away the consumer reconnects with backoff; SIGTERM ends it after the entry in hand.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ebmrag.errors import require_extra
from ebmrag.store.patients import PatientStore
from ebmrag.store.results import MessageError, apply_message, parse_message

log = logging.getLogger(__name__)
STREAM, GROUP, DEAD = "ebmrag:results", "ebmrag", "ebmrag:results:dead"


@dataclass
class ConsumerStats:
    stored: int = 0
    pending: int = 0  # announcements of results still to come
    dead: int = 0
    claimed: int = 0
    reconnects: int = 0
    failures: int = 0  # store errors: the entries stayed pending
    reasons: list[str] = field(default_factory=list)


class ResultConsumer:
    def __init__(self, store: PatientStore, broker: str, stream: str = STREAM, group: str = GROUP,
                 consumer: str | None = None, claim_idle_ms: int = 30_000, batch: int = 100,
                 block_ms: int = 1000) -> None:
        self.redis_module = require_extra("redis", "gateway", "the results gateway")
        self.store, self.broker, self.stream, self.group = store, broker, stream, group
        self.dead_stream = f"{stream}:dead"
        self.consumer = consumer or f"{socket.gethostname()}-{time.time_ns()}"
        self.claim_idle_ms, self.batch, self.block_ms = claim_idle_ms, batch, block_ms
        self.stats = ConsumerStats()
        self._stopping = False
        self._client: Any = None

    # ------------------------------------------------------------------ connection
    def _connect(self) -> Any:
        client = self.redis_module.Redis.from_url(self.broker, decode_responses=True, socket_timeout=10,
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
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # the store failed: the entry stays unacknowledged and is reclaimed later
                log.error("could not store a result (%s); retrying in %.1f s", type(exc).__name__, backoff)
                self.stats.failures += 1
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        return self.stats

    def step(self) -> int:
        """Claim what dead consumers left, then read and handle one batch; returns entries handled."""
        client = self._client or self._connect()
        self._client = client
        claimed = client.xautoclaim(self.stream, self.group, self.consumer, self.claim_idle_ms, "0-0",
                                    count=self.batch)
        entries = list(claimed[1]) if claimed else []
        self.stats.claimed += len(entries)
        if not entries:
            read = client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=self.batch,
                                     block=self.block_ms)
            entries = [entry for _, stream_entries in read or [] for entry in stream_entries]
        for entry_id, fields in entries:
            if fields is None:  # claimed but deleted from the stream meanwhile
                client.xack(self.stream, self.group, entry_id)
                continue
            self.handle(client, entry_id, fields)
        return len(entries)

    def handle(self, client: Any, entry_id: str, fields: dict[str, str]) -> None:
        payload = fields.get("message", "")
        try:
            outcome = apply_message(self.store, parse_message(payload))
        except MessageError as exc:
            self._dead(client, entry_id, payload, str(exc))
            return
        self.stats.stored += outcome == "stored"
        self.stats.pending += outcome == "pending"
        client.xack(self.stream, self.group, entry_id)

    def _dead(self, client: Any, entry_id: str, payload: str, reason: str) -> None:
        """Dead-letter first, acknowledge second: a crash between them leaves the entry pending (it is dead-
        lettered again), never lost."""
        client.xadd(self.dead_stream, {"message": payload[:100_000], "reason": reason, "entry": entry_id})
        client.xack(self.stream, self.group, entry_id)
        self.stats.dead += 1
        self.stats.reasons.append(reason)
        log.warning("entry %s dead-lettered: %s", entry_id, reason)  # the reason, never the payload (PHI)
