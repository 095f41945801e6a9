"""`ebmrag ehr keygen` and `ebmrag pull` end to end: a key made by the CLI registered with the real test server,
charts pulled into the store `ebmrag serve` would open, and every failure one line."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.config import load_settings
from ebmrag.ehr.pull import pull_patient
from ebmrag.store.patients import open_store
from tests.ehr.fhir_server import FhirServer
from tests.ehr.helpers import QUICK, TENANT, chart, fragments_of, load_one

runner = CliRunner()
NZ = "ips_nz_peter_jordan_labs_document.json"


def _keygen(tmp_path: Path, alg: str = "ES384") -> tuple[Path, dict[str, object]]:
    key = tmp_path / "keys" / "ebmrag.pem"
    made = runner.invoke(app, ["ehr", "keygen", "--alg", alg, "--out", str(key)])
    assert made.exit_code == 0, made.output
    return key, json.loads(made.stdout)


def _config(tmp_path: Path, fhir: FhirServer, key: Path, alg: str = "ES384") -> Path:
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[ehr]\npage_size = 25\nsince_skew_seconds = 0.0\n\n'
                      f'[ehr.connections.hospital]\ntenant = "{TENANT}"\nfhir_base = "{fhir.base}"\n'
                      f'client_id = "ebmrag"\nprivate_key_file = "{key}"\nalgorithm = "{alg}"\nallow_http = true\n')
    return config


@pytest.mark.parametrize("alg", ["ES384", "RS384"])
def test_keygen_writes_an_owner_only_key_and_prints_the_jwks_to_register(fhir: FhirServer, tmp_path: Path,
                                                                         alg: str) -> None:
    key, jwks = _keygen(tmp_path, alg)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text().startswith("-----BEGIN PRIVATE KEY")
    public = jwks["keys"][0]  # type: ignore[index]
    assert public["alg"] == alg and "d" not in public and public["kid"]
    again = runner.invoke(app, ["ehr", "keygen", "--out", str(key)])
    assert again.exit_code == 2 and "exists; a key the EHR knows would be lost" in again.output
    patient = load_one(fhir, NZ)
    fhir.register_client("ebmrag", jwks)
    pulled = runner.invoke(app, ["pull", "--data-dir", str(tmp_path / "data"), "--patient", patient,
                                 "--config", str(_config(tmp_path, fhir, key, alg)), "--connection", "hospital",
                                 "--json"])
    assert pulled.exit_code == 0, pulled.output
    assert json.loads(pulled.stdout)["pulls"][0]["fragments"] == fragments_of(NZ)


def test_pull_stores_into_the_service_store_audits_and_shows_counts_only(fhir: FhirServer, tmp_path: Path) -> None:
    key, jwks = _keygen(tmp_path)
    fhir.register_client("ebmrag", jwks)
    patient = load_one(fhir, NZ)
    data = tmp_path / "data"
    first = runner.invoke(app, ["pull", "--data-dir", str(data), "--fhir-base", fhir.base, "--patient", patient,
                                "--config", str(_config(tmp_path, fhir, key))])  # the connection with this base
    assert first.exit_code == 0, first.output
    shown = " ".join(first.stdout.split())
    assert "pulled from hospital into tenant acme" in shown and "│ read │ $everything │" in shown
    count = fragments_of(NZ)
    assert f"│ fragments │ {count} │" in shown and f"│ added / changed / removed │ {count} / 0 / 0 │" in shown
    second = runner.invoke(app, ["pull", "--data-dir", str(data), "--connection", "hospital", "--patient", patient,
                                 "--config", str(_config(tmp_path, fhir, key)), "--json"])
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["pulls"][0] | {"since": "-"} == {
        "patient": patient, "connection": "hospital", "mode": "$everything", "incremental": True, "requests": 3,
        "resources_fetched": 0, "resources_kept": 108, "fragments": count, "added": 0, "changed": 0, "removed": 0,
        "unchanged": count, "record_skipped": json.loads(second.stdout)["pulls"][0]["record_skipped"], "since": "-"}
    store = open_store(data)
    record = store.record(TENANT, patient)
    assert record is not None and len(record.fragments) == count
    for fragment in record.fragments:  # the table says how much, never what
        assert fragment.text[:40] not in first.output
    pulls = [row for row in store.audit_rows() if row[5] == "pull"]
    assert [(row[2], row[3], row[4]) for row in pulls] == [("cli", TENANT, patient)] * 2
    assert json.loads(pulls[0][7]) == ["source:hospital", f"fhir:{patient}", *(f.id for f in record.fragments)]


def test_an_open_server_needs_no_client_and_a_group_is_exported(fhir: FhirServer, tmp_path: Path) -> None:
    key, jwks = _keygen(tmp_path)
    fhir.register_client("ebmrag", jwks)
    patients = [load_one(fhir, NZ), load_one(fhir, "ips_us_epic_document.json")]
    fhir.load([{"resourceType": "Group", "id": "clinic", "type": "person", "actual": True,
                "member": [{"entity": {"reference": f"Patient/{p}"}} for p in patients]}])
    exported = runner.invoke(app, ["pull", "--data-dir", str(tmp_path / "data"), "--fhir-base", fhir.base,
                                   "--tenant", "other", "--client-id", "ebmrag", "--key-file", str(key),
                                   "--allow-http", "--group", "clinic", "--json"])
    assert exported.exit_code == 0, exported.output
    report = json.loads(exported.stdout)
    assert report["tenant"] == "other" and sorted(p["patient"] for p in report["pulls"]) == sorted(patients)


@pytest.mark.parametrize(("args", "expected"), [
    (["--patient", "p1"], "give --fhir-base or --connection"),
    (["--patient", "p1", "--group", "g"], "give --patient or --group (one of them)"),
    (["--patient", "p1", "--connection", "nowhere"], "no connection 'nowhere' in [ehr.connections] (configured: none)"),
    (["--patient", "p1", "--fhir-base", "ftp://x", "--tenant", "t"], "fhir_base must be an http(s) URL"),
])
def test_bad_flags_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["pull", "--data-dir", str(tmp_path), *args])
    assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 or expected in " ".join(result.output.split())


def test_a_refused_pull_is_one_line_and_stores_nothing(fhir: FhirServer, tmp_path: Path) -> None:
    key, jwks = _keygen(tmp_path)
    fhir.register_client("ebmrag", jwks)
    fhir.load(chart(NZ))
    result = runner.invoke(app, ["pull", "--data-dir", str(tmp_path / "data"), "--patient", "nobody",
                                 "--config", str(_config(tmp_path, fhir, key)), "--connection", "hospital"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert " ".join(result.output.split()) == ("error: Patient $everything: the FHIR server refused (404 Not Found; "
                                               "issue not-found)")
    assert open_store(tmp_path / "data").record(TENANT, "nobody") is None


def test_without_the_ehr_extra_the_command_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jwt", None)  # `import jwt` now fails as if PyJWT were not installed
    result = runner.invoke(app, ["pull", "--data-dir", str(tmp_path), "--patient", "p1", "--fhir-base",
                                 "http://127.0.0.1:9/fhir"])
    assert result.exit_code == 2
    assert "ebmrag pull needs the 'ehr' extra (jwt is missing): pip install 'ebmrag[ehr]'" in " ".join(
        result.output.split())


def test_a_second_source_is_one_line_until_replace(fhir: FhirServer, tmp_path: Path) -> None:
    key, jwks = _keygen(tmp_path)
    fhir.register_client("ebmrag", jwks)
    nz, epic = load_one(fhir, NZ), load_one(fhir, "ips_us_epic_document.json")
    data, config = tmp_path / "data", _config(tmp_path, fhir, key)
    store = open_store(data)  # the service filled the store id `nz` from another FHIR patient
    pull_patient(store, load_settings(config).ehr.connection("hospital"), nz, params=QUICK, fhir_patient=epic)
    held = store.record(TENANT, nz)
    args = ["pull", "--data-dir", str(data), "--config", str(config), "--connection", "hospital", "--patient", nz]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert " ".join(refused.output.split()) == (
        "error: the patient already holds a chart pulled from another source (another FHIR server or patient id); "
        "nothing fetched (replace erases that chart and stores this one)")
    assert open_store(data).record(TENANT, nz) == held
    replaced = runner.invoke(app, [*args, "--replace", "--json"])
    assert replaced.exit_code == 0, replaced.output
    assert held is not None and json.loads(replaced.stdout)["pulls"][0]["removed"] == len(held.fragments)
    assert open_store(data).pulled_sources(TENANT, nz) == [f"{fhir.base}/Patient/{nz}"]
