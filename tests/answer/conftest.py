from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ebmrag.answer.engine import Engine
from ebmrag.answer.params import AnswerParams
from ebmrag.compose import Resources
from ebmrag.retrieve.vote import DocumentVoter
from tests.engines import engine_from_parts


@pytest.fixture
def make_engine(resources: Resources, context_packer: Any, demo_voter: DocumentVoter) -> Callable[..., Engine]:
    def build(client: Any = None, **options: Any) -> Engine:
        return engine_from_parts(resources, AnswerParams(**options), packer=context_packer, voter=demo_voter,
                                 client=client)

    return build
