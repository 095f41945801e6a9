"""Request bodies the handlers parse themselves (a record, a Bundle, result messages): one parser, one answer.

Anything that is not JSON the readers can walk safely is a 400 `malformed-json` naming the problem, never a
500: invalid JSON, nesting deeper than `MAX_DEPTH` (a RecursionError would otherwise surface in the parser
or, for a body that parses, in whatever walks it later), NaN, oversized integers, unpaired surrogates.
Bodies FastAPI parses into pydantic models (ask, pack, search) get its own 400 or a 422 instead.
"""

from __future__ import annotations

from typing import Any

from ebmrag.errors import RecordError
from ebmrag.records.limits import MAX_DEPTH, load_json
from ebmrag.serve.problems import ProblemError

__all__ = ["MAX_DEPTH", "parse_json"]


def parse_json(raw: bytes) -> Any:
    """The body parsed, or ProblemError 400 `malformed-json` saying why not."""
    try:
        return load_json(raw, "the body")
    except RecordError as exc:
        raise ProblemError(400, "malformed-json", str(exc)) from None
