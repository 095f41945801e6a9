"""Work that needs no engine slot has two clocks: the event loop's timer and the worker thread's own deadline at
its checkpoints. Whichever stops the work first, the caller gets the 504 problem, never the internal stop signal
(which, as a BaseException, would escape every handler as a 500)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from ebmrag.compose import ServiceParts
from ebmrag.config import Settings
from ebmrag.protocols import WorkCancelled, checkpoint
from ebmrag.serve.problems import ProblemError
from ebmrag.serve.service import Service
from ebmrag.store.patients import SQLiteStore


def _service(tmp_path: Path, seconds: float) -> Service:
    settings = Settings()
    settings = replace(settings, serve=replace(settings.serve, request_seconds=seconds, prepare_charts=False))
    return Service(SQLiteStore(tmp_path / "s.sqlite"), settings, ServiceParts(settings))


def test_the_threads_own_deadline_is_answered_504(tmp_path: Path) -> None:
    def stopped_first() -> None:  # the thread's deadline fires before the loop's timer
        raise WorkCancelled()

    with pytest.raises(ProblemError) as raised:
        asyncio.run(_service(tmp_path, 5.0).run(stopped_first, tenant="t", engine=False))
    assert raised.value.status == 504


def test_work_running_past_its_deadline_is_answered_504(tmp_path: Path) -> None:
    def forever() -> None:
        while True:
            checkpoint()

    with pytest.raises(ProblemError) as raised:
        asyncio.run(_service(tmp_path, 0.2).run(forever, tenant="t", engine=False))
    assert raised.value.status == 504
