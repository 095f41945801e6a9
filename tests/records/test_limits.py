"""records.limits: the depth of JSON is measured in linear time, whatever the text (a crafted body must not make
the measurement itself the attack)."""

from __future__ import annotations

import time

import pytest

from ebmrag.errors import RecordError
from ebmrag.records.limits import load_json, nesting_depth


def test_brackets_inside_strings_do_not_count() -> None:
    assert nesting_depth(b'{"a": [1, {"b": "[[[\\"]]"}]}') == 3


@pytest.mark.parametrize("raw", [b'"' + b'\\"' * 200_000, b'["' + b'\\\\\\"' * 100_000, b'"' + b"x" * 800_000])
def test_an_unterminated_string_is_refused_at_once(raw: bytes) -> None:
    """Each escaped quote of an unterminated string once started a new scan to the end: 200,000 of them took
    minutes. The bound is generous (a linear pass takes milliseconds); it only catches the quadratic case."""
    started = time.perf_counter()
    with pytest.raises(RecordError, match="invalid JSON"):
        load_json(raw, "body")
    assert time.perf_counter() - started < 5
