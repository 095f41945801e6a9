"""Patient isolation under random traffic: every response to every key holds no other patient's marker.

Run: python bench/isolation.py --requests 10000 --out docs/benchmarks.md

Tenants × patients, each record planted with unique marker strings; each key is a clinician limited to
its own patient (plus one tenant-wide clinician key per tenant). Random keys send random requests — ask,
pack, fragments, search and the /ui patient page — for random patients, including other tenants' and
patients that do not exist. A leak is any response containing a marker of a patient the key may not see;
a wrong status is any answer other than 200 for a visible patient and 404 for the rest.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections import Counter
from datetime import date
from pathlib import Path

import httpx
import uvicorn

from ebmrag.config import ServeSettings, Settings
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from report import emit, machine  # bench/ is on sys.path when a script here runs

TENANTS, PATIENTS = ("ta", "tb", "tc"), ("p1", "p2", "p3", "p4")


def record(marker: str, patient: str) -> dict[str, object]:
    return {"patient_id": patient, "fragments": [
        {"id": "path", "text": f"Biopsy {marker} shows adenocarcinoma.", "section": "Pathology"},
        {"id": "lab", "text": f"Creatinine 1.4 mg/dL, sample {marker}.", "section": "Labs"},
        {"id": "allergy", "text": f"Penicillin anaphylaxis, band {marker}.", "section": "Allergies"}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = random.Random(20261122)
    with tempfile.TemporaryDirectory() as data:
        store = SQLiteStore(Path(data) / "store.sqlite")
        settings = Settings(serve=ServeSettings(rate_per_second=1e6, rate_burst=10**6))
        app = create_app(store, settings)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        markers = {(t, p): f"MRK{t}{p}{rng.randrange(10**6):06d}" for t in TENANTS for p in PATIENTS}
        keys: list[tuple[str, tuple[str, ...], str]] = []
        for tenant in TENANTS:
            feed = create_key(store, tenant, "service")[0]
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {feed}"}, timeout=120) as http:
                for patient in PATIENTS:
                    http.put(f"/v1/patients/{patient}", json=record(markers[(tenant, patient)], patient))
            keys += [(tenant, (p,), create_key(store, tenant, "clinician", (p,))[0]) for p in PATIENTS]
            keys.append((tenant, PATIENTS, create_key(store, tenant, "clinician")[0]))
        leaks, wrong, routes = 0, 0, Counter[str]()
        started = time.monotonic()
        clients = {key: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                                     cookies={"ebmrag_key": key}) for _, _, key in keys}
        for _ in range(args.requests):
            tenant, visible, key = rng.choice(keys)
            asked = rng.choice([*PATIENTS, "p9"])
            route = rng.choice(["ask", "pack", "fragments", "search", "ui"])
            routes[route] += 1
            http = clients[key]
            if route == "ask":
                response = http.post(f"/v1/patients/{asked}/ask", json={"question": "Which antibiotic is safe?"})
            elif route == "pack":
                response = http.post(f"/v1/patients/{asked}/pack", json={"query": "biopsy?", "window": 256})
            elif route == "fragments":
                response = http.get(f"/v1/patients/{asked}/fragments")
            elif route == "search":
                response = http.post("/v1/search", json={"query": f"penicillin {asked}", "k": 5})
            else:
                response = http.get(f"/ui/patients/{asked}")
            seen = {(tenant, p) for p in visible}
            leaks += any(m in response.text for owner, m in markers.items() if owner not in seen)
            expected = 200 if route == "search" or asked in visible else 404
            wrong += response.status_code != expected
        elapsed = time.monotonic() - started
        for client in clients.values():
            client.close()
        server.should_exit = True
    lines = [f"## Patient isolation under random traffic, {date.today().isoformat()}", "",
             f"{machine()}. Command: "
             f"`python bench/isolation.py --requests {args.requests} --out docs/benchmarks.md`.", "",
             f"{len(TENANTS)} tenants × {len(PATIENTS)} patients with unique markers, {len(keys)} keys; "
             f"{args.requests:,} random requests ({', '.join(f'{r} {n:,}' for r, n in sorted(routes.items()))}) "
             f"in {elapsed:.0f} s: **{leaks} leaks**, {wrong} wrong statuses."]
    emit(args.out, "isolation", lines)


if __name__ == "__main__":
    main()
