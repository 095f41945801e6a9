"""Issue 32's hostile inputs and their variants against a real `ebmrag serve`, on SQLite and PostgreSQL.

Run: python bench/probe_service.py --out docs/results/probe.md   (make probe; about 2 min, at most --budget-seconds)

For each backend, `ebmrag serve` (and `ebmrag mcp --transport http`, on the same store: the service does not
mount MCP) runs as its own process on 127.0.0.1, with a data folder, models cache and, for PostgreSQL, a
database of its own that is dropped afterwards. A world is planted through the API (two tenants with marked
records, a chart of disguised injections), then each class of probe runs within its share of the time
budget: unauthenticated bodies (with the server's VmRSS before and after), bad keys, cross-tenant and
cross-patient ids, injection, deep JSON, malformed FHIR, control characters, request ids, idempotency keys,
misspelt fields, wait_ms, knowledge-base ids, MCP, /ui, and finally the audit table matched against every
refused answer. Traffic stays on the loopback interface; each class speaks from its own 127.0.0.x so that
the per-address bad-key throttle is probed without locking the other classes out.

Pass: 0 × 5xx, 0 leaks, RSS growth under 100 MB for unauthenticated traffic, every refused attempt
audited, and every class's own expectation. A failure is reported (class, probe, status, snippet) and the
run goes on; the exit status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import date
from pathlib import Path

import httpx

from ebmrag.serve.throttle import QUIET_SECONDS
from ebmrag.store.patients import PatientStore
from probe_access import audit, bad_keys, isolation, mcp, ui, unauthenticated_bodies
from probe_content import (
    control_characters,
    deep_json_bodies,
    idempotency,
    injection,
    kb_document_ids,
    malformed_fhir,
    record_fields,
    request_ids,
    wait_ms_bounds,
)
from probe_kit import Run, Target, rss_of
from probe_world import SetupError, World, plant
from report import machine  # bench/ is on sys.path when a script here runs

log = logging.getLogger("probe")
# (class, its share of the time left when it starts, the probe): shares favour the classes with many variants
SUITE: list[tuple[str, float, Callable[[World], None]]] = [
    ("unauth-bodies", 0.15, unauthenticated_bodies), ("bad-keys", 0.05, bad_keys), ("isolation", 0.2, isolation),
    ("injection", 0.2, injection), ("deep-json", 0.1, deep_json_bodies), ("fhir", 0.25, malformed_fhir),
    ("control-chars", 0.2, control_characters), ("request-ids", 0.1, request_ids), ("idempotency", 0.1, idempotency),
    ("record-fields", 0.1, record_fields), ("wait-ms", 0.25, wait_ms_bounds), ("kb-doc-ids", 0.2, kb_document_ids),
    ("mcp", 0.3, mcp), ("ui", 0.5, ui), ("audit", 1.0, audit)]
CONFIG = """[models]
cache_dir = "{cache}"

[serve]
rate_per_second = 100000.0
rate_burst = 1000000
request_seconds = {request_seconds}
max_body_mb = {max_body_mb}
"""


def run_suite(target: Target, run: Run, classes: set[str] | None = None) -> Run:
    """Plant the world, then every class (or those named) within the run's budget; a class that crashes the
    probe itself is a failure of that class, and the others still run."""
    world = plant(target, run)
    try:
        for klass, share, probe in SUITE:
            if classes is not None and klass not in classes and klass != "audit":
                continue
            run.begin(klass, share)
            log.info("%s: %s (%.0f s left)", run.backend, klass, run.deadline - time.monotonic())
            try:
                probe(world)
            except Exception as exc:  # a bug of the probe must not hide the other classes' results
                log.exception("the probe of %s failed", klass)
                run.fail(klass, "the probe itself", 0, f"{type(exc).__name__}: {exc}")
    finally:
        world.close()
    return run


# ---------------------------------------------------------------------------------------------- the servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env() -> dict[str, str]:
    """This shell's environment without EBMRAG_* settings (a store URL or an audit key file of the user's
    own must not reach the probe's servers)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("EBMRAG_")}


