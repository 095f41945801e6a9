"""The hostile-EHR probe (issue 43): a real `ebmrag serve` pulls from a hostile FHIR server in every variant.

Run: python bench/probe_ehr.py --out docs/results/probe_ehr.md   (make probe-ehr; ~1 min)

One `ebmrag serve` process (one worker, SQLite, bench/serve.py starts it) with an EHR connection to the hostile
server of tests/ehr/hostile_server.py on 127.0.0.1, whose one patient truly has a penicillin allergy. For each
variant, `POST /v1/patients/p1/pull` ($everything and search variants) or `POST /v1/ehr/hostile/export` (Bulk
Data variants), then the stored chart's allergy line (`GET /v1/patients/p1/fragments`), then the patient erased.
Reported per variant: the answer's status, what the store holds (nothing, the allergy, the allergy line marked
"not known" / "Not read", or a wrong absence: "no allergy ... recorded"), the seconds it took; and the serve
process's resident memory before and at its high-water mark after the decompression bomb (1 GiB of gzipped zeros;
goal: growth within 2x `--limit-mb`). Goals: 0 wrong absences, 0 answers of 500 (an EHR's failure is a 502).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from report import emit, machine  # bench/ is on sys.path when a script here runs
from serve import REPO, Variant, make_key, start, stop

sys.path.insert(0, str(REPO))
from tests.ehr.hostile_server import BULK_VARIANTS, PATIENT, PULL_VARIANTS, HostileFhir

NONE_RECORDED = "no allergy or allergy statement is recorded"


def config(base: str, limit_mb: float, timeout: float) -> str:
    return (f"[serve]\nrate_per_second = 1000\nrate_burst = 1000\nprepare_charts = false\n\n"
            f"[ehr]\ntimeout_seconds = {timeout}\npull_seconds = {4 * timeout}\nmax_response_mb = {limit_mb}\n"
            f"error_retries = 0\nretries = 0\n\n"
            f'[ehr.connections.hostile]\ntenant = "probe"\nfhir_base = "{base}"\nallow_http = true\n')


def held(http: httpx.Client) -> str:
    """What the store holds of the patient's allergies."""
    answer = http.get(f"/v1/patients/{PATIENT}/fragments")
    if answer.status_code == 404:
        return "nothing stored"
    line = next((f["text"] for f in answer.json()["fragments"] if f["id"] == "summary/allergies"), "")
    if NONE_RECORDED in line:
        return "**WRONG ABSENCE**"
    if line.startswith("Allergy status: not known.") or "Not read from the FHIR server" in line:
        return "marked not known / not read"
    return "the allergy" if "penicillin" in line else f"other: {line[:60]}"


def high_water_mb(pid: int) -> tuple[float, float]:
    """(resident now, resident high-water mark) of a process, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def probe(limit_mb: float, timeout: float) -> tuple[list[dict[str, Any]], dict[str, float]]:
    rows: list[dict[str, Any]] = []
    memory: dict[str, float] = {}
    variant = Variant("this tree", REPO / "src", 1)
    with tempfile.TemporaryDirectory() as folder, HostileFhir() as fhir:
        data = Path(folder)
        (data / "ebmrag.toml").write_text(config(fhir.base, limit_mb, timeout), encoding="utf-8")
        key = make_key(variant, data, "admin", "probe")  # it pulls, and erases the patient between variants
        server = start(variant, data, data / "ebmrag.toml")
        try:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
                for name in (*PULL_VARIANTS, *BULK_VARIANTS):
                    fhir.variant = name
                    send: Callable[[], httpx.Response] = (
                        (lambda: http.post("/v1/ehr/hostile/export", json={"group": "g1"})) if name.startswith("bulk")
                        else (lambda: http.post(f"/v1/patients/{PATIENT}/pull", json={"connection": "hostile"})))
                    if name == "bomb":
                        memory["before"] = high_water_mb(server.process.pid)[0]
                    started = time.monotonic()
                    answer = send()
                    seconds = time.monotonic() - started
                    if name == "bomb":
                        memory["high_water"] = high_water_mb(server.process.pid)[1]
                    detail = answer.json().get("detail", "") if answer.status_code >= 400 else ""
                    rows.append({"variant": name, "status": answer.status_code, "held": held(http),
                                 "seconds": seconds, "detail": str(detail).split(": ", 1)[-1][:110]})
                    if http.delete(f"/v1/patients/{PATIENT}").status_code not in (200, 404):
                        raise SystemExit("erasing the patient between variants failed")
        finally:
            stop(server)
    return rows, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-mb", type=float, default=64.0, help="[ehr] max_response_mb")
    parser.add_argument("--timeout", type=float, default=2.0, help="[ehr] timeout_seconds (pull_seconds: 4x)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows, memory = probe(args.limit_mb, args.timeout)
    wrong = sum(r["held"] == "**WRONG ABSENCE**" for r in rows)
    errors = sum(r["status"] >= 500 and r["status"] not in (502, 504) for r in rows)
    growth = memory["high_water"] - memory["before"]
    lines = [f"# Hostile-EHR probe, {date.today().isoformat()}", "",
             f"{machine()}. Command: `python bench/probe_ehr.py --limit-mb {args.limit_mb:g} --timeout "
             f"{args.timeout:g} --out docs/results/probe_ehr.md` (`make probe-ehr`).", "",
             f"**{wrong} wrong absences** in {len(rows)} variants; **{errors} answers of 5xx other than 502/504** "
             "(502: the EHR failed, nothing stored); the decompression bomb (1 GiB of zeros as ~1 MB of gzip): "
             f"resident memory {memory['before']:.0f} MiB before, high-water {memory['high_water']:.0f} MiB after, "
             f"growth **{growth:.0f} MiB** for a {args.limit_mb:g} MB limit (goal: within 2x).", "",
             "| variant | answer | the store holds | seconds | why (the problem's detail) |", "|---|---|---|---|---|",
             *(f"| {r['variant']} | {r['status']} | {r['held']} | {r['seconds']:.2f} | {r['detail']} |"
               for r in rows)]
    emit(None, "probe-ehr", lines)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if wrong or errors or growth > 2 * args.limit_mb:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
