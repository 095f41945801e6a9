"""Audit rows written while one client hammers `ebmrag serve` with bad keys (issue 43: every 429 used to write one).

Run: python bench/audit_flood.py [--seconds 5] [--clients 4]

A real server (uvicorn, the options `ebmrag serve` uses, SQLite in a temporary folder) and `--clients` threads
sending requests with a bad key from 127.0.0.1 for `--seconds`; then one request with a valid key from the same
address, the server stopped (its bursts of 429s summarised), and the audit counted and verified.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import uvicorn

from ebmrag.config import Settings
from ebmrag.serve.app import create_app
from ebmrag.serve.clients import SERVER_OPTIONS
from ebmrag.store import audit
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore


def hammer(url: str, seconds: float, statuses: Counter[int], lock: threading.Lock) -> None:
    ends = time.monotonic() + seconds
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer ebm_000000000000_" + "x" * 43}) as http:
        while time.monotonic() < ends:
            status = http.get("/v1/patients/p1/fragments").status_code
            with lock:
                statuses[status] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    store = SQLiteStore(Path(tempfile.mkdtemp()) / "store.sqlite")
    key = create_key(store, "t", "service")[0]
    server = uvicorn.Server(uvicorn.Config(create_app(store, Settings()), host="127.0.0.1", port=0,
                                           log_level="warning", **SERVER_OPTIONS))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    workers = [threading.Thread(target=hammer, args=(url, args.seconds, statuses, lock)) for _ in range(args.clients)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    valid = httpx.put(f"{url}/v1/patients/p1", headers={"Authorization": f"Bearer {key}"},
                      json={"patient_id": "p1", "fragments": [{"id": "f1", "text": "Sodium 140 mmol/L."}]})
    server.should_exit = True
    thread.join()
    rows = [str(r[5]) for r in store.audit_rows()]
    print(f"{sum(statuses.values())} requests in {args.seconds:g} s from {args.clients} clients: "
          f"{dict(sorted(statuses.items()))}; a valid key from the same address: {valid.status_code}")
    print(f"audit rows: {len(rows)} ({sum(r.startswith('refused 401') for r in rows)} refused 401, "
          f"{sum(r.startswith('refused 429') for r in rows)} refused 429); intact: {audit.verify(store).intact}")
    for row in rows:
        if " more from " in row:
            print("  " + row)


if __name__ == "__main__":
    main()