def ebmrag_command() -> list[str]:
    script = Path(sys.executable).with_name("ebmrag")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ebmrag.cli"]


@contextmanager
def process(arguments: list[str], log_path: Path, health: str) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, up when `health` answers; stopped (terminate, then kill) afterwards."""
    with log_path.open("wb") as output:
        child = subprocess.Popen([*ebmrag_command(), *arguments], stdout=output, stderr=subprocess.STDOUT,
                                 env=server_env())
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(health, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if child.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-600:]
                raise SetupError(f"{' '.join(arguments[:1])} did not start: {tail}")
            time.sleep(0.2)
        yield child
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A PostgreSQL database of this run's own (the store's schema name is fixed), dropped afterwards."""
    import psycopg

    name = f"ebmrag_probe_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    head, _, _ = admin_url.rpartition("/")
    try:
        yield f"{head}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def served(backend: str, work: Path, postgres_url: str, request_seconds: float,
           max_body_mb: float) -> Iterator[Target]:
    """`ebmrag serve` and `ebmrag mcp --transport http` over one fresh store of `backend`."""
    from ebmrag.store.access import create_key
    from ebmrag.store.patients import open_store

    folder = work / backend
    folder.mkdir(parents=True)
    config = folder / "probe.toml"
    config.write_text(CONFIG.format(cache=folder / "cache", request_seconds=request_seconds, max_body_mb=max_body_mb))
    kb = _operator_kb(folder, config)  # the probes upload to it: the demo knowledge base is read-only
    with ExitStack() as stack:
        store_url = stack.enter_context(scratch_database(postgres_url)) if backend == "postgresql" else ""
        common = ["--data-dir", str(folder / "data"), "--config", str(config),
                  *(["--store-url", store_url] if store_url else [])]
        port, mcp_port = free_port(), free_port()
        server = stack.enter_context(process(["serve", "--port", str(port), "--kb", str(kb), *common],
                                             folder / "serve.log", f"http://127.0.0.1:{port}/healthz"))
        stack.enter_context(process(["mcp", "--transport", "http", "--port", str(mcp_port), "--kb", str(kb), *common],
                                    folder / "mcp.log", f"http://127.0.0.1:{mcp_port}/mcp"))
        store = open_store(folder / "data", store_url)

        def verify() -> list[str]:
            done = subprocess.run([*ebmrag_command(), "audit", "verify", *common], capture_output=True, text=True,
                                  timeout=120, check=False, env=server_env())
            return [] if done.returncode == 0 else [line for line in done.stderr.splitlines() if line.strip()]

        yield Target(url=f"http://127.0.0.1:{port}", backend=backend,
                     new_key=lambda tenant, role, patients: create_key(store, tenant, role, patients)[0],
                     revoke=lambda key: _revoke(store, key),
                     audit_rows=store.audit_rows, rss_mb=lambda: rss_of(server.pid), request_seconds=request_seconds,
                     max_body_mb=max_body_mb, mcp_url=f"http://127.0.0.1:{mcp_port}/mcp", audit_intact=verify,
                     settle=lambda: time.sleep(QUIET_SECONDS * 1.5 + 1))  # a quiet burst's summary: within 1.5 x


def _operator_kb(folder: Path, config: Path) -> Path:
    """A knowledge base of the probe's own, seeded with the demo corpus (`ebmrag ingest`)."""
    from ebmrag.demo import DEMO_CORPUS

    kb = folder / "kb"
    subprocess.run([*ebmrag_command(), "ingest", str(DEMO_CORPUS), "--kb", str(kb), "--config", str(config)],
                   capture_output=True, timeout=300, check=True, env=server_env())
    return kb


def _revoke(store: PatientStore, key: str) -> None:
    if not store.revoke(key.split("_")[1]):
        raise SetupError("the probe could not revoke its own key")


# ---------------------------------------------------------------------------------------------- the report


