"""Another tenant's small read while one tenant pulls charts from a slow EHR (issue 43): its p95 idle and during.

Run: python bench/ehr_fairness.py --pulls 48 --seconds 20 --out docs/benchmarks.md
     (add --baseline REV to measure a commit first, from a temporary git worktree, e.g. the one before issue 43)

A real `ebmrag serve` process (bench/serve.py starts it, its own `ebmrag keys create` makes the keys) on a SQLite
store, with one EHR connection for tenant `puller` to a FHIR server of this script's on 127.0.0.1 that drips:
its CapabilityStatement comes at once, every `Patient/$everything` answer one byte every `--drip-ms` milliseconds,
the status line and headers included, for as long as the client reads. Tenant `reader` stores a two-fragment chart
and reads it (`GET /v1/patients/{pid}/fragments`, one request after another) for `--seconds` while nothing else
runs (idle), then again while `--pulls` threads of tenant `puller` each pull a patient over and over (each pull ends
at [serve] request_seconds, `--request-seconds`; a refused one is retried after its Retry-After). Reported: the
reader's p50 / p95 in both phases, their ratio (goal: p95 under 2x idle), and the pulls' answers by status.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from report import emit, machine  # bench/ is on sys.path when a script here runs
from serve import REPO, Variant, make_key, start, stop, worktree

SMALL = {"patient_id": "small", "fragments": [
    {"id": "allergy", "text": "Anaphylaxis to penicillin in 2014.", "section": "Allergies",
     "timestamp": "2026-03-01T09:00:00Z"},
    {"id": "labs", "text": "Creatinine 2.8 mg/dL, up from 1.1 mg/dL.", "section": "Labs",
     "timestamp": "2026-03-14T08:00:00Z"}]}
CAPABILITY = (b'{"resourceType":"CapabilityStatement","rest":[{"resource":[{"type":"Patient",'
              b'"operation":[{"name":"everything"}]}]}]}')


class DrippingFhir:
    """A FHIR server whose $everything answers drip a byte at a time; `open` counts the answers being dripped."""

    def __init__(self, drip_seconds: float) -> None:
        self.open = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path.split("?")[0].endswith("/metadata"):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/fhir+json")
                    self.send_header("Content-Length", str(len(CAPABILITY)))
                    self.end_headers()
                    self.wfile.write(CAPABILITY)
                    return
                self.close_connection = True
                server.drip(self, drip_seconds)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}/fhir"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def drip(self, handler: BaseHTTPRequestHandler, seconds: float) -> None:
        answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/fhir+json\r\nContent-Length: 10000000\r\n\r\n"
                  + b'{"resourceType":"Bundle","type":"searchset","entry":[' + b" " * 10_000_000)
        with self._lock:
            self.open += 1
        try:
            for byte in answer:
                handler.wfile.write(bytes((byte,)))
                handler.wfile.flush()
                time.sleep(seconds)
        except OSError:  # the client hung up: what a stopped pull does
            pass
        finally:
            with self._lock:
                self.open -= 1

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def reads(url: str, key: str, seconds: float) -> tuple[list[float], Counter[int]]:
    """The reader's latencies (s) and statuses over `seconds` of one request after another."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.perf_counter()
            statuses[http.get("/v1/patients/small/fragments").status_code] += 1
            latencies.append(time.perf_counter() - started)
    return latencies, statuses


