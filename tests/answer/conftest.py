from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ebmrag.answer.engine import Engine
from ebmrag.config import AnswerSettings
from ebmrag.retrieve.vote import DocumentVoter


@pytest.fixture
def make_engine(context_packer: Any, demo_voter: DocumentVoter) -> Callable[..., Engine]:
    def build(client: Any = None, **options: Any) -> Engine:
        return Engine(context_packer, demo_voter, client, answer=AnswerSettings(**options))

    return build
