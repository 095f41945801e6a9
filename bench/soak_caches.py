"""The shared caches under a soak: asks on stored charts and erasures of patients at once, in the worker processes
of one `ebmrag serve --workers 2`, which share one data directory and one cache directory (issue 43).

Run: python bench/soak_caches.py --seconds 60 --out docs/benchmarks.md

A real server on 127.0.0.1 with a SQLite store in a fresh data directory and `[models] cache_dir` in a fresh cache
directory (so the embedding model's graph, the demo knowledge base and every cache start cold and are written by both
workers at once). Six patients are stored (the bundled demo records, twice each), each with a note that names it and
its round. Client threads ask about all six with their own clinician keys; one eraser erases the three "churned"
patients in turn (`DELETE /v1/patients/{pid}`) and stores each again with a note of a new round, so erasures, the
preparation of the charts stored again and asks overlap throughout.

An error is: an answer other than 200 (an ask on a churned patient may be 404: it was being erased), a failed
connection, a traceback, an ERROR line or a cache moved aside in the server's log, an SQLite file in the data or
cache directory that fails `PRAGMA quick_check` after the run, or a file that still holds a note's text after every
patient has been erased at the end. It exits 1 on any error.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from ebmrag.demo import demo_query, demo_record_paths
from report import emit, machine  # bench/ is on sys.path when a script here runs
from serve import REPO, Server, Variant, make_key, run_all, start, stop

NOTE = "Soak note"  # every note starts so: what the final scan looks for
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class Patient:
    pid: str
    record: dict[str, Any]
    question: str
    churned: bool  # erased and stored again during the run


@dataclass
class Tally:
    """Counts shared by the client threads (under `lock`)."""

    asks: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    erasures: int = 0
    stores: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)


def patients() -> list[Patient]:
    found = []
    for copy in range(2):
        for n, path in enumerate(demo_record_paths()):
            found.append(Patient(f"soak{copy}{n}", json.loads(path.read_text(encoding="utf-8")), demo_query(path),
                                 churned=copy == 1))
    return found


def with_note(patient: Patient, round_: int) -> dict[str, Any]:
    """The record with a note naming the patient and the round: text that must be gone after its erasure."""
    note = {"id": "soak-note", "section": "Progress note", "timestamp": "2026-03-15T09:00:00",
            "text": f"{NOTE} {patient.pid} round {round_}: tolerating oral intake, mild nausea after meals."}
    return {**patient.record, "patient_id": patient.pid, "fragments": [*patient.record["fragments"], note]}


def store(http: httpx.Client, patient: Patient, round_: int, tally: Tally) -> None:
    try:
        status = http.put(f"/v1/patients/{patient.pid}", json=with_note(patient, round_)).status_code
    except httpx.HTTPError as exc:
        status, detail = 0, type(exc).__name__
    else:
        detail = str(status)
    if status != 200:
        tally.error(f"store {patient.pid}: {detail}")
    with tally.lock:
        tally.stores += 1


def erase(http: httpx.Client, patient: Patient, tally: Tally) -> None:
    try:
        answer = http.delete(f"/v1/patients/{patient.pid}")
    except httpx.HTTPError as exc:
        tally.error(f"erase {patient.pid}: {type(exc).__name__}")
        return
    if answer.status_code != 200:
        tally.error(f"erase {patient.pid}: {answer.status_code} {answer.text[:200]}")
    with tally.lock:
        tally.erasures += 1


def asker(url: str, key: str, cohort: list[Patient], until: float, seed: int, tally: Tally) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        while time.monotonic() < until:
            patient = rng.choice(cohort)
            started = time.perf_counter()
            try:
                answer = http.post(f"/v1/patients/{patient.pid}/ask", json={"question": patient.question})
                status, detail = answer.status_code, answer.text[:200]
            except httpx.HTTPError as exc:
                status, detail = 0, type(exc).__name__
            with tally.lock:
                tally.asks[status] += 1
                tally.latencies.append(time.perf_counter() - started)
            if status != 200 and not (status == 404 and patient.churned):
                tally.error(f"ask {patient.pid}: {status} {detail}")


def eraser(url: str, key: str, cohort: list[Patient], until: float, tally: Tally) -> None:
    churned = [p for p in cohort if p.churned]
    round_ = 1
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        while time.monotonic() < until:
            for patient in churned:
                erase(http, patient, tally)
                store(http, patient, round_, tally)
            round_ += 1


def sqlite_files(*folders: Path) -> list[Path]:
    """Every SQLite database under the folders, found by its header (not its name: knowledge-base files too)."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as handle:
                    if handle.read(16) == SQLITE_MAGIC:
                        found.append(path)
    return found


