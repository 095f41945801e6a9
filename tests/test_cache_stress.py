"""The on-disk caches under real processes: several processes read, write and erase one file while another is killed
mid-write, and the file stays whole and erased; then a real `ebmrag pack` over damaged cache files exits 0 with the
packed context it gives over clean ones (kvcache.py: caches are disposable)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebmrag.kvcache import KeyValueCache, digest

WORKERS = 3
SECONDS = 3.0
TABLE = "vectors"  # the embedder's table shape: (key, vector)


def own_keys(worker: int, round_: int) -> list[str]:
    return [digest("stress", str(worker), str(round_), str(i)) for i in range(40)]


def churn(path: str, worker: int, seconds: float, out: str) -> None:
    """Write a round of keys, read a sample of everyone's, erase the round before; at the end erase everything it
    wrote and look its keys up again. Any exception is the failure being tested for."""
    report: dict[str, object] = {"worker": worker}
    try:
        cache = KeyValueCache(Path(path), TABLE, column="vector")
        Path(out).with_suffix(".started").touch()
        rng = random.Random(worker)
        round_, reads, found = 0, 0, 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cache.put_many({key: os.urandom(1536) for key in own_keys(worker, round_)})
            sample = [rng.choice(own_keys(rng.randrange(WORKERS), rng.randrange(round_ + 1))) for _ in range(60)]
            found += len(cache.get_many(sample))
            reads += len(sample)
            if round_:
                cache.forget(own_keys(worker, round_ - 1))
            round_ += 1
        written = [key for r in range(round_) for key in own_keys(worker, r)]
        cache.forget(written)
        report.update(rounds=round_, reads=reads, found=found, left=len(cache.get_many(written)))
    except Exception as exc:  # reported, not raised: the parent asserts on it
        report["error"] = f"{type(exc).__name__}: {exc}"
    Path(out).write_text(json.dumps(report))


def victim_keys(batch: str, count: int) -> list[str]:
    return [digest("victim", batch, str(i)) for i in range(count)]


def victim(path: str, signals: str) -> None:
    """Commit one batch; when told to go, write a 12 MB transaction and stop inside it (SQLite's progress handler,
    after ~1,000 of its 6,000 rows, past the first spill of its pages to the WAL) until the parent kills it there."""
    folder = Path(signals)
    cache = KeyValueCache(Path(path), TABLE, column="vector")
    cache.put_many({key: b"%d" % i * 400 for i, key in enumerate(victim_keys("first", 300))})
    (folder / "committed").touch()
    while not (folder / "go").exists():
        time.sleep(0.01)
    calls = 0

    def freeze() -> int:
        nonlocal calls
        calls += 1
        if calls == 20:
            (folder / "writing").touch()
            time.sleep(600)
        return 0

    assert cache._db is not None
    cache._db.set_progress_handler(freeze, 1000)
    batch = {key: os.urandom(2048) for key in victim_keys("killed", 6000)}
    while True:  # a write the others keep busy is skipped: again, until it stops inside one
        cache.put_many(batch)


def wait_for(*paths: Path) -> None:
    for _ in range(1200):  # a spawned interpreter imports first; this machine may be busy
        if all(p.exists() for p in paths):
            return
        time.sleep(0.05)
    raise AssertionError(f"never appeared: {[p.name for p in paths if not p.exists()]}")


@pytest.mark.integration
def test_processes_reading_writing_erasing_and_one_killed_mid_write_leave_a_whole_erased_file(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "embeddings.sqlite"
    spawn = multiprocessing.get_context("spawn")
    killed = spawn.Process(target=victim, args=(str(path), str(tmp_path)))
    killed.start()
    wait_for(tmp_path / "committed")
    workers = [spawn.Process(target=churn, args=(str(path), i, SECONDS, str(tmp_path / f"w{i}.json")))
               for i in range(WORKERS)]
    for process in workers:
        process.start()
    wait_for(*(tmp_path / f"w{i}.started" for i in range(WORKERS)))
    (tmp_path / "go").touch()
    wait_for(tmp_path / "writing")
    assert Path(f"{path}-wal").stat().st_size > 1_000_000, "the killed transaction's pages must be in the WAL"
    time.sleep(SECONDS / 3)  # the others meanwhile: writes skipped, erasures waiting for the stopped writer
    os.kill(killed.pid or 0, signal.SIGKILL)
    killed.join(10)
    for process in workers:
        process.join(60)
    reports = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(WORKERS)]

    assert killed.exitcode == -signal.SIGKILL
    assert [r.get("error") for r in reports] == [None] * WORKERS, reports
    assert all(r["rounds"] > 1 and r["left"] == 0 for r in reports), reports  # every erasure finished
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    after = KeyValueCache(path, TABLE, column="vector")
    first = after.get_many(victim_keys("first", 300))
    assert len(first) == 300 and first[victim_keys("first", 300)[7]] == b"7" * 400, "a committed batch was lost"
    assert after.get_many(victim_keys("killed", 6000)) == {}, "rows of the killed transaction are visible"
    assert not [p.name for p in path.parent.iterdir() if ".corrupt-" in p.name], "no process found the file broken"


def pack(cache_home: Path) -> subprocess.CompletedProcess[str]:
    ebmrag = Path(sys.executable).with_name("ebmrag")
    return subprocess.run([str(ebmrag), "pack", "demo-colon", "-q", "What is the current treatment plan?", "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache_home)})


@pytest.mark.slow
@pytest.mark.model
def test_pack_over_damaged_cache_files_gives_the_clean_caches_context(tmp_path: Path) -> None:
    clean = pack(tmp_path)
    assert clean.returncode == 0, clean.stderr
    caches = tmp_path / "ebmrag"
    for name, start in (("embeddings.sqlite", 0), ("derived.sqlite", 4096)):  # the header; every page after it
        size = (caches / name).stat().st_size
        assert size > 4096, f"{name} holds nothing to damage"
        with open(caches / name, "r+b") as handle:
            handle.seek(start)
            handle.write(bytes(random.Random(name).randrange(256) for _ in range(size - start)))

    damaged = pack(tmp_path)

    assert damaged.returncode == 0, damaged.stderr
    assert json.loads(damaged.stdout) == json.loads(clean.stdout)
    assert damaged.stderr.count("moved aside and deleted") == 2, damaged.stderr
    for name in ("embeddings.sqlite", "derived.sqlite"):
        with sqlite3.connect(caches / name) as db:
            assert db.execute("PRAGMA quick_check").fetchall() == [("ok",)]
            assert db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] >= 1
    assert not [p.name for p in caches.iterdir() if ".corrupt-" in p.name]
