"""`ebmrag serve` on large stored charts (issue 33): asks on a stored chart by its size, and one tenant's small
request while another tenant asks about its largest chart.

Run: python bench/serve_chart.py --sizes 100,1000,10000,50000 --asks 7 --seconds 30 --out docs/benchmarks.md

One real `ebmrag serve` process (this tree, one worker, SQLite store in a temporary directory, keys made by
`ebmrag keys create`) with a config file: [serve] max_chart_fragments raised to the largest size (the default
refuses a chart over 10,000 fragments with 422), request_seconds 600 and max_body_mb 64, so a large chart is
measured instead of refused, and [models] cache_dir in the temporary directory, so every chart is prepared from
cold (the shared cache would hold an earlier run's vectors of the same texts). The charts are synthetic
(bench/large_record.py: varied note sentences with numbers), sent as ebmrag JSON.

1. Growth, for each `--sizes` size in turn: tenant A stores a chart of that many fragments (`PUT
   /v1/patients/{pid}`); the server prepares it in the background (serve/prepare.py) and the benchmark polls
   `GET /v1/patients/{pid}/fragments` until `prepared_fragments` counts every fragment and the background lane
   of /metrics is idle: the preparation time (from the PUT's answer). Then `--asks` asks cycling over a few
   clinical questions (`POST /v1/patients/{pid}/ask`): the first one and p50/max of all, and the server's memory
   (RSS, summed over its processes) after them. Goal: p50 <= 1.5 s on the 10,000-fragment chart.
2. Two tenants: tenant B stores a small chart and asks about it, one request at a time and at most
   `B_RATE` a second (the per-key rate limit is not what is measured), for `--seconds`, first with tenant A
   idle, then while `A_CLIENTS` client threads of tenant A keep asking about its 10,000-fragment chart (the
   largest size <= 10,000 measured). B's p50/p95/max, and their ratio busy / idle. Goal: B's p95 <= 200 ms
   with A busy.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import httpx

import serve  # bench/ is on sys.path when a script here runs
from ebmrag.config import ServeSettings
from ebmrag.models.embeddings import default_cache_dir
from large_record import record
from report import emit, machine

DEFAULT_LIMIT = ServeSettings().max_chart_fragments
GOAL_SIZE = 10_000
QUESTIONS = ("Which antibiotic is safe given his allergy and kidney function?",
             "What is the latest potassium and is it rising?", "Has the lung nodule on CT grown?",
             "What grade was the breast biopsy?", "Is his blood pressure controlled?")
SMALL_FRAGMENTS = 6
A_CLIENTS = 2
B_RATE = 10.0  # tenant B's requests per second at most (the limiter allows 20 per key)


@dataclass
class Asks:
    latencies: list[float] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Growth:
    size: int
    put_seconds: float
    prepare_seconds: float
    prepared: int
    asks: Asks
    rss_mb: float


# --- the server and its keys ------------------------------------------------------------------------------------

def write_config(folder: Path, sizes: list[int], serve_settings: dict[str, float] | None = None) -> tuple[Path, str]:
    """The config file the server runs with, and its [serve] table in one line (for the report). The caches are
    the run's own (a chart prepared by an earlier run would be found prepared); the built ONNX graph is copied
    over if there is one."""
    cache = folder / "cache"
    built = default_cache_dir() / "onnx"
    if built.is_dir():
        shutil.copytree(built, cache / "onnx")
    limits = {"max_chart_fragments": max(DEFAULT_LIMIT, *sizes), "request_seconds": 600, "max_body_mb": 64,
              **(serve_settings or {})}
    lines = [f"{name} = {value}" for name, value in limits.items()]
    path = folder / "serve.toml"
    path.write_text("\n".join(["[serve]", *lines, "", "[models]", f"cache_dir = {json.dumps(str(cache))}", ""]),
                    encoding="utf-8")
    return path, "`[serve] " + ", ".join(lines) + "`"



def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=900)


# --- charts -----------------------------------------------------------------------------------------------------

def chart_body(pid: str, size: int, seed: int = 3) -> bytes:
    """bench/large_record.py's synthetic record of `size` fragments as ebmrag JSON for patient `pid`."""
    fragments = [{"id": f.id, "text": f.text, "section": f.section,
                  "timestamp": f.timestamp.isoformat() if f.timestamp else None} for f in record(size, seed).fragments]
    return json.dumps({"patient_id": pid, "fragments": fragments}).encode()


