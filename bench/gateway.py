"""The results gateway under load: messages/s into the store, and publish-to-queryable lag.

Run: python bench/gateway.py --seconds 60 --out docs/benchmarks.md

Against the machine's Redis (127.0.0.1:6379) and a SQLite store in a temporary directory, with 1 and 2
consumers (threads of one process, each its own consumer in the group):
- throughput: `--backlog` messages published up front, then consumed; messages/s from first to last store;
- lag: a publisher (its own process) offers `--load` times that rate for `--seconds`; lag is from XADD to
  the committed upsert (the moment a question would see the result), p50 and p95.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import redis

from ebmrag.gateway.consumer import ResultConsumer
from ebmrag.gateway.publish import publish
from ebmrag.records.fragment import PatientRecord
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from ebmrag.store.results import ResultMessage
from report import emit, machine  # bench/ is on sys.path when a script here runs

BROKER = "redis://127.0.0.1:6379/0"


class TimedStore(SQLiteStore):
    """Records when each fragment became queryable (its upsert committed)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.stored_at: dict[str, float] = {}

    def upsert_fragments(self, tenant: str, patient: str, record: PatientRecord) -> tuple[int, int]:
        counts = super().upsert_fragments(tenant, patient, record)
        moment = time.monotonic()
        for fragment in record.fragments:
            self.stored_at[fragment.id] = moment
        return counts


def message(n: int, run: str) -> ResultMessage:
    return ResultMessage(tenant="bench", patient_id=f"p{n % 50}", result_id=f"{run}-{n}", kind="lab",
                         producer="bench", produced_at=datetime.now(UTC), text=f"Creatinine 1.{n % 9} mg/dL.")


def consume(store: TimedStore, stream: str, consumers: int, until: Any) -> list[threading.Thread]:
    threads = []
    for i in range(consumers):
        worker = ResultConsumer(store, BROKER, stream, consumer=f"c{i}", block_ms=50)
        thread = threading.Thread(target=worker.run, kwargs={"until": until, "handle_signals": False}, daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def throughput(consumers: int, backlog: int) -> float:
    with tempfile.TemporaryDirectory() as data:
        store, stream, run = TimedStore(Path(data) / "s.sqlite"), f"bench:{uuid.uuid4().hex[:8]}", "t"
        create_key(store, "bench", "service")
        for start in range(0, backlog, 1000):
            publish(BROKER, [message(n, run) for n in range(start, min(start + 1000, backlog))], stream)
        started = time.monotonic()
        threads = consume(store, stream, consumers, lambda: len(store.stored_at) >= backlog)
        for thread in threads:
            thread.join()
        redis.Redis.from_url(BROKER).delete(stream, f"{stream}:dead")
        return backlog / (max(store.stored_at.values()) - started)


def offer(stream: str, run: str, rate: float, seconds: float, results: Any) -> None:
    """Publish at `rate` messages/s for `seconds`; report each message's send time (CLOCK_MONOTONIC is
    shared by the processes of one machine)."""
    client = redis.Redis.from_url(BROKER)
    sent: dict[str, float] = {}
    started, n = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        item = message(n, run)
        client.xadd(stream, {"message": item.model_dump_json()})
        sent[item.fragment_id] = time.monotonic()
        n += 1
        time.sleep(max(0.0, started + n / rate - time.monotonic()))
    results.put(sent)


def lag(consumers: int, rate: float, seconds: float) -> tuple[int, float, float]:
    with tempfile.TemporaryDirectory() as data:
        store, stream, run = TimedStore(Path(data) / "s.sqlite"), f"bench:{uuid.uuid4().hex[:8]}", "l"
        create_key(store, "bench", "service")
        done = threading.Event()
        threads = consume(store, stream, consumers, done.is_set)
        results: multiprocessing.Queue[dict[str, float]] = multiprocessing.Queue()
        publisher = multiprocessing.Process(target=offer, args=(stream, run, rate, seconds, results))
        publisher.start()  # its own process, so it does not take the consumers' interpreter lock
        sent = results.get()
        publisher.join()
        n = len(sent)
        deadline = time.monotonic() + 30
        while len(store.stored_at) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        for thread in threads:
            thread.join()
        redis.Redis.from_url(BROKER).delete(stream, f"{stream}:dead")
        lags = [(store.stored_at[k] - t) * 1000 for k, t in sent.items() if k in store.stored_at]
        cuts = statistics.quantiles(lags, n=100)
        return n, cuts[49], cuts[94]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--load", type=float, default=0.5, help="offered rate as a share of the throughput")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for consumers in (1, 2):
        rate = throughput(consumers, args.backlog)
        offered = rate * args.load
        sent, p50, p95 = lag(consumers, offered, args.seconds)
        rows.append(f"| {consumers} | {rate:.0f} | {offered:.0f} | {sent:,} | {p50:.1f} | {p95:.1f} |")
        print(rows[-1], flush=True)
    lines = [f"## Results gateway (Redis Streams -> store), {date.today().isoformat()}", "",
             f"{machine()}, Redis 7 on 127.0.0.1, "
             f"SQLite store. Command: `python bench/gateway.py --seconds {args.seconds:g} --out docs/benchmarks.md`.",
             "", "| consumers | messages/s (backlog of "
             f"{args.backlog:,}) | offered rate for the lag run, msg/s | messages in {args.seconds:g} s "
             "| lag p50 ms | lag p95 ms |", "|---|---|---|---|---|---|", *rows]
    emit(args.out, "gateway", lines)


if __name__ == "__main__":
    main()
