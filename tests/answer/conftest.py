from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ebmrag.answer.engine import Engine
from ebmrag.answer.params import AnswerParams
from ebmrag.retrieve.vote import DocumentVoter


@pytest.fixture
def make_engine(context_packer: Any, demo_voter: DocumentVoter) -> Callable[..., Engine]:
    def build(client: Any = None, **options: Any) -> Engine:
        return Engine(context_packer, demo_voter, client, answer=AnswerParams(**options))

    return build