def report(runs: list[Run], command: str, seconds: float) -> list[str]:
    failures = [f for r in runs for f in r.failures]
    lines = [f"# Probe suite (issue 32), {date.today().isoformat()}", "",
             f"{machine()}. Command: `{command}` ({seconds:.0f} s). Produced by `bench/probe_service.py`; "
             "see docs/security.md, \"Probe suite\".", "",
             f"**{len(failures)} failures**; "
             + ", ".join(f"{r.backend}: {sum(r.server_errors.values())} × 5xx, {sum(r.leaks.values())} leaks"
                         for r in runs) + ".", ""]
    for r in runs:
        lines += [f"## {r.backend}", "", *(f"- {name}: {value}" for name, value in sorted(r.measures.items())),
                  *(f"- note: {n}" for n in r.notes), "",
                  "| class | probes | 5xx | leaks | failures | skipped (budget or sample) |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {k} | {v['probes']} | {v['5xx']} | {v['leaks']} | {v['failures']} | {v['skipped']} |"
                  for k, v in r.summary().items()]
        lines.append("")
    if failures:
        lines += ["## Failures", "", "At most 12 per class and backend (audit: all, they are grouped); the counts "
                  "above are complete.", "",
                  "| backend | class | probe | status | problem | snippet |", "|---|---|---|---|---|---|"]
        shown: dict[tuple[str, str], int] = {}
        for f in failures:
            shown[(f.backend, f.klass)] = shown.get((f.backend, f.klass), 0) + 1
            if shown[(f.backend, f.klass)] <= 12 or f.klass == "audit":
                lines.append(f"| {f.backend} | {f.klass} | {_cell(f.probe)} | {f.status} | {_cell(f.problem)} | "
                             f"`{_cell(f.snippet)}` |")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")[:200]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--postgres-url", default=os.environ.get("EBMRAG_TEST_POSTGRES_URL",
                                                                 "postgresql://postgres@127.0.0.1:5432/test"),
                        help="a database the probe may CREATE DATABASE from (a scratch database is used and dropped)")
    parser.add_argument("--budget-seconds", type=float, default=240.0, help="for all backends, start-up included")
    parser.add_argument("--huge-mb", type=int, default=300, help="size of each unauthenticated body")
    parser.add_argument("--request-seconds", type=float, default=10.0, help="[serve] request_seconds of the server")
    parser.add_argument("--classes", default="", help="only these classes (comma-separated; audit always runs)")
    parser.add_argument("--sample", type=int, default=None, help="at most this many variants per list")
    parser.add_argument("--out", type=Path, help="the markdown report (e.g. docs/results/probe.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not set(backends) <= {"sqlite", "postgresql"}:
        parser.error(f"--backends takes sqlite and postgresql, got {args.backends!r}")
    classes = {c.strip() for c in args.classes.split(",") if c.strip()} or None
    started, runs = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="ebmrag-probe-") as work:
        for n, backend in enumerate(backends):
            share = (args.budget_seconds - (time.monotonic() - started)) / (len(backends) - n)
            run = Run(backend, max(10.0, share), args.sample, args.huge_mb)
            try:
                with served(backend, Path(work), args.postgres_url, args.request_seconds, 10.0) as target:
                    run.deadline = time.monotonic() + max(10.0, share - (time.monotonic() - run.started) - 5)
                    run_suite(target, run, classes)
            except Exception as exc:  # a backend that cannot start (no PostgreSQL, a port taken) is one failure
                log.error("%s: %s: %s", backend, type(exc).__name__, exc)
                run.fail("setup", "start and seed the server", 0, f"{type(exc).__name__}: {str(exc)[:300]}")
            runs.append(run)
    elapsed = time.monotonic() - started
    command = "python bench/probe_service.py" + (f" --out {args.out}" if args.out else "") + \
        (f" --budget-seconds {args.budget_seconds:g}" if args.budget_seconds != 240 else "")
    text = "\n".join(report(runs, command, elapsed)) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 1 if any(r.failures for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
