"""Ingestion throughput on this machine and on a local Ray cluster with 1 and 2 embedding actors.

Run:
    python bench/ray_ingest.py --corpus ../shared/data/medquad/medquad_docs.jsonl --documents 2000 \
        --out docs/benchmarks.md

The same documents are ingested into a fresh knowledge base three ways: locally (chunking in worker
processes, embedding here), and through `RayPipeline` on a two-node Ray cluster (every node on 127.0.0.1,
one CPU each) with 1 and then 2 embedding actors. The embedding cache is off for every run (a cold cache
each time), so each run embeds every chunk. Wall time includes reading, chunking, embedding and writing;
cluster start-up and actor model loading are timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ebmrag.index.kb import KnowledgeBase, kb_embedder
from ebmrag.index.params import KnowledgeBaseConfig
from ebmrag.ingest.documents import Document
from ebmrag.ingest.readers import FieldMap, read_file
from report import emit, machine


def documents(corpus: Path, limit: int) -> list[Document]:
    return read_file(corpus, corpus.name, FieldMap(), 2**31).documents[:limit]


def run_local(docs: list[Document], workdir: Path) -> dict[str, Any]:
    config = KnowledgeBaseConfig()
    kb = KnowledgeBase(workdir / "local", config, embedder=kb_embedder(config, None))
    kb.embedder.warm_up()
    started = time.perf_counter()
    report = kb.apply(docs)
    return {"mode": "local (2 chunking processes)", "seconds": time.perf_counter() - started,
            "chunks": report.chunks_written}


def run_ray(docs: list[Document], workdir: Path, address: str, actors: int) -> dict[str, Any]:
    from ebmrag.index.distributed import RayPipeline

    config = KnowledgeBaseConfig()
    kb = KnowledgeBase(workdir / f"ray-{actors}", config, embedder=kb_embedder(config, None))
    pipeline = RayPipeline(address, config, None, actors)
    started = time.perf_counter()
    list(pipeline.run(docs[:64], config.chunker, config.contextual_prefix))  # actors load their model
    warm = time.perf_counter() - started
    started = time.perf_counter()
    report = kb.apply(docs, pipeline=pipeline)
    seconds = time.perf_counter() - started
    pipeline.close()
    return {"mode": f"Ray, {actors} actor(s)", "seconds": seconds, "chunks": report.chunks_written,
            "actor_start_s": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    docs = documents(args.corpus, args.documents)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        rows.append(run_local(docs, workdir))
        started = time.perf_counter()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                                "include_dashboard": False})
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster_start = time.perf_counter() - started
        try:
            for actors in (1, 2):
                rows.append(run_ray(docs, workdir, str(cluster.address), actors))
        finally:
            ray.shutdown()
            cluster.shutdown()  # type: ignore[no-untyped-call]
    print(json.dumps(rows))
    lines = [f"## Ray ingestion ({date.today().isoformat()})", "", machine(), "",
             f"Command: `python bench/ray_ingest.py --corpus ../shared/data/medquad/medquad_docs.jsonl --documents "
             f"{args.documents} --out docs/benchmarks.md`: {len(docs)} MedQuAD documents, a fresh knowledge base "
             f"each run, cold embedding cache. Ray: two nodes of one CPU on 127.0.0.1 (started in "
             f"{cluster_start:.0f} s).", "", "| pipeline | chunks | seconds | chunks/s | actor model load s |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['chunks']:,} | {r['seconds']:.1f} | {r['chunks'] / r['seconds']:.1f} | "
              f"{r.get('actor_start_s', 0):.1f} |" for r in rows]
    emit(args.out, "ray-ingest", lines)


if __name__ == "__main__":
    main()
