"""The probe suite of issue 32 (bench/probe_service.py) in a quick form: every class of hostile input, a small
sample of each, against a real server on SQLite and PostgreSQL (uvicorn in this process, with MCP over HTTP
beside it on the same store), and the probe's own checks on answers made up to fail them.

`make probe` runs the whole suite against `ebmrag serve` processes; this slice keeps it from rotting and
fails as soon as one class finds a 5xx, a leak, an unaudited refusal or a broken defence.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ebmrag.compose import ServiceParts
from ebmrag.config import Settings
from ebmrag.serve.service import Service
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore
from tests.serve.conftest import Live, running, serving

BENCH = Path(__file__).resolve().parents[2] / "bench"
SERVE = {"rate_per_second": 1e6, "rate_burst": 10**6, "request_seconds": 4.0, "max_body_mb": 1.0}


@pytest.fixture(scope="module")
def probe() -> Iterator[ModuleType]:
    """bench/probe_service.py and its sibling modules (bench/ is a folder of scripts, not a package)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("probe_service")
    finally:
        sys.path.remove(str(BENCH))


def _kit(probe: ModuleType) -> Any:
    return sys.modules["probe_kit"]


def test_the_checks_catch_what_they_are_for(probe: ModuleType) -> None:
    """A 5xx, an error that is not problem+json, a traceback and another patient's marker are each a failure;
    a proper refusal is remembered for the audit and is not one."""
    kit = _kit(probe)
    run = kit.Run("unit", 10)
    run.plant("MRKsecret", "tenant-a", "p2")
    problem = b'{"type": "x/not-found", "title": "not found", "status": 404, "detail": "no such patient"}'
    good = kit.Reply("GET", "/v1/patients/p2", 404, {"content-type": "application/problem+json",
                                                     "x-request-id": "r1"}, problem, 0.0)
    assert run.check(good, "c", "refused", None, {404}) and run.refusals[0].request_id == "r1"
    for status, headers, body, expected in [
        (500, {"content-type": "application/problem+json"}, problem.replace(b"404", b"500"), "5xx"),
        (422, {"content-type": "application/json"}, b'{"detail": "x"}', "not application/problem+json"),
        (400, {"content-type": "text/plain"}, b'Traceback (most recent call last):\n  File "/x.py"', "traceback"),
        (200, {"content-type": "application/json"}, b'{"text": "band MRKsecret"}', "leak"),
    ]:
        assert not run.check(kit.Reply("GET", "/v1/x", status, headers, body, 0.0), "c", expected, None)
        assert expected in run.failures[-1].problem, run.failures[-1]
    assert run.leaks["c"] == 1 and run.server_errors["c"] == 1


def test_the_inputs_are_variants_not_examples(probe: ModuleType) -> None:
    inputs = sys.modules["probe_inputs"]
    tricks = dict(inputs.id_tricks("p2", "tenant-a"))
    assert tricks["traversal-literal"] == b"p1/../p2" and tricks["nul"] == b"p2%00" and len(tricks) >= 30
    observation = dict(inputs.mutations(inputs.OBSERVATION))
    assert {"valueQuantity='x'", "component=5", "valueQuantity.value=None", "code.coding[0]={}"} <= set(observation)
    assert observation["valueQuantity='x'"]["valueQuantity"] == "x"
    study = dict(inputs.mutations(inputs.IMAGING_STUDY))
    assert study["series=5"]["series"] == 5
    variants = inputs.injection_variants(lambda n: f"M{n}")
    assert len(variants) == len(inputs.PAYLOADS) * len(inputs.DISGUISES)
    assert all(marker in sentence for _, sentence, marker in variants)
    assert any("\u200b" in s for _, s, _ in variants) and any("\u0435" in s for _, s, _ in variants)


def _target(probe: ModuleType, live: Live, store: PatientStore, settings: Settings, mcp_url: str,
            mcp_service: Service) -> Any:
    """The in-process server as the probe sees a running one (its RSS is this process's; the audit chain's
    own check is `ebmrag audit verify`, run by `make probe`; the bursts of 429s are summarised at once, as
    stopping the servers would)."""
    kit = _kit(probe)

    def settle() -> None:
        for service in (live.app.state.service, mcp_service):
            service.throttled.flush(everything=True)

    def revoke(key: str) -> None:
        assert store.revoke(key.split("_")[1])

    return kit.Target(
        url=live.url, backend=store.backend,
        new_key=lambda tenant, role, patients: create_key(store, tenant, role, patients)[0],
        revoke=revoke, audit_rows=store.audit_rows,
        rss_mb=lambda: kit.rss_of("self"), request_seconds=settings.serve.request_seconds,
        max_body_mb=settings.serve.max_body_mb, kb_admin_tenant=settings.serve.kb_admin_tenant, mcp_url=mcp_url,
        settle=settle)


@pytest.mark.model
def test_a_sample_of_every_class_finds_nothing(probe: ModuleType, store: PatientStore, tmp_path: Path,
                                               resources: Any, context_packer: Any, embedder: Any) -> None:
    """Two variants of each list of each class (the full run is `make probe`). The knowledge base is the
    server's own, so the probe's uploads and deletions never touch the session's demo knowledge base."""
    from ebmrag.answer.engine import AnswerParams
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.retrieve.vote import DocumentVoter
    from ebmrag.serve.mcp import http_app
    from tests.engines import engine_from_parts, over_knowledge_base, rrf_retriever

    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    engine = engine_from_parts(resources, AnswerParams(retrieval="never"), packer=context_packer,
                               voter=DocumentVoter(rrf_retriever(kb)))
    own = over_knowledge_base(resources, kb)
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, **SERVE))
    mcp_service = Service(store, settings, ServiceParts(settings, own, engine))
    with running(store, engine, own, **SERVE) as live, serving(http_app(mcp_service)) as (mcp_url, _):
        run = _kit(probe).Run(store.backend, 40.0, sample=2, huge_mb=12)
        probe.run_suite(_target(probe, live, store, settings, f"{mcp_url}/mcp", mcp_service), run)
    assert all(run.probes[klass] > 0 for klass, _, _ in probe.SUITE), run.probes
    assert "rss" in run.measures and "audit" in run.measures
    assert not run.failures, f"{len(run.failures)} failures:\n" + "\n".join(
        f"{f.klass} / {f.probe}: {f.problem} ({f.status}) {f.snippet[:120]}" for f in run.failures[:40])
