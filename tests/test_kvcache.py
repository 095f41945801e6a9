"""The shared on-disk cache: values survive a new process, `forget` erases, old files stay readable."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ebmrag.kvcache import KeyValueCache, digest


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
