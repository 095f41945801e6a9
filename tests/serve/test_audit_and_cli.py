"""The access log (hash chain, no record text), randomized isolation, and the keys/audit commands."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.store import audit
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
    assert [r[5] for r in rows] == ["put", "read", "pack"] and audit.verify(rows) == []
    assert json.loads(rows[0][7]) == ["allergy", "labs", "note"]
    assert not any(f["text"][:20] in json.dumps([list(r) for r in rows]) for f in RECORD["fragments"])
    edited = [list(r) for r in rows]
    edited[1][5] = "erase"
    assert "entry 2: its content does not match its hash (edited)" in audit.verify(edited)
    assert any("missing" in p for p in audit.verify([rows[0], rows[2]]))


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
