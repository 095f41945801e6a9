"""`ebmrag serve` under load, this tree beside earlier commits in one run (issue 33: every core serving).

Run: python bench/serve.py --clients 50 --seconds 60 --baseline 0691bb5 --baseline HEAD --workers 1,2 \
         --out docs/benchmarks.md

Each variant is a real `ebmrag serve` process on 127.0.0.1 with a SQLite store in a fresh directory: this
working tree (with `--workers` 1, 2, ...), and each `--baseline` commit checked out into a temporary git worktree
and run from its own source with the same virtual environment (PYTHONPATH puts that source first). The keys are
made by the variant's own `ebmrag keys create`. The bundled demo records are stored under one tenant; each client
(its own clinician key, so the per-key rate limit is not what is measured) loops `POST /v1/patients/{pid}/ask`
for a random demo patient and its question, from threads of this process. Variants run one after another on the
same machine; the ratio to the first variant is the comparison. Reported: requests, errors (any status but 200),
requests/s, latency p50/p95/p99, and the server's memory after the run: resident (RSS) and proportional (PSS,
which counts pages shared between worker processes once), summed over its processes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import IO

import httpx

from ebmrag.demo import demo_query, demo_record_paths
from report import emit, machine  # bench/ is on sys.path when a script here runs

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Variant:
    label: str
    source: Path  # the `src` folder the server imports ebmrag from
    workers: int


@dataclass(frozen=True)
class Outcome:
    variant: Variant
    latencies: list[float]
    errors: list[int]
    seconds: float
    rss_mb: float
    pss_mb: float


def memory_mb(pid: int) -> tuple[float, float]:
    """RSS and PSS of a process and all its descendants (the workers of `serve --workers`)."""
    rss = pss = 0.0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
        children = " ".join(p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/children")).split()
    except OSError:
        return 0.0, 0.0
    for child in children:
        child_rss, child_pss = memory_mb(int(child))
        rss, pss = rss + child_rss, pss + child_pss
    return rss, pss


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


Sink = int | IO[bytes]


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path  # the server's stderr


def ebmrag(variant: Variant, args: list[str], out: Sink = subprocess.DEVNULL,
           err: Sink = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """`python -m ebmrag.cli ARGS` importing the variant's source."""
    env = {**os.environ, "PYTHONPATH": str(variant.source)}
    return subprocess.Popen([sys.executable, "-m", "ebmrag.cli", *args], env=env, stdout=out, stderr=err)


def make_key(variant: Variant, data: Path, role: str, tenant: str = "bench") -> str:
    """A key made by the variant's own `ebmrag keys create`."""
    made = ebmrag(variant, ["keys", "create", "--data-dir", str(data), "--tenant", tenant, "--role", role],
                  subprocess.PIPE, subprocess.PIPE)
    out, err = made.communicate(timeout=120)
    if made.returncode:
        raise SystemExit(f"{variant.label}: keys create --tenant {tenant} --role {role} failed: "
                         f"{err.decode(errors='replace')}")
    return out.decode().strip().splitlines()[-1]


def start(variant: Variant, data: Path, config: Path | None = None) -> Server:
    """`ebmrag serve` on a free port (with `--config`), its stderr in `data`/serve.log; waits for /healthz."""
    port, log = free_port(), data / "serve.log"
    args = ["serve", "--data-dir", str(data), "--port", str(port), "--workers", str(variant.workers)]
    with log.open("wb") as sink:
        process = ebmrag(variant, args + (["--config", str(config)] if config else []), err=sink)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if process.poll() is not None:
            break
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Server(process, url, log)
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"{variant.label}: ebmrag serve did not start:\n{log.read_text(errors='replace')[-2000:]}")


def run_all(threads: list[threading.Thread]) -> float:
    """Start every thread, wait for all of them; the seconds they ran together."""
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()


def client_loop(url: str, key: str, patients: list[tuple[str, str]], until: float, seed: int,
                latencies: list[float], errors: list[int]) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        while time.monotonic() < until:
            pid, question = rng.choice(patients)
            started = time.perf_counter()
            try:
                status = http.post(f"/v1/patients/{pid}/ask", json={"question": question}).status_code
            except httpx.HTTPError:
                status = 0
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(status)


