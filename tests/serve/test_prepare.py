"""Charts prepared when they are written (issue 33, item 3): a stored chart is embedded, tiered and compressed in the
background after the write, so its asks embed no fragment; an append prepares only what is new; erasure during
preparation leaves nothing behind; and another tenant's preparation does not delay an ask.

Before: an ask embedded the whole stored chart at question time (a cold ask on 3,000 fragments took a minute).
Real servers over SQLite and PostgreSQL (conftest.py); "embedded" is counted through the embedders' public API: a
text handed to `embed` that had no cached vector at that moment.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from ebmrag.evidence.entities import EntityCompressor, default_extractor
from ebmrag.gateway.consumer import ResultConsumer
from ebmrag.gateway.publish import publish
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.records.loaders import record_from_json
from ebmrag.serve.prepare import ChartPreparer
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore
from ebmrag.store.results import ResultMessage
from ebmrag.text.sentences import split_sentences
from tests.serve.conftest import Live, demo_engine

REDIS_URL = os.environ.get("EBMRAG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")  # as tests/gateway's
QUESTION = "What is the current treatment plan for this patient?"
SECTIONS = ("Notes", "Labs", "Medications", "Allergies", "Assessment")
# Chart sizes (issue 44: the smallest that still show the effect; each fragment costs ~0.06 s of embedding alone):
# a cold ask of CHART fragments is many times a prepared one's; one of BACKGROUND fragments is still being prepared
# after several asks beside it; one of TWO_BATCHES spans more than one preparation job (prepare.BATCH), so an
# erasure during its first job leaves work still to come.
CHART, BACKGROUND, TWO_BATCHES = 80, 200, 150


def chart(patient: str, tag: str, n: int, start: int = 0) -> dict[str, Any]:
    """`n` distinct fragments naming `tag` (so the cache files can be searched for it) in sentences the entity
    compression keeps."""
    fragments = [{"id": f"f{i}", "section": SECTIONS[i % len(SECTIONS)],
                  "timestamp": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T08:00:00Z",
                  "text": f"Allergy: penicillin causes rash ({tag} chart {i}). Started metformin {100 + i} mg twice "
                          f"daily; creatinine {1 + (i % 30) / 10:.1f} mg/dL. Patient tolerating well, follow up in "
                          f"{1 + i % 8} weeks."} for i in range(start, start + n)]
    return {"patient_id": patient, "fragments": fragments}


def texts_of(record: dict[str, Any]) -> list[str]:
    return [f["text"] for f in record["fragments"]]


def derived_texts(texts: Sequence[str]) -> set[str]:
    """Every text an ask or a preparation may embed for these fragments: the texts, their sentences, their compressed
    states (computed here without touching any cache)."""
    states = [c.text for c in EntityCompressor(default_extractor()).compress_many(list(texts)) if c.text]
    return {*texts, *states, *(s.text for t in texts for s in split_sentences(t))}


class Encoded:
    """The texts the given embedders computed a vector for (not served from their caches), through `embed`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, embedders: Iterable[SentenceEmbedder]) -> None:
        self.texts: list[str] = []
        self._lock = threading.Lock()
        for embedder in {id(e): e for e in embedders}.values():
            monkeypatch.setattr(embedder, "embed", self._counting(embedder, embedder.embed))

    def _counting(self, embedder: SentenceEmbedder, embed: Callable[[Sequence[str]], Any]) -> Callable[..., Any]:
        def counted(texts: Sequence[str]) -> Any:
            fresh = [t for t in dict.fromkeys(texts) if not embedder.cached([t])]
            with self._lock:
                self.texts += fresh
            return embed(texts)
        return counted

    def of(self, texts: Sequence[str]) -> list[str]:
        """The computed texts that came from these fragments."""
        derived = derived_texts(texts)
        return [t for t in self.texts if t in derived]


