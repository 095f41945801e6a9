"""An EHR calls ebmrag's CDS Hooks service: discovery, an order-select of amoxicillin for a patient whose chart
records a penicillin anaphylaxis, the cards it answers, and feedback on one of them (docs/ehr.md#cds-hooks).

Run it alone: python examples/cds_hooks_local.py
    starts a service on a temporary SQLite store, trusting a key pair it makes for a pretend EHR, and prints what
    an EHR would see, then the audit log's rows.
Or against your own `ebmrag serve` ([cds] enabled, base_url the URL given here, the EHR's issuer configured as
docs/ehr.md shows):
    python examples/cds_hooks_local.py --make-keys ./ehr-keys      # the EHR's private key and public JWK Set
    python examples/cds_hooks_local.py --url http://127.0.0.1:8080 --keys ./ehr-keys
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jwt
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from ebmrag.cds.params import CdsParams
from ebmrag.config import Settings
from ebmrag.serve.app import create_app
from ebmrag.store.patients import SQLiteStore

ISS, KID = "https://ehr.example.org/", "ehr-example-es384"
PATIENT = {"resourceType": "Patient", "id": "demo-4471", "gender": "female", "birthDate": "1968-03-02"}
ALLERGY = {"resourceType": "AllergyIntolerance", "id": "pcn-1", "patient": {"reference": "Patient/demo-4471"},
           "clinicalStatus": {"coding": [{"code": "active"}]},
           "verificationStatus": {"coding": [{"code": "confirmed"}]}, "criticality": "high",
           "code": {"text": "Penicillin"}, "onsetDateTime": "2019-04-17",
           "reaction": [{"manifestation": [{"text": "Anaphylaxis"}], "severity": "severe"}]}
ORDER = {"resourceType": "MedicationRequest", "id": "amox-1", "status": "draft", "intent": "order",
         "subject": {"reference": "Patient/demo-4471"},
         "medicationCodeableConcept": {"text": "amoxicillin 500 MG Oral Capsule"}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_keys(folder: Path) -> None:
    """The EHR's side: a P-384 key (ES384) kept private, and the JWK Set ebmrag is given (`jwks_file`)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    (folder / "private.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    (folder / "private.pem").chmod(0o600)
    public = json.loads(ECAlgorithm.to_jwk(key.public_key())) | {"kid": KID, "alg": "ES384", "use": "sig"}
    (folder / "jwks.json").write_text(json.dumps({"keys": [public]}, indent=2))


def signed(folder: Path, audience: str) -> str:
    """A CDS client's JWT for one call: iss, aud (the endpoint called), a short exp, iat and a fresh jti."""
    key = serialization.load_pem_private_key((folder / "private.pem").read_bytes(), password=None)
    now = int(time.time())
    claims = {"iss": ISS, "aud": audience, "exp": now + 120, "iat": now, "jti": str(uuid.uuid4())}
    return jwt.encode(claims, key, algorithm="ES384", headers={"kid": KID, "typ": "JWT"})  # type: ignore[arg-type]


def order_select() -> dict[str, Any]:
    searchset = {"resourceType": "Bundle", "type": "searchset", "entry": [{"resource": ALLERGY}]}
    empty = {"resourceType": "Bundle", "type": "searchset", "entry": []}
    return {"hook": "order-select", "hookInstance": str(uuid.uuid4()),
            "context": {"userId": "Practitioner/example", "patientId": "demo-4471",
                        "selections": ["MedicationRequest/amox-1"],
                        "draftOrders": {"resourceType": "Bundle", "entry": [{"resource": ORDER}]}},
            "prefetch": {"patient": PATIENT, "allergies": searchset, "conditions": empty, "observations": empty}}


def call(base: str, keys: Path) -> list[dict[str, Any]]:
    services = httpx.get(f"{base}/cds-services").json()["services"]
    print("services:", ", ".join(f"{s['id']} ({s['hook']})" for s in services))
    url = f"{base}/cds-services/ebmrag-order-select"
    answer = httpx.post(url, json=order_select(), headers={"Authorization": f"Bearer {signed(keys, url)}"})
    answer.raise_for_status()
    cards: list[dict[str, Any]] = answer.json()["cards"]
    for card in cards:
        print(f"\n[{card['indicator']}] {card['summary']}\n{card['detail']}")
    if cards:
        feedback = {"feedback": [{"card": cards[0]["uuid"], "outcome": "overridden",
                                  "outcomeTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}
        url += "/feedback"
        httpx.post(url, json=feedback, headers={"Authorization": f"Bearer {signed(keys, url)}"}).raise_for_status()
        print("\nfeedback sent: overridden")
    return cards


def alone() -> None:
    with tempfile.TemporaryDirectory() as folder:
        keys = Path(folder) / "ehr-keys"
        make_keys(keys)
        issuer = {"iss": ISS, "tenant": "demo", "jwks_file": str(keys / "jwks.json")}
        base = f"http://127.0.0.1:{free_port()}"  # [cds] base_url: the URL the EHR calls, which its JWTs' aud names
        settings = Settings()
        settings = replace(settings, serve=replace(settings.serve, prepare_charts=False),
                           cds=CdsParams(enabled=True, base_url=base, issuers={"example-ehr": issuer}))
        store = SQLiteStore(Path(folder) / "store.sqlite")
        server = uvicorn.Server(uvicorn.Config(create_app(store, settings), host="127.0.0.1",
                                               port=int(base.rsplit(":", 1)[1]), log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        call(base, keys)
        print("\naudit log (key, tenant, patient, action, fragment ids):")
        for row in store.audit_rows():
            print("  ", row[2], row[3], row[4] or "-", row[5], row[7])
        server.should_exit = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make-keys", type=Path, help="write the EHR's private.pem and jwks.json here and stop")
    parser.add_argument("--url", help="a running ebmrag serve (default: start one here)")
    parser.add_argument("--keys", type=Path, help="with --url: the folder --make-keys wrote")
    args = parser.parse_args()
    if args.make_keys:
        make_keys(args.make_keys)
        print(f"wrote {args.make_keys / 'private.pem'} (keep it) and {args.make_keys / 'jwks.json'} (give it to "
              "ebmrag: [cds.issuers.<name>] jwks_file)")
    elif args.url:
        if args.keys is None:
            parser.error("--url needs --keys (the folder --make-keys wrote)")
        call(args.url.rstrip("/"), args.keys)
    else:
        alone()


if __name__ == "__main__":
    main()