def measure(variant: Variant, clients: int, seconds: float) -> Outcome:
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        service_key = make_key(variant, data, "service")
        client_keys = [make_key(variant, data, "clinician") for _ in range(clients)]
        server = start(variant, data)
        url = server.url
        try:
            patients = []
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {service_key}"}, timeout=600) as http:
                for n, path in enumerate(demo_record_paths()):
                    pid = f"demo{n}"
                    stored = http.put(f"/v1/patients/{pid}", content=path.read_bytes(),
                                      headers={"Content-Type": "application/json"})
                    if stored.status_code != 200:
                        raise SystemExit(f"{variant.label}: storing {path.name} gave {stored.status_code}")
                    patients.append((pid, demo_query(path)))
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {client_keys[0]}"}, timeout=600) as http:
                for pid, question in patients * (variant.workers * 4):  # every worker's engine loaded and warm
                    http.post(f"/v1/patients/{pid}/ask", json={"question": question})
            latencies: list[float] = []
            errors: list[int] = []
            until = time.monotonic() + seconds
            threads = [threading.Thread(target=client_loop, args=(url, client_keys[i], patients, until, i,
                                                                  latencies, errors)) for i in range(clients)]
            elapsed = run_all(threads)
            rss, pss = memory_mb(server.process.pid)
        finally:
            stop(server)
    return Outcome(variant, latencies, errors, elapsed, rss, pss)


def worktree(rev: str, parent: Path) -> Path:
    """`rev` checked out (detached) under `parent`; the caller removes it."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    path = parent / commit
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), commit], check=True)
    return path


def table(outcomes: list[Outcome]) -> list[str]:
    first = len(outcomes[0].latencies) / outcomes[0].seconds
    rows = ["| variant | requests | errors | requests/s | × first | p50 ms | p95 ms | p99 ms | RSS / PSS MB after |",
            "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        cuts = statistics.quantiles(o.latencies, n=100)
        rate = len(o.latencies) / o.seconds
        rows.append(f"| {o.variant.label} | {len(o.latencies)} | {len(o.errors)} | {rate:.1f} | {rate / first:.2f} | "
                    f"{cuts[49] * 1000:.0f} | {cuts[94] * 1000:.0f} | {cuts[98] * 1000:.0f} | "
                    f"{o.rss_mb:.0f} / {o.pss_mb:.0f} |")
        if o.errors:
            rows.append(f"|  | error statuses: {json.dumps(sorted(set(o.errors)))} |||||||")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--baseline", action="append", default=[], help="a commit to run first (repeatable)")
    parser.add_argument("--workers", default="1", help="worker processes of this tree, comma-separated: 1,2")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as trees:
        variants = []
        for rev in args.baseline:
            tree = worktree(rev, Path(trees))
            variants.append(Variant(f"`{tree.name}` (baseline)", tree / "src", 1))
        variants += [Variant(f"this tree, {n} worker{'s' if n > 1 else ''}", REPO / "src", n)
                     for n in map(int, args.workers.split(","))]
        outcomes = []
        for variant in variants:
            print(f"measuring {variant.label} ...", file=sys.stderr)
            outcomes.append(measure(variant, args.clients, args.seconds))
    subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)  # the checkouts are gone now
    command = (f"python bench/serve.py --clients {args.clients} --seconds {args.seconds:g}"
               + "".join(f" --baseline {rev}" for rev in args.baseline) + f" --workers {args.workers}"
               + " --out docs/benchmarks.md")
    lines = [f"## `ebmrag serve` under load, {date.today().isoformat()}", "",
             f"{machine()}. Command: `{command}`.", "",
             f"{args.clients} client threads in the benchmark's process, {args.seconds:g} s of "
             f"`POST /v1/patients/{{pid}}/ask` per variant (offline brief, demo knowledge base, "
             f"{len(demo_record_paths())} demo patients, one tenant, SQLite store; the server in its own process), "
             "variants one after another in one run.", "", *table(outcomes)]
    emit(args.out, "serve-load", lines)


if __name__ == "__main__":
    main()
