"""The access log (keyed chain, no record text), randomized isolation, key expiry and rotation, and the
keys/audit commands. The chain against tampering: test_audit_chain.py."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.store import audit
from ebmrag.store.access import AccessError, authenticate, create_key, key_expiry
from ebmrag.store.patients import SQLiteStore
from tests.serve.conftest import Live
from tests.serve.test_service import RECORD


@pytest.mark.model
def test_every_access_is_logged_with_ids_but_no_text_and_tampering_is_found(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as http:
        http.put("/v1/patients/p1", json=RECORD)
        http.get("/v1/patients/p1/fragments")
        http.post("/v1/patients/p1/pack", json={"query": "allergies?", "window": 256})
    rows = live.store.audit_rows()
    assert [r[5] for r in rows] == ["put", "read", "pack"] and audit.verify(live.store).intact
    assert json.loads(rows[0][7]) == ["allergy", "labs", "note"]
    assert not any(f["text"][:20] in json.dumps([list(r) for r in rows]) for f in RECORD["fragments"])
    with live.store.transaction() as cur:
        live.store._execute(cur, "UPDATE audit SET action = 'erase' WHERE seq = 2")
    assert "entry 2: its content does not match its keyed hash (edited, or rehashed without the key)" in \
        audit.verify(live.store).problems


@pytest.mark.model
def test_an_expired_key_is_refused_and_audited_under_its_id(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as feed:
        feed.put("/v1/patients/p1", json=RECORD)
    _, expired = create_key(live.store, "t", "clinician", (), datetime.now(UTC) - timedelta(minutes=1))
    soon, ending = create_key(live.store, "t", "clinician", (), datetime.now(UTC) + timedelta(seconds=1.5))
    with live.client(soon) as http:
        assert http.get("/v1/patients/p1/fragments").status_code == 200
        time.sleep(1.6)
        late = http.get("/v1/patients/p1/fragments")
    assert late.status_code == 401 and late.json()["detail"].startswith(f"the API key expired on {ending.expires}")
    with live.client(live.key("t", "clinician")) as fresh:
        assert fresh.get("/v1/patients/p1/fragments").status_code == 200
    refused = [(r[2], r[3], r[5]) for r in live.store.audit_rows() if r[5].startswith("refused")]
    assert refused == [(ending.key_id, "t", "refused 401 /v1/patients/{pid}/fragments")]
    assert expired.expired() and audit.verify(live.store).intact


def test_key_expiry_policy() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    assert key_expiry("90d", "", 365, moment) == moment + timedelta(days=90)
    assert key_expiry("", "", 365, moment) == moment + timedelta(days=365)
    assert key_expiry("", "", 0, moment) is None
    assert key_expiry("", "2026-03-01", 365, moment) == datetime(2026, 3, 1, tzinfo=UTC)
    for expires_in, expires, error in (("400d", "", "at most 365 days"), ("", "2025-12-31", "not in the future"),
                                       ("90 days", "", "a number and a unit"), ("1d", "2026-02-01", "not both"),
                                       ("", "next week", "ISO 8601")):
        with pytest.raises(ValueError, match=error):
            key_expiry(expires_in, expires, 365, moment)


@pytest.mark.model
def test_randomized_requests_never_return_another_patients_marker(serve: Callable[..., Live]) -> None:
    """Tenants x patients, each record planted with a unique marker; random keys ask for random patients."""
    live = serve(rate_per_second=1000, rate_burst=1000)
    rng = random.Random(7)
    owners = {(t, p): f"MARK{t}{p}Z" for t in ("ta", "tb") for p in ("p1", "p2", "p3")}
    keys = {}
    for (tenant, patient), marker in owners.items():
        keys[(tenant, patient)] = live.key(tenant, "clinician", patient)
        with live.client(live.key(tenant, "service")) as feed:
            record = {"patient_id": patient, "fragments": [
                {"id": "m", "text": f"Biopsy {marker} shows adenocarcinoma."},
                {"id": "n", "text": f"Creatinine 1.{len(marker)} mg/dL, note {marker}."}]}
            assert feed.put(f"/v1/patients/{patient}", json=record).status_code == 200
    for _ in range(150):
        (tenant, own), asked = rng.choice(list(keys)), rng.choice(["p1", "p2", "p3", "p4"])
        with live.client(keys[(tenant, own)]) as http:
            route = rng.choice(["fragments", "pack"])
            response = (http.get(f"/v1/patients/{asked}/fragments") if route == "fragments" else
                        http.post(f"/v1/patients/{asked}/pack", json={"query": "biopsy?", "window": 256}))
        foreign = [m for owner, m in owners.items() if owner != (tenant, own) and m in response.text]
        assert not foreign, f"{tenant}/{own} asking {asked} saw {foreign}"
        assert response.status_code == (200 if asked == own else 404)


def test_keys_and_audit_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(app, ["keys", "create", "--data-dir", str(tmp_path), "--tenant", "t", "--role", "clinician",
                               "--patient", "p1"])
    assert made.exit_code == 0, made.output
    assert made.stdout.strip().startswith("ebm_") and len(made.stdout.strip().splitlines()) == 1
    listed = json.loads(runner.invoke(app, ["keys", "list", "--data-dir", str(tmp_path), "--json"]).stdout)
    assert listed[0]["patients"] == ["p1"] and "digest" not in listed[0]
    ends = datetime.fromisoformat(listed[0]["expires"])  # [serve] key_max_days: 365 by default
    assert timedelta(days=364) < ends - datetime.now(UTC) <= timedelta(days=365)
    assert runner.invoke(app, ["keys", "revoke", "--data-dir", str(tmp_path), listed[0]["key_id"]]).exit_code == 0
    bad = runner.invoke(app, ["keys", "create", "--data-dir", str(tmp_path), "--tenant", "t", "--role", "root"])
    assert bad.exit_code == 2 and "role must be one of" in bad.stderr
    store = SQLiteStore(tmp_path / "store.sqlite")
    for action in ("put", "read"):
        audit.append(store, audit.AuditEntry("k", "t", "p1", action, "r"))
    assert runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)]).exit_code == 0
    db = sqlite3.connect(tmp_path / "store.sqlite")
    db.execute("UPDATE audit SET patient = 'p2' WHERE seq = 1")
    db.commit()
    broken = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)])
    assert broken.exit_code == 1 and "edited" in broken.stderr


def test_keys_with_expiry_and_rotation(tmp_path: Path) -> None:
    runner = CliRunner()

    def keys(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, ["keys", *args, "--data-dir", str(tmp_path)])
        return result.exit_code, result.stdout.strip(), " ".join(result.stderr.split())

    code, old, said = keys("create", "--tenant", "t", "--role", "service", "--patient", "p1", "--expires-in", "30d")
    assert code == 0 and "expires 20" in said
    old_id = old.split("_")[1]
    code, _, said = keys("create", "--tenant", "t", "--role", "service", "--expires-in", "400d")
    assert code == 2 and "at most 365 days" in said
    code, new, said = keys("rotate", old_id, "--grace", "2d")
    assert code == 0 and new.startswith("ebm_") and f"replaces {old_id}" in said
    store = SQLiteStore(tmp_path / "store.sqlite")
    successor, before = authenticate(store, f"Bearer {new}"), authenticate(store, f"Bearer {old}")
    assert (successor.tenant, successor.role, successor.patients) == ("t", "service", ("p1",))
    assert timedelta(days=1.9) < datetime.fromisoformat(before.expires) - datetime.now(UTC) <= timedelta(days=2)
    code, newest, _ = keys("rotate", successor.key_id, "--grace", "0s")
    assert code == 0
    with pytest.raises(AccessError, match="the API key expired on") as refused:
        authenticate(store, f"Bearer {new}")
    assert refused.value.status == 401 and refused.value.key is not None
    assert authenticate(store, f"Bearer {newest}").patients == ("p1",)
    code, listing, _ = keys("list")
    assert code == 0 and f"{successor.key_id}  t  service  p1" in listing and "expired" in listing
    code, _, said = keys("rotate", successor.key_id)
    assert code == 2 and "expired: create a new key instead" in said