def pull_loop(url: str, key: str, patient: str, stop_at: threading.Event, statuses: Counter[int]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
        while not stop_at.is_set():
            try:
                answer = http.post(f"/v1/patients/{patient}/pull", json={"connection": "slow"})
            except httpx.HTTPError:
                statuses[0] += 1
                continue
            statuses[answer.status_code] += 1
            if answer.status_code in (429, 503):
                stop_at.wait(float(answer.headers.get("retry-after", "1")))


def measure(variant: Variant, fhir: DrippingFhir, pulls: int, seconds: float,
            request_seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        config = data / "ebmrag.toml"
        config.write_text(f'[serve]\nrequest_seconds = {request_seconds}\nrate_per_second = 1000\nrate_burst = 1000\n'
                          f'prepare_charts = false\n\n[ehr.connections.slow]\ntenant = "puller"\n'
                          f'fhir_base = "{fhir.base}"\nallow_http = true\n', encoding="utf-8")
        reader, puller = make_key(variant, data, "service", "reader"), make_key(variant, data, "service", "puller")
        server = start(variant, data, config)
        try:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {reader}"}, timeout=600) as http:
                if http.put("/v1/patients/small", json=SMALL).status_code != 200:
                    raise SystemExit(f"{variant.label}: storing the reader's chart failed")
                for _ in range(20):  # the engine built (the first read loads the tier rules and models)
                    http.get("/v1/patients/small/fragments")
            idle, idle_statuses = reads(server.url, reader, seconds)
            stop_at = threading.Event()
            pulled: Counter[int] = Counter()
            threads = [threading.Thread(target=pull_loop, args=(server.url, puller, f"p{n}", stop_at, pulled))
                       for n in range(pulls)]
            for thread in threads:
                thread.start()
            for _ in range(600):  # until the dripping answers have begun
                if fhir.open >= 1:
                    break
                time.sleep(0.05)
            time.sleep(1.0)
            loaded, loaded_statuses = reads(server.url, reader, seconds)
            dripping = fhir.open
            stop_at.set()
            for thread in threads:
                thread.join()
        finally:
            stop(server)
    return {"variant": variant.label, "idle": idle, "loaded": loaded, "pulls": pulled, "dripping": dripping,
            "reads": idle_statuses + loaded_statuses}


def p(latencies: list[float], q: int) -> float:
    return statistics.quantiles(latencies, n=100)[q - 1] * 1000


def table(outcomes: list[dict[str, Any]]) -> list[str]:
    rows = ["| variant | reads idle / during | p50 idle ms | p95 idle ms | p50 during ms | p95 during ms | "
            "p95 during / idle | reader statuses | pull answers | answers dripping at the end |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        ratio = p(o["loaded"], 95) / p(o["idle"], 95)
        rows.append(f"| {o['variant']} | {len(o['idle'])} / {len(o['loaded'])} | {p(o['idle'], 50):.1f} | "
                    f"{p(o['idle'], 95):.1f} | {p(o['loaded'], 50):.1f} | {p(o['loaded'], 95):.1f} | "
                    f"**{ratio:.2f}×** | {dict(sorted(o['reads'].items()))} | {dict(sorted(o['pulls'].items()))} | "
                    f"{o['dripping']} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pulls", type=int, default=48, help="threads of tenant puller pulling at once")
    parser.add_argument("--seconds", type=float, default=20.0, help="of reads per phase")
    parser.add_argument("--drip-ms", type=float, default=20.0, help="between two bytes of an $everything answer")
    parser.add_argument("--request-seconds", type=float, default=10.0, help="[serve] request_seconds")
    parser.add_argument("--baseline", action="append", default=[], help="a commit to measure first (repeatable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    fhir = DrippingFhir(args.drip_ms / 1000)
    outcomes = []
    try:
        with tempfile.TemporaryDirectory() as trees:
            variants = []
            for rev in args.baseline:
                tree = worktree(rev, Path(trees))
                variants.append(Variant(f"`{tree.name}` (baseline)", tree / "src", 1))
            variants.append(Variant("this tree", REPO / "src", 1))
            for variant in variants:
                print(f"measuring {variant.label} ...", file=sys.stderr)
                outcomes.append(measure(variant, fhir, args.pulls, args.seconds, args.request_seconds))
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)
    finally:
        fhir.close()
    command = (f"python bench/ehr_fairness.py --pulls {args.pulls} --seconds {args.seconds:g} --drip-ms "
               f"{args.drip_ms:g} --request-seconds {args.request_seconds:g}"
               + "".join(f" --baseline {rev}" for rev in args.baseline) + " --out docs/benchmarks.md")
    lines = [f"## Another tenant's small read during slow EHR pulls, {date.today().isoformat()}", "",
             f"{machine()}. Command: `{command}` (`make bench-ehr-fairness` measures this tree alone).", "",
             f"One `ebmrag serve` process (one worker, SQLite). Tenant `reader` reads its two-fragment chart "
             f"(`GET /v1/patients/{{pid}}/fragments`, one request after another) for {args.seconds:g} s idle, then "
             f"for {args.seconds:g} s while {args.pulls} threads of tenant `puller` pull from an EHR that drips "
             f"every `$everything` answer a byte per {args.drip_ms:g} ms (each pull stopped at [serve] "
             f"request_seconds = {args.request_seconds:g}, 504; the lane's refusals, 429, retried after their "
             "Retry-After). Goal: p95 during under 2x idle.", "", *table(outcomes)]
    emit(args.out, "ehr-fairness", lines)


if __name__ == "__main__":
    main()