def embedders_of(live: Live) -> list[SentenceEmbedder]:
    engine = live.app.state.service.engine()
    found = [engine.packer.embedder, engine.grounding.embedder]
    if engine.voter is not None:
        found.append(engine.voter.embedder)
    return found


def prepared(live: Live, feed: Any, patient: str) -> int:
    listing = feed.get(f"/v1/patients/{patient}/fragments")
    assert listing.status_code == 200, listing.text
    return int(listing.json()["prepared_fragments"])


def settle(live: Live, seconds: float = 300) -> None:
    assert live.app.state.service.preparer.wait_idle(seconds), "the preparation did not end"


def timed_ask(client: Any, patient: str) -> float:
    started = time.perf_counter()
    answer = client.post(f"/v1/patients/{patient}/ask", json={"question": QUESTION})
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started


def _held_until(monkeypatch: pytest.MonkeyPatch, preparer: ChartPreparer, release: threading.Event) -> None:
    """`preparer` starts no preparation before `release` is set (or a minute has passed): a PUT that waited for
    its chart's preparation would come back after that minute, the chart prepared."""
    prepare = preparer._prepare

    def held(tenant: str, patient: str) -> None:
        release.wait(60)
        prepare(tenant, patient)
    monkeypatch.setattr(preparer, "_prepare", held)


