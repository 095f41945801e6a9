"""End-to-end latency of `ask` (extractive backend) on a 100k-chunk knowledge base, model load excluded.

Run (after `make retrieval` built the LiveQA KB):
    python bench/ask.py --base-kb /tmp/kb-liveqa --size 100000 --data-root ../shared/data --out docs/benchmarks.md

The knowledge base is scaled from the real one as in bench/retrieval.py (real chunk texts and
vectors, repeated with noise) and opened with the real bundled model for query embedding. Patients
are the first AgentClinic MedQA cases and the bundled demo records. Each patient is asked two
different questions with retrieval forced on (the slow path: every A/B sentence votes with 100
chunks). Half the patients are asked "cold" (the record's fragments and query sentences are
embedded during the ask), half "prepared" (`Engine.prepare` embedded them when the chart was
opened, untimed); the second question is a follow-up about the same patient. Stage medians show
where the time goes.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from ebmrag.answer.engine import Engine
from ebmrag.compose import build_engine, load_patient
from ebmrag.config import Settings, with_overrides
from ebmrag.demo import demo_record_paths
from ebmrag.records.fragment import PatientRecord
from ebmrag.records.loaders import load_records
from report import write_section  # bench/ is on sys.path when a script here runs
from retrieval import build_scaled_kb  # bench/ is on sys.path when this script runs

QUESTIONS = ("What is the most likely diagnosis, and what should be done next?",
             "Which findings argue against the leading diagnosis, and which drugs must be avoided?")


def patients(data_root: Path, cases: int) -> list[PatientRecord]:
    clinic = load_records(data_root / "agentclinic" / "agentclinic_medqa_extended_shared.jsonl")[:cases]
    return [*clinic, *(load_patient(p) for p in demo_record_paths())]


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


def measure(engine: Engine, records: list[PatientRecord], window: int) -> dict[str, Any]:
    """Half the patients are asked cold, half after `Engine.prepare`; each then gets a follow-up question."""
    buckets: dict[str, list[float]] = {"cold": [], "prepared": [], "follow-up": []}
    stages: dict[str, list[float]] = {}
    for index, record in enumerate(records):
        first = "cold" if index % 2 == 0 else "prepared"
        if first == "prepared":
            engine.prepare(record)
        for question, bucket in zip(QUESTIONS, (first, "follow-up"), strict=True):
            started = time.perf_counter()
            result = engine.ask(question, record, prompt_window=window)
            buckets[bucket].append((time.perf_counter() - started) * 1000)
            for name, ms in result.timings_ms.items():
                stages.setdefault(f"{bucket} {name}", []).append(ms)
    return {**buckets, "stages": {k: statistics.median(v) for k, v in stages.items()},
            "fragments": statistics.median(len(r.fragments) for r in records)}


def markdown(size: int, window: int, n: int, m: dict[str, Any]) -> str:
    row = "| {} | {:.1f} | {:.1f} | {:.1f} |"
    lines = [f"## `ask` end to end (extractive backend), {date.today().isoformat()}", "",
             f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}. "
             f"Knowledge base: {size:,} chunks (scaled LiveQA, hybrid, HNSW). {n} patients (AgentClinic MedQA + "
             f"demo records, median {m['fragments']:.0f} fragments), retrieval forced on, window {window}. "
             "Model load excluded.", "",
             f"Command: `python bench/ask.py --base-kb KB --size {size} --data-root ../shared/data`", "",
             "| ask | p50 ms | p95 ms | max ms |", "|---|---|---|---|",
             *(row.format(label, percentile(m[key], 50), percentile(m[key], 95), max(m[key])) for key, label in (
                 ("cold", "cold: first question, record never seen"),
                 ("prepared", "prepared: first question after `Engine.prepare(record)`"),
                 ("follow-up", "follow-up: a second question about the same patient"))), "",
             "Stage medians (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(m["stages"].items())), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-kb", type=Path, required=True)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--kb", type=Path, help="reuse a scaled KB built earlier (else built in a temp folder)")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.kb or Path(scratch) / "kb"
        if not (root / "CURRENT").exists():
            build_scaled_kb(args.base_kb, args.size, root)
        # A fresh embedding cache, so "cold" is cold: nothing from an earlier run is on disk.
        settings = with_overrides(Settings(), models={"cache_dir": str(Path(scratch) / "cache")},
                                  answer={"retrieval": "always"})
        engine = build_engine(settings, root)
        engine.warm_up()
        print(f"one embedder shared by packer and knowledge base: {engine.shares_embedder}")
        records = patients(args.data_root, args.cases)
        engine.ask("warm-up question about the model", records[-1])  # loads lazy parts, not counted
        result = measure(engine, records[:-1], args.window)
    text = markdown(args.size, args.window, len(records) - 1, result)
    print(text)
    print(json.dumps({k: v for k, v in result.items() if k != "stages"}))
    if args.out:
        write_section(args.out, "ask", text)


if __name__ == "__main__":
    main()
