"""The shared on-disk cache: values survive a new process, `forget` erases, old files stay readable, and a damaged,
busy or foreign file is a miss, never a failed request, while an erasure never skips."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ebmrag.kvcache import CacheErasureError, KeyValueCache, digest


def test_values_persist_across_instances_and_forget_erases(tmp_path: Path) -> None:
    first = KeyValueCache(tmp_path / "c.sqlite", "things")
    first.put_many({digest("ns", f"text {i}"): f"value {i}".encode() for i in range(1200)})  # > one SQL batch
    first.close()
    again = KeyValueCache(tmp_path / "c.sqlite", "things")
    keys = [digest("ns", f"text {i}") for i in range(1200)]
    assert again.get_many(keys)[keys[1100]] == b"value 1100"
    assert again.forget(keys[:10]) == 10
    assert again.get(keys[0]) is None and again.get(keys[10]) == b"value 10"


def test_a_file_written_by_an_earlier_version_is_read_with_its_column_name(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "llm_replies.sqlite")
    db.execute("CREATE TABLE replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
    db.execute("INSERT INTO replies VALUES ('k', '{\"text\": \"old\"}')")
    db.commit()
    db.close()
    assert KeyValueCache(tmp_path / "llm_replies.sqlite", "replies", column="reply").get("k") == b'{"text": "old"}'


def test_digest_separates_its_parts_and_bad_names_are_refused(tmp_path: Path) -> None:
    assert digest("ab", "c") != digest("a", "bc")
    with pytest.raises(ValueError, match="identifiers"):
        KeyValueCache(tmp_path / "x.sqlite", "t; DROP TABLE x")


# -- caches are disposable: damage is a miss, never a failed request; an erasure never skips ----------------------

MARKER = b"Zorblax-Fennimore reaction, bed 12"


def filled(path: Path, rows: int = 1200, table: str = "things") -> list[str]:
    """A cache file with `rows` values (one holding MARKER), closed: everything checkpointed into the database."""
    cache = KeyValueCache(path, table)
    keys = [digest("ns", f"text {i}") for i in range(rows)]
    cache.put_many({key: MARKER if i == 7 else f"value {i}".encode() for i, key in enumerate(keys)})
    cache.close()
    return keys


def damage(path: Path, start: int, length: int | None = None) -> None:
    """Overwrite bytes from `start` (to the end without a length) with 0xFF, as a torn or bad write would."""
    size = path.stat().st_size
    length = size - start if length is None else length
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(b"\xff" * length)


def traces(folder: Path, marker: bytes = MARKER) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and marker in p.read_bytes())


def aside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".corrupt-" in p.name)


def test_a_corrupt_file_is_moved_aside_with_one_warning_and_rebuilt_at_open(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keys = filled(tmp_path / "c.sqlite")
    damage(tmp_path / "c.sqlite", 0, 100)  # the header: "file is not a database"
    with caplog.at_level("WARNING", logger="ebmrag.kvcache"):
        cache = KeyValueCache(tmp_path / "c.sqlite", "things")
    assert cache.get(keys[0]) is None
    cache.put_many({keys[0]: b"again"})
    assert cache.get(keys[0]) == b"again"
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "not a database" in caplog.text
    assert aside(tmp_path) == [] and traces(tmp_path) == [], "the moved-aside copy held patient text: deleted"
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert db.execute("PRAGMA user_version").fetchone() == (1,)


def test_corruption_found_by_a_read_is_a_miss_and_every_open_cache_moves_to_the_fresh_file(tmp_path: Path) -> None:
    keys = filled(tmp_path / "c.sqlite")
    reader = KeyValueCache(tmp_path / "c.sqlite", "things")
    other = KeyValueCache(tmp_path / "c.sqlite", "things")  # another process or cache on the same file
    damage(tmp_path / "c.sqlite", 4096)  # every page after the first: "database disk image is malformed"
    assert reader.get_many(keys) == {}
    reader.put_many({keys[1]: b"fresh"})
    assert other.get(keys[1]) == b"fresh", "the other connection must follow the replacement, not keep the old file"
    other.put_many({keys[2]: b"from the other"})
    assert reader.get(keys[2]) == b"from the other"
    assert aside(tmp_path) == [] and traces(tmp_path) == []


def test_corruption_found_by_a_write_skips_it_and_the_next_write_lands(tmp_path: Path) -> None:
    keys = filled(tmp_path / "c.sqlite")
    writer = KeyValueCache(tmp_path / "c.sqlite", "things")
    damage(tmp_path / "c.sqlite", 4096)
    writer.put_many({key: b"x" for key in keys[:600]})  # must touch the damaged pages; skipped, not raised
    writer.put_many({keys[0]: b"landed"})
    assert writer.get(keys[0]) == b"landed" and writer.get(keys[1]) is None


def test_a_value_damaged_inside_its_row_fails_its_checksum_and_is_a_miss(tmp_path: Path) -> None:
    keys = filled(tmp_path / "c.sqlite", rows=20)
    raw = (tmp_path / "c.sqlite").read_bytes()
    damage(tmp_path / "c.sqlite", raw.index(MARKER) + 3, 4)  # SQLite's structure intact: only the value changed
    cache = KeyValueCache(tmp_path / "c.sqlite", "things")
    assert cache.get(keys[7]) is None and cache.get(keys[8]) == b"value 8"
    assert dict(cache.scan())[keys[7]] is None, "an erasure by content must see the damaged row"


def test_a_file_of_another_format_or_table_shape_is_replaced(tmp_path: Path) -> None:
    for setup in ("PRAGMA user_version = 7", "CREATE TABLE things (key TEXT, other BLOB)"):
        path = tmp_path / f"{len(setup)}.sqlite"
        with sqlite3.connect(path) as db:
            db.execute(setup)
            db.execute("CREATE TABLE IF NOT EXISTS notes (body TEXT)")
            db.execute("INSERT INTO notes VALUES (?)", (MARKER.decode(),))
        cache = KeyValueCache(path, "things")
        cache.put_many({"k": b"v"})
        assert cache.get("k") == b"v"
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone() == (1,)
            assert db.execute("SELECT name FROM sqlite_master WHERE name = 'notes'").fetchall() == []
        assert traces(tmp_path) == [] and aside(tmp_path) == []


def test_a_file_from_before_checksums_is_adopted_and_its_new_rows_are_checked(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        db.execute("CREATE TABLE things (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
        db.execute("INSERT INTO things VALUES ('old', x'6f6c64')")
    cache = KeyValueCache(tmp_path / "c.sqlite", "things")
    cache.put_many({"new": b"new"})
    assert cache.get_many(["old", "new"]) == {"old": b"old", "new": b"new"}
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        assert db.execute("SELECT key, crc32 IS NULL FROM things ORDER BY key").fetchall() == [("new", 0), ("old", 1)]


def test_a_busy_file_skips_a_write_and_an_erasure_waits_for_it(tmp_path: Path) -> None:
    cache = KeyValueCache(tmp_path / "c.sqlite", "things", busy_timeout=0.05)
    cache.put_many({"a": MARKER})
    blocker = sqlite3.connect(tmp_path / "c.sqlite", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another process writing
    cache.put_many({"b": b"skipped"})  # returns: a skipped write, not "database is locked"
    assert cache.get("a") == MARKER, "a WAL reader is not blocked by a writer"
    release = threading.Timer(0.3, blocker.rollback)
    release.start()
    assert cache.forget(["a"]) == 1, "the erasure waited for the writer instead of skipping"
    release.join()
    blocker.close()
    assert cache.get("a") is None and cache.get("b") is None
    assert traces(tmp_path) == []


def test_an_erasure_that_cannot_finish_raises_and_claims_nothing(tmp_path: Path) -> None:
    cache = KeyValueCache(tmp_path / "c.sqlite", "things", erase_timeout=0.3)
    cache.put_many({"a": MARKER})
    blocker = sqlite3.connect(tmp_path / "c.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(CacheErasureError, match="stayed busy"):
        cache.forget(["a"])
    blocker.rollback()
    assert cache.get("a") == MARKER, "nothing was erased: the error is the truth"
    assert cache.forget(["a"]) == 1 and traces(tmp_path) == []
    blocker.close()


def test_a_file_locked_when_opened_is_a_miss_until_it_is_free(tmp_path: Path) -> None:
    cache = KeyValueCache(tmp_path / "c.sqlite", "things", busy_timeout=0.05)
    cache.put_many({"a": b"1"})
    cache.close()
    holder = sqlite3.connect(tmp_path / "c.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("COMMIT")  # holds the file exclusively from now on: readers are refused too
    assert cache.get("a") is None
    cache.put_many({"b": b"2"})
    holder.close()
    assert cache.get_many(["a", "b"]) == {"a": b"1"}, "the file was busy, not broken: kept, the write skipped"


def test_an_erasure_on_a_corrupt_file_deletes_it_and_every_moved_aside_copy(tmp_path: Path) -> None:
    keys = filled(tmp_path / "c.sqlite")
    (tmp_path / "c.sqlite.corrupt-20260101T000000Z-1").write_bytes(MARKER)  # left by a process killed mid-move
    cache = KeyValueCache(tmp_path / "c.sqlite", "things")
    damage(tmp_path / "c.sqlite", 4096)
    assert cache.forget(keys[:10]) == 0
    assert traces(tmp_path) == [] and aside(tmp_path) == []
    assert cache.get(keys[20]) is None  # the whole file went: a cache is disposable


@pytest.mark.integration
def test_a_cache_file_of_another_account_is_moved_aside(tmp_path: Path) -> None:
    """A cache left by `sudo ebmrag ...`: the process cannot read it, and must not fail on it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file another account owns")
    import pwd
    import shutil
    import tempfile

    nobody = pwd.getpwnam("nobody")
    folder = Path(tempfile.mkdtemp(prefix="ebmrag-kv-"))  # tmp_path's parents are not open to another account
    try:
        filled(folder / "c.sqlite", rows=5)
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        probe = ("import os, sys; from pathlib import Path; from ebmrag.kvcache import KeyValueCache as C; "
                 f"os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid}); "  # after the imports: python is root's
                 "c = C(Path(sys.argv[1]), 'things'); before = c.scan(); c.put_many({'k': b'v'}); "
                 "print(len(before), c.get('k'))")
        ran = subprocess.run([sys.executable, "-c", probe, str(folder / "c.sqlite")], capture_output=True, text=True,
                             timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.split() == ["0", "b'v'"] and "moved aside and deleted" in ran.stderr
        assert (folder / "c.sqlite").stat().st_uid == nobody.pw_uid and traces(folder) == [] and aside(folder) == []
    finally:
        shutil.rmtree(folder)


def test_a_folder_where_the_file_belongs_is_set_aside_not_deleted(tmp_path: Path) -> None:
    (tmp_path / "c.sqlite").mkdir()
    (tmp_path / "c.sqlite" / "kept.txt").write_text("not ours")
    cache = KeyValueCache(tmp_path / "c.sqlite", "things")
    cache.put_many({"k": b"v"})
    assert cache.get("k") == b"v" and (tmp_path / "c.sqlite").is_file()
    (moved,) = aside(tmp_path) or [""]
    assert (tmp_path / moved / "kept.txt").read_text() == "not ours"


def test_a_reply_that_does_not_decode_is_a_miss_and_goes_with_an_erasure(tmp_path: Path) -> None:
    from ebmrag.llm.openai import ReplyCache

    replies = ReplyCache(tmp_path / "llm_replies.sqlite")
    replies._store.put_many({"broken": b'{"text": "Zorblax', "other": b'{"text": "x", "prompt_tokens": 1, '
                                                                          b'"completion_tokens": 1}'})
    assert replies.get("broken") is None and replies.get("other") is not None
    assert replies.forget_quoting(["Zorblax-Fennimore reaction noted"]) == 1, "an undecodable reply cannot be kept"
    assert replies.get("other") is not None
