"""A real `ebmrag serve` for the tests: uvicorn on 127.0.0.1 in a thread, over SQLite and a real PostgreSQL.

PostgreSQL is the machine's (127.0.0.1:5432, database `test`, trust auth) unless EBMRAG_TEST_POSTGRES_URL
says otherwise; each test gets its own schema, dropped afterwards. An unreachable server fails the test
(it is not skipped): the PostgreSQL backend is part of what is tested.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from ebmrag.answer.engine import Engine
from ebmrag.compose import Resources
from ebmrag.config import Settings
from ebmrag.serve.app import create_app
from ebmrag.serve.clients import SERVER_OPTIONS
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore, PostgresStore, SQLiteStore
from tests.engines import engine_from_parts, over_knowledge_base

POSTGRES_URL = os.environ.get("EBMRAG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PatientStore]:
    if request.param == "sqlite":
        yield SQLiteStore(tmp_path / "store.sqlite")
        return
    backend = PostgresStore(POSTGRES_URL, schema=f"test_{uuid.uuid4().hex[:12]}", audit_key_file=tmp_path / "audit.key")
    try:
        yield backend
    finally:
        backend.drop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Live:
    """A running server and helpers to act as one of its keys."""

    url: str
    store: PatientStore
    app: Any

    def key(self, tenant: str, role: str, *patients: str) -> str:
        return create_key(self.store, tenant, role, patients)[0]

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@contextmanager
def serving(app: Any, port: int | None = None) -> Iterator[tuple[str, Any]]:
    """`app` on a real uvicorn at `port` (default: a free one) of 127.0.0.1, with the options `ebmrag serve` uses:
    yields its base URL and the app, stops it after (the app's shutdown runs)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port or free_port(), log_level="warning",
                                           **SERVER_OPTIONS))  # as `ebmrag serve` runs it: no proxy rewriting
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def running(store: PatientStore, engine: Engine, resources: Resources, **serve_settings: Any) -> Iterator[Live]:
    """`resources`: the ones `engine` was built from (`demo_engine` gives both). Charts are not prepared in the
    background unless a test asks (`prepare_charts=True`): most tests measure or count what an ask computes."""
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, **{"prepare_charts": False, **serve_settings}))
    with serving(create_app(store, settings, engine, resources)) as (url, app):
        yield Live(url, store, app)


def demo_engine(resources: Resources, context_packer: Any, demo_voter: Any,
                client: Any = None) -> tuple[Engine, Resources]:
    """An engine over the session's packer and the demo knowledge base's voter, and the resources it was built
    from (over that knowledge base)."""
    engine = engine_from_parts(resources, packer=context_packer, voter=demo_voter, client=client)
    return engine, over_knowledge_base(resources, demo_voter.retriever.kb)


@pytest.fixture
def serve(store: PatientStore, resources: Resources, context_packer: Any,
          demo_voter: Any) -> Iterator[Callable[..., Live]]:
    with ExitStack() as stack:
        yield lambda **settings: stack.enter_context(running(store, *demo_engine(resources, context_packer,
                                                                                 demo_voter), **settings))