def test_a_prepared_chart_is_asked_without_embedding_a_fragment(serve: Callable[..., Live],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An ask on a prepared chart embeds none of its fragments and is at least 3x faster than a cold ask on a chart
    of the same size on a server that does not prepare (the old behaviour)."""
    tag = uuid.uuid4().hex[:10]
    preparing, cold = serve(prepare_charts=True), serve(prepare_charts=False)
    encoded = Encoded(monkeypatch, embedders_of(preparing) + embedders_of(cold))
    warm, prepared_chart, cold_chart = (chart("p0", f"warm{tag}", 3), chart("p1", f"prep{tag}", CHART),
                                        chart("p2", f"cold{tag}", CHART))
    with preparing.client(preparing.key("t", "service")) as feed, cold.client(cold.key("u", "service")) as other:
        for live, client in ((preparing, feed), (cold, other)):  # first asks pay the one-off costs
            assert client.put("/v1/patients/p0", json=warm).status_code == 200
            if live is preparing:
                settle(live)
            timed_ask(client, "p0")
        assert other.put("/v1/patients/p2", json=cold_chart).status_code == 200
        release = threading.Event()
        _held_until(monkeypatch, preparing.app.state.service.preparer, release)
        assert feed.put("/v1/patients/p1", json=prepared_chart).status_code == 200
        assert prepared(preparing, feed, "p1") == 0, "the PUT must not wait for the preparation"
        release.set()
        settle(preparing)
        assert prepared(preparing, feed, "p1") == CHART
        assert cold.app.state.service.preparer is None and prepared(cold, other, "p2") == 0
        encoded.texts.clear()
        cold_seconds = timed_ask(other, "p2")
        assert len(encoded.of(texts_of(cold_chart))) >= CHART, "the cold ask embeds its chart (what this measures)"
        encoded.texts.clear()
        warm_seconds = timed_ask(feed, "p1")
        assert encoded.of(texts_of(prepared_chart)) == []
    assert cold_seconds >= 3 * warm_seconds, (cold_seconds, warm_seconds)


def test_an_append_prepares_only_the_new_fragments(serve: Callable[..., Live],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:10]
    live = serve(prepare_charts=True)
    encoded = Encoded(monkeypatch, embedders_of(live))
    first, added = chart("p1", tag, 60), chart("p1", tag, 20, start=60)
    with live.client(live.key("t", "service")) as feed:
        assert feed.put("/v1/patients/p1", json=first).status_code == 200
        settle(live)
        assert set(texts_of(first)) <= set(encoded.of(texts_of(first)))
        encoded.texts.clear()
        assert feed.post("/v1/patients/p1/fragments", json=added).json()["added"] == 20
        settle(live)
        assert encoded.of(texts_of(first)) == [], "fragments prepared before were embedded again"
        assert set(texts_of(added)) <= set(encoded.of(texts_of(added)))
        assert prepared(live, feed, "p1") == 80
        encoded.texts.clear()
        timed_ask(feed, "p1")
        assert encoded.of(texts_of(first) + texts_of(added)) == []


def _files_hold(folder: Path, needle: bytes) -> bool:
    return any(needle in path.read_bytes() for path in folder.iterdir() if path.is_file() and "sqlite" in path.name)


def _left(live: Live, texts: Sequence[str]) -> int:
    derived = sorted(derived_texts(texts))
    return sum(e.cached(derived) for e in {id(e): e for e in embedders_of(live)}.values())


def test_erasure_during_preparation_leaves_no_prepared_data(serve: Callable[..., Live], resources: Any) -> None:
    """A chart erased once prepared, one erased while it is being prepared, and one erased while its preparation
    is still queued: none leaves a vector (the knowledge base's embedder's included: the gate's sentences are
    searched with it), a tier decision or a compressed state behind, in memory or in the cache files."""
    tag = uuid.uuid4().hex[:12]
    live = serve(prepare_charts=True)
    done, running, queued = (chart("p0", f"done{tag}", 30), chart("p1", f"run{tag}", TWO_BATCHES),
                             chart("p2", f"q{tag}", 40))
    engine = live.app.state.service.engine()
    packer = engine.packer
    with live.client(live.key("t", "service")) as feed, live.client(live.key("t", "admin")) as admin:
        assert feed.put("/v1/patients/p0", json=done).status_code == 200
        settle(live)
        assert engine.voter is not None and engine.voter.embedder.cached(sorted(derived_texts(texts_of(done)))), \
            "the preparation embeds the gate's sentences with the knowledge base's embedder"
        assert admin.delete("/v1/patients/p0").status_code == 200
        assert _left(live, texts_of(done)) == 0
        assert feed.put("/v1/patients/p1", json=running).status_code == 200
        assert feed.put("/v1/patients/p2", json=queued).status_code == 200
        deadline = time.monotonic() + 120
        while packer.embedder.cached(texts_of(running)) < 10:  # the first batches are in
            assert time.monotonic() < deadline, "the preparation did not start"
            time.sleep(0.05)
        assert live.app.state.service.preparer.pending() == 2, "p2 must still be queued behind p1"
        assert _files_hold(resources.cache_dir, f"run{tag}".encode()), "the test must see the text before erasure"
        assert admin.delete("/v1/patients/p2").status_code == 200
        assert admin.delete("/v1/patients/p1").status_code == 200
        settle(live)
    assert _left(live, texts_of(running)) == 0
    assert _left(live, texts_of(queued)) == 0
    assert not _files_hold(resources.cache_dir, f"run{tag}".encode())
    assert not _files_hold(resources.cache_dir, f"q{tag}".encode())
    assert not _files_hold(resources.cache_dir, f"done{tag}".encode())
    keys = [(t, f["section"]) for f in running["fragments"] for t in [f["text"]]]
    assert resources.tier_classifier.forget(keys) == 0, "a tier decision of the erased chart was left"
    fragments = record_from_json(running, "<test>").fragments
    assert resources.gate_labeller.forget(fragments) == 0, "the gate's labels of the erased chart were left"


def test_another_tenants_preparation_does_not_delay_an_ask(serve: Callable[..., Live]) -> None:
    """One engine slot: tenant u's asks while tenant t's chart is being prepared take about as long as without it
    (the preparation yields at its next checkpoint), not as long as the preparation. Measured as ratios to the
    preparation's own time, so a loaded machine slows both sides alike."""
    tag = uuid.uuid4().hex[:10]
    live = serve(engine_slots=1, prepare_charts=True)
    service = live.app.state.service
    with live.client(live.key("t", "service")) as feed, live.client(live.key("u", "service")) as asker:
        assert asker.put("/v1/patients/q1", json=chart("q1", f"small{tag}", 5)).status_code == 200
        settle(live)
        timed_ask(asker, "q1")
        alone = statistics.median(timed_ask(asker, "q1") for _ in range(3))
        started = time.perf_counter()
        assert feed.put("/v1/patients/p1", json=chart("p1", f"big{tag}", BACKGROUND)).status_code == 200
        time.sleep(0.5)
        beside = [timed_ask(asker, "q1") for _ in range(3)]
        assert service.preparer.pending() == 1, "the preparation must still run during the asks"
        settle(live)
        preparation = time.perf_counter() - started
    assert service.scheduler.counts["paused"] >= 1, "the preparation never yielded its slot"
    assert statistics.median(beside) - alone < preparation / 10, (alone, beside, preparation)
    assert max(beside) < preparation / 2, (beside, preparation)


def _standalone(store: PatientStore, resources: Any, context_packer: Any, demo_voter: Any) -> ChartPreparer:
    """A preparer as `ebmrag gateway run --prepare` builds it: its own threads, no scheduler, no erasure hook."""
    engine, own = demo_engine(resources, context_packer, demo_voter)
    return ChartPreparer(store, lambda: own, lambda: engine)


def test_the_gateway_prepares_the_charts_it_stores(store: PatientStore, resources: Any, context_packer: Any,
                                                   demo_voter: Any) -> None:
    create_key(store, "t", "service")
    stream, tag = f"test:{uuid.uuid4().hex[:10]}", uuid.uuid4().hex[:10]
    preparer = _standalone(store, resources, context_packer, demo_voter)
    texts = [f"Biopsy {n} ({tag}): moderately differentiated adenocarcinoma, margins clear." for n in range(12)]
    publish(REDIS_URL, [ResultMessage.model_validate({
        "tenant": "t", "patient_id": "p1", "result_id": f"r{n}", "kind": "pathology", "producer": "slide-model",
        "produced_at": datetime(2026, 3, 14, 8, tzinfo=UTC), "text": text}) for n, text in enumerate(texts)], stream)
    try:
        consumer = ResultConsumer(store, REDIS_URL, stream, block_ms=100, on_stored=preparer.enqueue)
        while consumer.step():
            pass
        assert consumer.stats.stored == 12
        assert preparer.wait_idle(120)
    finally:
        redis.Redis.from_url(REDIS_URL).delete(stream, f"{stream}:dead")
    assert context_packer.embedder.cached(texts) == 12
    assert preparer.counts["prepared"] >= 1 and preparer.counts["fragments"] == 12


def test_a_chart_erased_by_another_process_during_preparation_is_forgotten(
        store: PatientStore, resources: Any, context_packer: Any, demo_voter: Any) -> None:
    """The gateway's preparer cannot be told of an erasure in the service's process: it reads the store again after
    writing and forgets what it prepared for fragments that are gone."""
    create_key(store, "t", "service")
    tag = uuid.uuid4().hex[:12]
    record = chart("p1", f"gone{tag}", TWO_BATCHES)
    store.put_record("t", "p1", record_from_json(record, "<test>"))
    preparer = _standalone(store, resources, context_packer, demo_voter)
    preparer.enqueue("t", "p1")
    deadline = time.monotonic() + 120
    while context_packer.embedder.cached(texts_of(record)) < 10:
        assert time.monotonic() < deadline, "the preparation did not start"
        time.sleep(0.05)
    erased = store.delete_patient("t", "p1")  # what the service's erasure does, in its own process
    assert erased is not None
    resources.forget(erased)
    assert preparer.wait_idle(120)
    left = sorted(derived_texts(texts_of(record)))
    assert context_packer.embedder.cached(left) + demo_voter.embedder.cached(left) == 0
    assert not _files_hold(resources.cache_dir, f"gone{tag}".encode())
