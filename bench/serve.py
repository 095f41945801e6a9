"""`ebmrag serve` under load: concurrent clients asking about the demo patients (offline brief, demo KB).

Run: python bench/serve.py --clients 50 --seconds 60 --out docs/benchmarks.md

A real server (uvicorn on 127.0.0.1, SQLite store in a temporary directory) holds the bundled demo
records under one tenant; each client (its own clinician key) loops `POST /v1/patients/{pid}/ask` for a
random demo patient and question. Reported: requests, errors (any status but 200), requests/s, latency
p50/p95/p99, and the process's resident memory before and after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import httpx
import uvicorn

from ebmrag.config import Settings
from ebmrag.demo import demo_query, demo_record_paths
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from report import emit, machine  # bench/ is on sys.path when a script here runs


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process and all its descendants (the workers of `serve --workers`)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        children = " ".join(p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/children")).split()
    except OSError:
        return 0.0
    own = next((int(line.split()[1]) / 1024 for line in lines if line.startswith("VmRSS:")), 0.0)
    return own + sum(rss_mb(child) for child in children)


def start_workers(data: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    """`ebmrag serve --workers N` as its own process."""
    port = 20000 + os.getpid() % 10000
    process = subprocess.Popen([sys.executable, "-m", "ebmrag.cli", "serve", "--data-dir", data, "--port", str(port),
                                "--workers", str(workers)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("ebmrag serve --workers did not start")


def start(app: object) -> tuple[uvicorn.Server, str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))  # type: ignore[arg-type]
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def client_loop(url: str, key: str, patients: list[tuple[str, str]], until: float, seed: int,
                latencies: list[float], errors: list[int]) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        while time.monotonic() < until:
            pid, question = rng.choice(patients)
            started = time.perf_counter()
            status = http.post(f"/v1/patients/{pid}/ask", json={"question": question}).status_code
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=0, help="0: one in-process server; N: `ebmrag serve "
                                                                 "--workers N` as its own process")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        store = SQLiteStore(Path(data) / "store.sqlite")
        key = create_key(store, "bench", "service")[0]
        client_keys = [create_key(store, "bench", "clinician")[0] for _ in range(args.clients)]  # a key each: the
        # per-key rate limit is not what is measured
        settings = Settings()
        workers = None
        if args.workers:
            workers, url = start_workers(data, args.workers)
        else:
            server, url = start(create_app(store, settings))
        patients = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
            for n, path in enumerate(demo_record_paths()):
                pid = f"demo{n}"
                assert http.put(f"/v1/patients/{pid}", content=path.read_bytes(),
                                headers={"Content-Type": "application/json"}).status_code == 200
                patients.append((pid, demo_query(path)))
                for _ in range(max(1, args.workers) * 2):  # warm every worker's engine
                    http.post(f"/v1/patients/{pid}/ask", json={"question": demo_query(path)})
        measured = workers.pid if workers else "self"
        before = rss_mb(measured)
        latencies: list[float] = []
        errors: list[int] = []
        until = time.monotonic() + args.seconds
        threads = [threading.Thread(target=client_loop, args=(url, client_keys[i], patients, until, i, latencies,
                                                              errors)) for i in range(args.clients)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        after = rss_mb(measured)
        if workers:
            workers.terminate()
            workers.wait(timeout=30)
        else:
            server.should_exit = True
    cuts = statistics.quantiles(latencies, n=100)
    lines = [f"## `ebmrag serve` under load, {date.today().isoformat()}", "",
             f"{machine()}. Command: "
             f"`python bench/serve.py --clients {args.clients} --seconds {args.seconds:g}"
             f"{f' --workers {args.workers}' if args.workers else ''} --out docs/benchmarks.md`.",
             "", f"{args.clients} clients, {args.seconds:g} s of `POST /v1/patients/{{pid}}/ask` (offline brief, demo "
             f"knowledge base, {len(patients)} demo patients, SQLite store; "
             f"{f'{args.workers} worker processes' if args.workers else 'one in-process server'}).", "",
             "| requests | errors | requests/s | p50 ms | p95 ms | p99 ms | RSS before / after MB |",
             "|---|---|---|---|---|---|---|",
             f"| {len(latencies)} | {len(errors)} | {len(latencies) / elapsed:.1f} | {cuts[49] * 1000:.0f} | "
             f"{cuts[94] * 1000:.0f} | {cuts[98] * 1000:.0f} | {before:.0f} / {after:.0f} |"]
    if errors:
        lines.append(f"\nError statuses: {json.dumps(sorted(set(errors)))}")
    emit(args.out, f"serve-load{'-workers' if args.workers else ''}", lines)


if __name__ == "__main__":
    main()
