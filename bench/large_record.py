"""Large records (issue 18.10): `pack` of a 20,000-fragment record, cold and with stored embeddings, and the
memory of the exact solver at W = 200,000 with 2,000 fragments.

Run: python bench/large_record.py --out docs/benchmarks.md

"Stored" is the cache directory (`[models] cache_dir`): a second `pack` of the same record reads the
vectors, tier decisions and compressed states instead of computing them. Run with the pre-filter off
and on (packing.prefilter; its quality cost is bench/prefilter_quality.py). The record is synthetic:
varied note sentences with numbers, so tiers, compression and copy-forward collapse all have work to do.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import tracemalloc
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from ebmrag.compose import Resources, build_packer, build_tiering
from ebmrag.config import Settings, with_overrides
from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.params import PackingParams
from ebmrag.records.fragment import Fragment, PatientRecord
from report import emit, machine  # bench/ is on sys.path when a script here runs

Parts = tuple[Tiering, ContextPacker]  # the tiering step and the packer it feeds
TEMPLATES = ("Potassium {a}.{b} mmol/L on the {w} panel.", "Creatinine {a}.{b} mg/dL, urea {c} mmol/L.",
             "Patient resting, observations stable, pain score {b} of 10.",
             "CT chest shows a {a} mm nodule in the {s} lobe.",
             "Biopsy of the {s} breast: ductal carcinoma, grade {g}.", "Seen by physiotherapy, walked {c} metres.",
             "Hives and throat swelling after cefuroxime in 20{c}.", "Blood pressure {c}0/{a}0 mmHg, pulse {c}.")


def record(n: int, seed: int = 3) -> PatientRecord:
    rng = random.Random(seed)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    fragments = []
    for i in range(n):
        text = rng.choice(TEMPLATES).format(a=rng.randint(2, 9), b=rng.randint(0, 9), c=rng.randint(10, 99),
                                            g=rng.randint(1, 3), w=rng.choice(["morning", "evening"]),
                                            s=rng.choice(["left", "right"]))
        fragments.append(Fragment(f"f{i}", "p", f"{text} Note {i}.", "Notes", start + timedelta(hours=i)))
    return PatientRecord("p", tuple(fragments))


def packer_over(cache: str, prefilter_windows: float = PackingParams().prefilter_windows) -> Parts:
    """The tiering step and a packer as a new process builds them: new models over the cache directory `cache`
    (pre-filter windows 0: off, every fragment measured)."""
    settings = with_overrides(Settings(), models={"cache_dir": cache}, packing={"prefilter_windows": prefilter_windows})
    resources = Resources(settings)
    return build_tiering(resources), build_packer(resources)


def timed_pack(parts: Parts, patient: PatientRecord, window: int) -> float:
    """Seconds to tier and pack `patient` (the tier decisions are part of what a pack of a new chart costs)."""
    tiering, packer = parts
    started = time.perf_counter()
    packer.run(tiering.run(patient), "Which antibiotic is safe given his allergy and kidney function?", window)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fragments", type=int, default=20_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    big = record(args.fragments)
    rows = []
    for label, prefilter in (("pre-filter off (every fragment measured)", 0.0),
                             ("pre-filter on (the default)", PackingParams().prefilter_windows)):
        with tempfile.TemporaryDirectory() as cache:
            cold_parts = packer_over(cache, prefilter)
            cold_parts[1].warm_up()
            cold = timed_pack(cold_parts, big, 2048)
            stored_parts = packer_over(cache, prefilter)  # a new process: the cache on disk
            stored_parts[1].warm_up()
            stored = timed_pack(stored_parts, big, 2048)
            rows.append(f"| {label} | {cold:.1f} | {stored:.1f} |")
    with tempfile.TemporaryDirectory() as cache:
        parts = packer_over(cache)
        medium = record(2000, seed=4)
        parts[1].run(parts[0].run(medium), "warm", 256)
        tracemalloc.start()
        wide = timed_pack(parts, medium, 200_000)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    lines = [f"## Large records (`pack`), {date.today().isoformat()}", "",
             f"{machine()}. "
             "Command: `python bench/large_record.py --out docs/benchmarks.md`.", "",
             f"{args.fragments:,} fragments, W = 2,048; \"stored\": a second packer over the same cache directory "
             "(vectors, tier decisions and compressed states on disk), as a new process would find it.", "",
             "| packer | cold s | stored s |", "|---|---|---|", *rows, "",
             f"2,000 fragments, W = 200,000 (stored): {wide:.1f} s, peak traced memory {peak:.0f} MB."]
    emit(args.out, "large-record", lines)


if __name__ == "__main__":
    main()
