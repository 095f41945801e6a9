"""The keyed audit chain against someone who can write the database but cannot read the key file.

Every tamper here is done as that attacker would: plain SQL on the store's own tables, with hashes recomputed
by the public recipe (sha256 of the canonical entry) — the only one available without the key. Both backends.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.store import audit
from ebmrag.store.access import authenticate
from ebmrag.store.patients import PatientStore, PostgresStore, SQLiteStore
from tests.serve.conftest import POSTGRES_URL

OLD_AUDIT = """CREATE TABLE audit (seq INTEGER PRIMARY KEY, at TEXT NOT NULL, key_id TEXT NOT NULL,
    tenant TEXT NOT NULL, patient TEXT NOT NULL, action TEXT NOT NULL, request_id TEXT NOT NULL,
    fragments TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL)"""
OLD_KEYS = """CREATE TABLE api_keys (key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, role TEXT NOT NULL,
    patients TEXT NOT NULL, digest TEXT NOT NULL, created TEXT NOT NULL, revoked INTEGER NOT NULL DEFAULT 0)"""


def logged(store: PatientStore, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        audit.append(store, audit.AuditEntry("k1", "t", f"p{n}", "read", f"r{n}", (f"f{n}",)))


def sql(store: PatientStore, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with store.transaction() as cur:
        result = store._execute(cur, statement, params)
        return list(result.fetchall()) if result.description else []


def rehash_from(store: PatientStore, first: int, scheme: str | None = None) -> None:
    """The attacker's recomputation: every entry from `first` on gets the public sha256 of its content and the
    (recomputed) hash before it, so the chain links up again."""
    rows = store.audit_rows()
    prev = next((r[9] for r in rows if r[0] == first - 1), "")
    for row in (r for r in rows if r[0] >= first):
        entry = audit.AuditEntry(row[2], row[3], row[4], row[5], row[6], tuple(json.loads(row[7])))
        digest = hashlib.sha256(json.dumps([row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                                            list(entry.fragments), prev], ensure_ascii=False,
                                           separators=(",", ":")).encode()).hexdigest()
        sql(store, "UPDATE audit SET prev = ?, hash = ?, scheme = ? WHERE seq = ?",
            (prev, digest, scheme or row[10], row[0]))
        prev = digest


def problems(store: PatientStore, **kwargs: Any) -> str:
    report = audit.verify(store, **kwargs)
    assert not report.cannot_check, report.cannot_check
    return "\n".join(report.problems)


def test_an_untouched_log_is_intact_and_keyed(store: PatientStore) -> None:
    logged(store, 5)
    report = audit.verify(store)
    assert report.intact and (report.entries, report.keyed, report.legacy) == (5, 5, 0)
    assert {r[10] for r in store.audit_rows()} == {audit.KEYED}


@pytest.mark.parametrize("downgrade", [False, True], ids=["keyed-label-kept", "relabelled-unkeyed"])
def test_an_edited_entry_with_every_later_hash_recomputed_is_found(store: PatientStore, downgrade: bool) -> None:
    logged(store, 6)
    sql(store, "UPDATE audit SET patient = 'p-other', action = 'erase' WHERE seq = 3")
    rehash_from(store, 3, audit.LEGACY if downgrade else None)
    last = store.audit_rows()[-1]
    sql(store, "UPDATE audit_head SET hash = ? WHERE id = 1", (last[9],))  # the head follows, unsigned
    found = problems(store)
    assert "entry 3" in found and ("unkeyed entry where the keyed chain runs" in found if downgrade else
                                   "does not match its keyed hash" in found)
    assert "signed head does not carry the audit key's signature" in found
    assert "does not follow" not in found  # the links were recomputed: only the key tells


@pytest.mark.parametrize("also", ["nothing", "head-row-deleted", "head-row-moved-back"])
def test_removed_last_entries_are_found(store: PatientStore, also: str) -> None:
    logged(store, 6)
    sql(store, "DELETE FROM audit WHERE seq > 4")
    if also == "head-row-deleted":
        sql(store, "DELETE FROM audit_head")
    if also == "head-row-moved-back":
        fourth = store.audit_rows()[-1]
        sql(store, "UPDATE audit_head SET seq = 4, hash = ? WHERE id = 1", (fourth[9],))
    found = problems(store)
    assert {"nothing": "entries 5 to 6 are missing after entry 4: the tail was removed",
            "head-row-deleted": "the signed head is missing",
            "head-row-moved-back": "signed head does not carry the audit key's signature"}[also] in found
    assert "head file (audit.head) names entry 6, which is no longer in the log" in found


def test_a_log_cut_back_to_before_its_keyed_chain_is_found_by_the_head_file(store: PatientStore) -> None:
    logged(store, 4)
    sql(store, "DELETE FROM audit")
    sql(store, "DELETE FROM audit_head")
    assert "names entry 4, which is no longer in the log" in problems(store)


def test_the_next_append_records_a_removed_tail_instead_of_hiding_it(store: PatientStore) -> None:
    logged(store, 5)
    sql(store, "DELETE FROM audit WHERE seq > 3")
    logged(store, 1, start=9)
    found = problems(store)
    assert "entries 4 to 5 are missing (removed)" in found
    assert "the server found when writing it that entries 4 to 5 after entry 3 were removed" in found


def test_a_removed_middle_entry_is_found(store: PatientStore) -> None:
    logged(store, 5)
    sql(store, "DELETE FROM audit WHERE seq = 3")
    found = problems(store)
    assert "entries 3 to 3 are missing (removed)" in found and "entry 4: does not follow" in found


def test_a_removed_middle_entry_renumbered_and_rehashed_is_found(store: PatientStore) -> None:
    logged(store, 5)
    sql(store, "DELETE FROM audit WHERE seq = 3")
    for seq in (4, 5):
        sql(store, "UPDATE audit SET seq = ? WHERE seq = ?", (seq - 1, seq))
    rehash_from(store, 3)
    assert "does not match its keyed hash" in problems(store)


def test_without_the_right_key_verify_says_it_cannot_check(store: PatientStore) -> None:
    logged(store, 3)
    key_file = store.audit_key_file
    assert key_file is not None
    original = key_file.read_text()
    key_file.unlink()
    missing = audit.verify(store)
    assert not missing.intact and missing.problems == []
    assert missing.cannot_check.startswith(f"no audit key file at {key_file}: the 3 keyed entries")
    key_file.write_text(secrets.token_hex(32))
    wrong = audit.verify(store)
    assert wrong.problems == [] and "not the key this log was written with" in wrong.cannot_check
    sql(store, "DELETE FROM audit WHERE seq = 3")  # what can be checked without the key still is
    assert "the tail was removed" in "\n".join(audit.verify(store).problems)
    key_file.write_text(original)
    assert "the tail was removed" in problems(store)


def test_the_key_file_is_private_agreed_on_by_racing_processes_and_never_in_the_database(
        store: PatientStore, tmp_path: Path) -> None:
    logged(store, 2)
    key_file = store.audit_key_file
    assert key_file is not None and key_file.stat().st_mode & 0o777 == 0o600
    secret = key_file.read_text().strip()
    assert len(secret) == 64
    tables = [sql(store, f"SELECT * FROM {table}") for table in ("audit", "audit_head", "api_keys")]
    assert secret not in json.dumps(tables, default=str)
    if isinstance(store, SQLiteStore):
        for path in store.path.parent.glob("store.sqlite*"):
            assert secret.encode() not in path.read_bytes()
    racing = tmp_path / "racing" / "audit.key"
    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: audit.create_key(racing), range(16)))
    assert len(keys) == 1 and racing.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in racing.parent.iterdir()] == ["audit.key"]  # no drafts left behind


def old_store(store: PatientStore, tmp_path: Path) -> PatientStore:
    """`store` as a release before the keyed chain left it: the old tables, three entries of the unkeyed
    chain and a key without expiry; then opened again, as the new code opens it."""
    for table in ("audit", "audit_head", "api_keys"):
        sql(store, f"DROP TABLE {table}")
    sql(store, OLD_AUDIT)
    sql(store, OLD_KEYS)
    prev = ""
    for seq in (1, 2, 3):
        entry = audit.AuditEntry("k1", "t", "p1", "read", f"r{seq}", ("f",))
        digest = audit.entry_hash(seq, f"2025-01-0{seq}T00:00:00.000+00:00", entry, prev)
        sql(store, "INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, f"2025-01-0{seq}T00:00:00.000+00:00", "k1", "t", "p1", "read", f"r{seq}", '["f"]', prev, digest))
        prev = digest
    secret = "s" * 40
    sql(store, "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, 0)",
        ("0123456789ab", "t", "clinician", "[]", hashlib.sha256(secret.encode()).hexdigest(), "2025-01-01"))
    return reopened(store)


def reopened(store: PatientStore, key_file: Path | None = None) -> PatientStore:
    """The same database as another process opens it (with `key_file`, or the same key file)."""
    if isinstance(store, SQLiteStore):
        return SQLiteStore(store.path, key_file)
    assert isinstance(store, PostgresStore)
    return PostgresStore(POSTGRES_URL, schema=store.schema, audit_key_file=key_file or store.audit_key_file)


def test_an_old_store_is_migrated_and_its_unkeyed_entries_still_verify_before_the_keyed_ones(
        store: PatientStore, tmp_path: Path) -> None:
    migrated = old_store(store, tmp_path)
    key = authenticate(migrated, "Bearer ebm_0123456789ab_" + "s" * 40)
    assert key.expires == "" and not key.expired()
    logged(migrated, 2)
    report = audit.verify(migrated)
    assert report.intact and (report.legacy, report.keyed) == (3, 2), report
    assert "entries 1 to 3 are of the unkeyed chain" in report.summary()
    assert "entries 4 to 5 are keyed" in report.summary()
    sql(migrated, "INSERT INTO audit (seq, at, key_id, tenant, patient, action, request_id, fragments, prev, hash, "
                  "scheme) VALUES (6, 'x', 'k', 't', 'p', 'read', 'r', '[]', ?, 'h', 'sha256')",
        (report.last.split(":")[1],))
    rehash_from(migrated, 6)
    assert "entry 6: an unkeyed entry where the keyed chain runs" in problems(migrated)


def test_head_and_verify_commands_with_an_outside_anchor(tmp_path: Path) -> None:
    """A replayed head row and a deleted head file hide a cut tail from the log itself; the head the operator
    kept (`audit head`) does not."""
    runner = CliRunner()
    store = SQLiteStore(tmp_path / "store.sqlite")
    logged(store, 3)
    saved = sql(store, "SELECT seq, hash, keyed_from, key_print, signature FROM audit_head")[0]
    logged(store, 2, start=3)
    printed = runner.invoke(app, ["audit", "head", "--data-dir", str(tmp_path)])
    assert printed.exit_code == 0 and printed.stdout.startswith("5:") and len(printed.stdout.strip()) == 66
    db = sqlite3.connect(tmp_path / "store.sqlite")
    db.execute("DELETE FROM audit WHERE seq > 3")
    db.execute("UPDATE audit_head SET seq = ?, hash = ?, keyed_from = ?, key_print = ?, signature = ?", saved)
    db.commit()
    (tmp_path / "audit.head").unlink()
    assert runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)]).exit_code == 0
    anchored = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path), "--expect-head",
                                   printed.stdout.strip()])
    assert anchored.exit_code == 1 and "the expected head names entry 5, which is no longer in the log" in \
        anchored.stderr
    bad = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path), "--expect-head", "5:xyz"])
    assert bad.exit_code == 2 and "a head is SEQ:HASH" in bad.stderr
    os.remove(tmp_path / "audit.key")
    unkeyed = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)])
    assert unkeyed.exit_code == 2 and "cannot check" in unkeyed.stderr and "no audit key file at" in unkeyed.stderr


def test_a_store_without_a_key_file_refuses_to_audit_rather_than_log_unkeyed(tmp_path: Path) -> None:
    store = PostgresStore(POSTGRES_URL, schema=f"nokey_{secrets.token_hex(5)}")
    try:
        if store.audit_key_file is None:
            with pytest.raises(audit.AuditKeyError, match="needs a key file outside the database"):
                logged(store, 1)
            assert store.audit_rows() == []
    finally:
        store.drop()


def test_a_process_with_another_key_or_none_refuses_to_write_the_log(store: PatientStore, tmp_path: Path) -> None:
    """A second host with its own key file (or none) must not fork the chain into one nobody can verify: it
    answers 503 and writes nothing to the log."""
    from ebmrag.serve.app import create_app
    from ebmrag.store.access import create_key
    from tests.serve.conftest import serving

    logged(store, 2)
    feed = create_key(store, "t", "service")[0]
    other = tmp_path / "elsewhere" / "audit.key"
    other.parent.mkdir()
    other.write_text(secrets.token_hex(32))
    for key_file in (other, tmp_path / "nowhere" / "audit.key"):
        with serving(create_app(reopened(store, key_file))) as (url, _):
            answer = httpx.put(f"{url}/v1/patients/p1", headers={"Authorization": f"Bearer {feed}"},
                               json={"patient_id": "p1", "fragments": [{"id": "a", "text": "Note."}]})
        assert answer.status_code == 503 and answer.json()["type"].endswith("/store-unavailable")
    assert not (tmp_path / "nowhere").exists()
    assert len(store.audit_rows()) == 2 and audit.verify(store).intact