def quick_check(path: Path) -> str:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok" if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:3])


def holding_notes(*folders: Path) -> list[str]:
    return [str(p) for folder in folders for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "serve.log" and NOTE.encode() in p.read_bytes()]


def log_errors(log: Path) -> list[str]:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line or " ERROR " in line or line.startswith("ERROR")
            or "moved aside" in line or "could not be moved aside" in line]


@dataclass(frozen=True)
class Soak:
    tally: Tally
    seconds: float
    checked: dict[str, str]  # SQLite file (relative) -> quick_check
    left: list[str]  # files holding a note after the final erasure
    log: list[str]  # error lines of the server's log


def soak(seconds: float, clients: int, workers: int) -> Soak:
    with tempfile.TemporaryDirectory(prefix="ebmrag-soak-") as folder:
        data, caches = Path(folder) / "data", Path(folder) / "cache"
        data.mkdir()
        config = Path(folder) / "soak.toml"
        config.write_text(f'[models]\ncache_dir = "{caches}"\n', encoding="utf-8")
        variant = Variant("this tree", REPO / "src", workers)
        service, admin = make_key(variant, data, "service"), make_key(variant, data, "admin")
        readers = [make_key(variant, data, "clinician") for _ in range(clients)]
        cohort, tally = patients(), Tally()
        server: Server = start(variant, data, config)
        try:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {service}"},
                              timeout=600) as http:
                for patient in cohort:
                    store(http, patient, 0, tally)
            until = time.monotonic() + seconds
            threads = [threading.Thread(target=asker, args=(server.url, readers[i], cohort, until, i, tally))
                       for i in range(clients)]
            threads.append(threading.Thread(target=eraser, args=(server.url, admin, cohort, until, tally)))
            elapsed = run_all(threads)
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"}, timeout=600) as http:
                for patient in cohort:  # the end: every patient erased, nothing of them may stay in any file
                    erase(http, patient, tally)
        finally:
            stop(server)
        checked = {str(p.relative_to(folder)): quick_check(p) for p in sqlite_files(data, caches)}
        return Soak(tally, elapsed, checked, holding_notes(data, caches), log_errors(server.log))


def errors_of(result: Soak) -> list[str]:
    return (result.tally.errors + [f"quick_check {name}: {verdict}" for name, verdict in result.checked.items()
                                   if verdict != "ok"]
            + [f"a note left in {path}" for path in result.left] + [f"server log: {line}" for line in result.log])


def report(result: Soak, args: argparse.Namespace) -> list[str]:
    t = result.tally
    asks = sum(t.asks.values())
    cuts = statistics.quantiles(t.latencies, n=100) if len(t.latencies) > 1 else [0.0] * 99
    errors = errors_of(result)
    command = (f"python bench/soak_caches.py --seconds {args.seconds:g} --clients {args.clients} "
               f"--workers {args.workers}")
    lines = [f"## Shared caches under asks and erasures at once, {date.today().isoformat()}", "",
             f"{machine()}. Command: `{command}` (`make bench-soak`).", "",
             f"One `ebmrag serve --workers {args.workers}` (SQLite store, fresh data and cache directories), "
             f"{args.clients} clients asking about 6 stored charts, one eraser erasing 3 of them in turn and storing "
             f"each again, for {result.seconds:.0f} s; then every patient erased, the server stopped, `PRAGMA "
             "quick_check` run on every SQLite file of both directories, and every file searched for the notes' "
             "text.", "",
             "| asks | answers | p50 / p95 ms | erasures (the final 6 included) | stores (the first 6 included) | "
             "SQLite files: quick_check ok | files holding an erased note | errors |",
             "|---|---|---|---|---|---|---|---|",
             f"| {asks} | {json.dumps(dict(sorted(t.asks.items())))} | {cuts[49] * 1000:.0f} / {cuts[94] * 1000:.0f} "
             f"| {t.erasures} | {t.stores} | {sum(v == 'ok' for v in result.checked.values())} of "
             f"{len(result.checked)} | {len(result.left)} | **{len(errors)}** |", "",
             f"SQLite files checked: {', '.join(f'`{name}`' for name in result.checked)}."]
    if errors:
        lines += ["", "First errors:", "", *[f"- `{e[:300]}`" for e in errors[:10]]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=4, help="asking threads, each with its own clinician key")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the one server")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.seconds <= 0 or args.clients < 1 or args.workers < 1:
        parser.error("--seconds must be > 0, --clients and --workers >= 1")
    result = soak(args.seconds, args.clients, args.workers)
    emit(args.out, "soak-caches", report(result, args))
    errors = errors_of(result)
    if errors:
        print(f"{len(errors)} errors", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