def put_chart(http: httpx.Client, pid: str, body: bytes) -> float:
    started = time.perf_counter()
    stored = http.put(f"/v1/patients/{pid}", content=body, headers={"Content-Type": "application/json"})
    if stored.status_code != 200:
        raise SystemExit(f"PUT {pid}: {stored.status_code} {stored.text[:500]}")
    return time.perf_counter() - started


def background_running(http: httpx.Client) -> int:
    """The server's background engine work now (the preparation's jobs), from /metrics."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('ebmrag_engine_work{state="background_running"}'):
            return int(float(line.split()[-1]))
    return 0


def wait_prepared(http: httpx.Client, pid: str, size: int, since: float, stall: float = 300.0) -> tuple[int, float]:
    """Poll until every fragment is prepared and the background lane is idle at two polls in a row (the chart's
    gate sentences come after its fragments), or nothing changed for `stall` seconds. Returns the fragments
    prepared and the seconds from `since` (time.perf_counter) to the first of those two polls (to the last change
    when stalled). Each poll tiers the whole chart, so polls are spaced by twice their own duration (>= 1 s)."""
    prepared, changed, done = -1, time.perf_counter(), 0.0
    while time.perf_counter() - changed < stall:
        started = time.perf_counter()
        listed = http.get(f"/v1/patients/{pid}/fragments")
        if listed.status_code != 200:
            raise SystemExit(f"GET {pid}/fragments: {listed.status_code} {listed.text[:500]}")
        now = int(listed.json()["prepared_fragments"])
        if now != prepared:
            prepared, changed = now, started
        if prepared < size or background_running(http):
            done = 0.0
        elif done:
            return prepared, done - since
        else:
            done = started
        time.sleep(max(1.0, 2 * (time.perf_counter() - started)) if prepared < size else 0.5)
    print(f"{pid}: preparation stalled at {prepared}/{size} fragments", file=sys.stderr)
    return prepared, changed - since


# --- asking -----------------------------------------------------------------------------------------------------

def ask(http: httpx.Client, pid: str, question: str, into: Asks) -> None:
    started = time.perf_counter()
    try:
        status = http.post(f"/v1/patients/{pid}/ask", json={"question": question}).status_code
    except httpx.HTTPError:
        status = 0
    into.latencies.append(time.perf_counter() - started)
    if status != 200:
        into.errors.append(status)


def grow(server: serve.Server, service_key: str, clinician_key: str, size: int, count: int) -> Growth:
    """Store a chart of `size` fragments, wait for its preparation, ask `count` questions about it."""
    pid = f"chart{size}"
    with client(server.url, service_key) as http:
        put_seconds = put_chart(http, pid, chart_body(pid, size))
        prepared, prepare_seconds = wait_prepared(http, pid, size, time.perf_counter())
    print(f"  stored in {put_seconds:.1f} s, {prepared:,} fragments prepared in {prepare_seconds:.1f} s",
          file=sys.stderr)
    asks = Asks()
    with client(server.url, clinician_key) as http:
        for n in range(count):
            ask(http, pid, QUESTIONS[n % len(QUESTIONS)], asks)
    return Growth(size, put_seconds, prepare_seconds, prepared, asks, serve.memory_mb(server.process.pid)[0])


def busy_loop(url: str, key: str, pid: str, seed: int, stop_event: threading.Event, into: Asks) -> None:
    """Tenant A: ask about the big chart, one question after another, until told to stop."""
    with client(url, key) as http:
        n = seed
        while not stop_event.is_set():
            ask(http, pid, QUESTIONS[n % len(QUESTIONS)], into)
            n += 1


def small_loop(url: str, key: str, pid: str, seconds: float) -> Asks:
    """Tenant B: one small ask at a time, at most B_RATE a second, for `seconds`."""
    asks = Asks()
    until = time.monotonic() + seconds
    with client(url, key) as http:
        n = 0
        while time.monotonic() < until:
            started = time.monotonic()
            ask(http, "small", QUESTIONS[n % len(QUESTIONS)], asks)
            n += 1
            time.sleep(max(0.0, 1 / B_RATE - (time.monotonic() - started)))
    return asks


def contend(server: serve.Server, a_keys: list[str], big: str, b_key: str, seconds: float) -> tuple[Asks, Asks]:
    """B's small asks while A's clients ask about `big`; (B's asks, A's asks meanwhile)."""
    a_asks, stop_event = Asks(), threading.Event()
    threads = [threading.Thread(target=busy_loop, args=(server.url, key, big, i, stop_event, a_asks))
               for i, key in enumerate(a_keys)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # A's asks are running before B's first
    b_asks = small_loop(server.url, b_key, "small", seconds)
    stop_event.set()
    for thread in threads:
        thread.join()
    return b_asks, a_asks


# --- the report -------------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN without values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def errors(asks: Asks) -> str:
    return f"{len(asks.errors)} {json.dumps(sorted(set(asks.errors)))}" if asks.errors else "0"


def growth_table(rows: list[Growth]) -> list[str]:
    lines = ["| fragments | PUT s | preparation s | prepared | first ask s | ask p50 s | ask max s | asks | errors | "
             "RSS MB after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for g in rows:
        first = g.asks.latencies[0] if g.asks.latencies else math.nan
        lines.append(f"| {g.size:,} | {g.put_seconds:.1f} | {g.prepare_seconds:.1f} | {g.prepared:,} | {first:.2f} | "
                     f"{percentile(g.asks.latencies, 50):.2f} | {max(g.asks.latencies, default=math.nan):.2f} | "
                     f"{len(g.asks.latencies)} | {errors(g.asks)} | {g.rss_mb:.0f} |")
    return lines


def contention_table(idle: Asks, busy: Asks, a_asks: Asks) -> list[str]:
    def ms(asks: Asks, q: float) -> float:
        return percentile(asks.latencies, q) * 1000

    lines = ["| tenant B's small ask | requests | errors | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|---|"]
    for label, asks in (("tenant A idle", idle), ("tenant A asking", busy)):
        lines.append(f"| {label} | {len(asks.latencies)} | {errors(asks)} | {ms(asks, 50):.0f} | {ms(asks, 95):.0f} | "
                     f"{ms(asks, 100):.0f} |")
    lines.append(f"| ratio busy / idle | | | {ms(busy, 50) / ms(idle, 50):.2f} | {ms(busy, 95) / ms(idle, 95):.2f} | "
                 f"{ms(busy, 100) / ms(idle, 100):.2f} |")
    lines += ["", f"Tenant A meanwhile: {len(a_asks.latencies)} asks, errors {errors(a_asks)}, p50 "
                  f"{percentile(a_asks.latencies, 50):.2f} s, max {max(a_asks.latencies, default=math.nan):.2f} s."]
    return lines


def goals(rows: list[Growth], busy: Asks, big: int) -> list[str]:
    at_goal = [g for g in rows if g.size == GOAL_SIZE]
    lines = []
    if at_goal:
        p50 = percentile(at_goal[0].asks.latencies, 50)
        lines.append(f"- ask on a stored {GOAL_SIZE:,}-fragment chart, p50 {p50:.2f} s (goal <= 1.5 s): "
                     f"{'met' if p50 <= 1.5 else 'not met'}")
    p95 = percentile(busy.latencies, 95) * 1000
    lines.append(f"- a small request of one tenant during another tenant's asks on a {big:,}-fragment chart, p95 "
                 f"{p95:.0f} ms (goal <= 200 ms): {'met' if p95 <= 200 else 'not met'}")
    return lines


# --- the run ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Results:
    growth: list[Growth]
    big: int
    idle: Asks
    busy: Asks
    a_asks: Asks
    config: str


def run(sizes: list[int], count: int, seconds: float, serve_settings: dict[str, float]) -> Results:
    variant = serve.Variant("this tree", serve.REPO / "src", workers=1)
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        config, text = write_config(data, sizes, serve_settings)
        a_service, b_service = (serve.make_key(variant, data, "service", tenant) for tenant in ("a", "b"))
        a_keys = [serve.make_key(variant, data, "clinician", "a") for _ in range(A_CLIENTS + 1)]
        b_key = serve.make_key(variant, data, "clinician", "b")
        server = serve.start(variant, data, config)
        try:
            return measure(server, sizes, count, seconds, (a_service, a_keys, b_service, b_key), text)
        except BaseException:
            print(server.log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            serve.stop(server)


def measure(server: serve.Server, sizes: list[int], count: int, seconds: float,
            keys: tuple[str, list[str], str, str], config: str) -> Results:
    a_service, a_keys, b_service, b_key = keys
    with client(server.url, b_service) as http:  # B's small chart first: it also loads the models
        put_chart(http, "small", chart_body("small", SMALL_FRAGMENTS, seed=5))
        wait_prepared(http, "small", SMALL_FRAGMENTS, time.perf_counter())
    with client(server.url, b_key) as http:
        ask(http, "small", QUESTIONS[0], Asks())  # the engine built, its first question answered
    rows = []
    for size in sizes:
        print(f"chart of {size:,} fragments ...", file=sys.stderr)
        rows.append(grow(server, a_service, a_keys[0], size, count))
    big = max([s for s in sizes if s <= GOAL_SIZE] or [min(sizes)])
    print(f"tenant B alone, then beside tenant A's {big:,}-fragment asks ...", file=sys.stderr)
    idle = small_loop(server.url, b_key, "small", seconds)
    busy, a_asks = contend(server, a_keys[1:], f"chart{big}", b_key, seconds)
    return Results(rows, big, idle, busy, a_asks, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000,50000", help="chart sizes in fragments, comma-separated")
    parser.add_argument("--asks", type=int, default=7, help="asks per chart size")
    parser.add_argument("--seconds", type=float, default=30.0, help="tenant B's asks, idle and busy, each this long")
    parser.add_argument("--serve", action="append", default=[], metavar="NAME=N",
                        help="a numeric [serve] setting for the server (engine_slots=2, tenant_slots=1); repeatable")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        serve_settings = {name.strip(): float(value) if "." in value else int(value)
                          for name, value in (item.split("=", 1) for item in args.serve)}
    except ValueError:
        parser.error("--serve takes NAME=NUMBER")
    if args.asks < 1 or not sizes or min(sizes) < 1:
        parser.error("--asks and every size must be >= 1")
    r = run(sizes, args.asks, args.seconds, serve_settings)
    command = (f"python bench/serve_chart.py --sizes {args.sizes} --asks {args.asks} --seconds {args.seconds:g}"
               + "".join(f" --serve {item}" for item in args.serve) + (f" --out {args.out}" if args.out else ""))
    lines = [f"## `ebmrag serve` on large stored charts, {date.today().isoformat()}", "",
             f"{machine()}. Command: `{command}`.", "",
             f"One `ebmrag serve` (one worker, SQLite store, extractive answers and the demo knowledge base by "
             f"default, a fresh cache directory) with {r.config}; synthetic charts (bench/large_record.py) stored by "
             f"`PUT`, prepared in the background before they are asked about; {len(QUESTIONS)} questions in turn.",
             "", *goals(r.growth, r.busy, r.big), "", f"### Asks by chart size ({args.asks} per size)", "",
             *growth_table(r.growth), "",
             f"### Tenant B's small chart ({SMALL_FRAGMENTS} fragments) while tenant A asks about its "
             f"{r.big:,}-fragment chart", "",
             f"B: one ask at a time, at most {B_RATE:g}/s, {args.seconds:g} s with A idle, then {args.seconds:g} s "
             f"with {A_CLIENTS} client threads of A asking in a loop.", "",
             *contention_table(r.idle, r.busy, r.a_asks)]
    emit(args.out, "serve-chart", lines)


if __name__ == "__main__":
    main()
