"""`ebmrag gateway run --prepare --kb DIR` (the real command, a real Redis): a stored result's chart is prepared
with the operator's knowledge base's embedding model, the one `ebmrag serve --kb DIR` shares, and no demo
knowledge base is built in the cache."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from ebmrag.compose import Resources
from ebmrag.config import load_settings
from ebmrag.gateway.publish import publish
from ebmrag.index.kb import KnowledgeBase
from ebmrag.ingest.documents import Document
from ebmrag.store.access import create_key
from ebmrag.store.patients import SQLiteStore
from tests.gateway.test_gateway import REDIS_URL, fragments, message

pytestmark = pytest.mark.model


def test_the_gateway_prepares_charts_with_the_operators_kb(tmp_path: Path, embedder: Any) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    create_key(store, "t", "service")  # the tenant exists once a key names it
    stream = f"test:{uuid.uuid4().hex[:10]}"
    kb = tmp_path / "ward-kb"
    KnowledgeBase(kb, embedder=embedder).apply([Document("ward-note", "Vancomycin for wound infections.", "ward",
                                                         "txt")])
    cache = tmp_path / "cache"
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{cache}"\n')
    publish(REDIS_URL, [message(1)], stream)
    gateway = subprocess.Popen([sys.executable, "-m", "ebmrag.cli", "gateway", "run", "--data-dir", str(tmp_path),
                                "--broker", REDIS_URL, "--stream", stream, "--prepare", "--kb", str(kb),
                                "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not fragments(store) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        gateway.send_signal(signal.SIGTERM)
        _, said = gateway.communicate(timeout=60)  # it finishes preparing what it stored first
    assert gateway.returncode == 0, said
    assert f"knowledge base: {kb}" in said and "1 stored" in said
    record = store.record("t", "p1")
    shared = Resources.open(load_settings(config), kb)  # what the service over --kb reads the cache with
    assert record is not None and shared.shares_embedder and all(shared.prepared(record.fragments))
    assert not list(cache.glob("demo-kb-*")), "no demo knowledge base was built"
    redis.Redis.from_url(REDIS_URL).delete(stream, f"{stream}:dead")
