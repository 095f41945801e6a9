"""Three simulated specialist models report while a clinician asks (the EBM-Pack paper's gateway, §1).

Run: make gateway-demo    (or: python examples/gateway_demo.py [--broker redis://127.0.0.1:6379/0])

A service with a temporary SQLite store holds the bundled colon-surgery patient. A pathology model, a
CT model and an ECG model each announce a result (status "pending") and deliver it after their own
delay, on Redis Streams when a broker answers, else through POST /v1/results (no broker needed). The
clinician asks three times: at once (the results are pending), then with wait_ms (the answer waits for
what is due), and the trace shows which results reached the context.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from ebmrag.demo import demo_record_paths
from ebmrag.serve.app import create_app
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore

PRODUCERS = (("pathology", "slide-model 2.1", 1.0, "Frozen section of the pericolic node: metastatic adenocarcinoma."),
             ("imaging", "ct-recon 4.0", 2.0, "CT abdomen: 4 cm rim-enhancing collection beside the anastomosis."),
             ("ecg", "ecg-classifier 1.3", 3.5, "ECG: sinus tachycardia 112/min, QTc 430 ms, no ischaemic change."))


def announce(kind: str, producer: str, text: str, status: str) -> dict[str, Any]:
    return {"tenant": "demo", "patient_id": "colon", "result_id": f"{kind}-1", "kind": kind, "producer": producer,
            "produced_at": datetime.now(UTC).isoformat(), "status": status,
            **({"text": text} if status == "final" else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        store = SQLiteStore(Path(data) / "store.sqlite")
        key = create_key(store, "demo", "service")[0]
        server = uvicorn.Server(uvicorn.Config(create_app(store), host="127.0.0.1", port=0, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        colon = next(p for p in demo_record_paths() if "colon" in p.name)
        http.put("/v1/patients/colon", content=colon.read_bytes(), headers={"Content-Type": "application/json"})
        send = _sender(args.broker, store, http)
        question = "Why is he febrile after the colectomy, and what does that change?"
        http.post("/v1/patients/colon/ask", json={"question": question})  # load the model before the clock starts
        for kind, producer, _, text in PRODUCERS:
            send(announce(kind, producer, text, "pending"))
        for kind, producer, delay, text in PRODUCERS:
            threading.Timer(delay, send, args=(announce(kind, producer, text, "final"),)).start()
        for label, wait_ms in (("asked at once", 0), ("asked again, waiting up to 2.5 s", 2500),
                               ("asked once more, waiting up to 5 s", 5000)):
            trace = http.post("/v1/patients/colon/ask", json={"question": question, "wait_ms": wait_ms}).json()["trace"]
            used = [p["id"] for p in trace["packed"] if str(p["id"]).startswith("result:")]
            pending = [p["id"] for p in trace["pending_results"]]
            print(f"{label}: waited {trace['waited_ms']} ms; results in the context: {used or 'none'}; "
                  f"still pending: {pending or 'none'}")
        server.should_exit = True


def _sender(broker: str, store: SQLiteStore, http: httpx.Client) -> Any:
    """Publish on Redis Streams with a consumer running, or POST to the service when no broker answers."""
    try:
        import redis

        redis.Redis.from_url(broker, socket_connect_timeout=1).ping()
    except Exception:
        print("no Redis broker answered: results go through POST /v1/results")
        return lambda message: http.post("/v1/results", json=message)
    from ebmrag.gateway.consumer import ResultConsumer
    from ebmrag.gateway.publish import publish
    from ebmrag.store.results import parse_message

    stream = f"demo:{time.time_ns()}"
    consumer = ResultConsumer(store, broker, stream, block_ms=50)
    threading.Thread(target=consumer.run, kwargs={"handle_signals": False}, daemon=True).start()
    print(f"results go through Redis Streams ({broker}, stream {stream})")
    return lambda message: publish(broker, [parse_message(message)], stream)


if __name__ == "__main__":
    main()
