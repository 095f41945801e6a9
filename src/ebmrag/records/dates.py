"""Dates as charts write them: FHIR allows a year ("1971") or a month ("2016-03") where a day is unknown.

A partial date is a fact with its precision, not an error: it is read as the first instant of the period
it names (so ages and ordering work) and the text keeps the date as written ("since 2016-03", never an
invented "2016-03-01"). A value that is no date at all gives None, and the caller reports it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

_PARTIAL = re.compile(r"^(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?$")
_YEARS = range(1800, 2200)  # "0001-01" is a producer's placeholder, not a date of this patient's care


def partial_timestamp(value: Any) -> datetime | None:
    """A FHIR date/dateTime/instant (any precision) -> a timezone-aware datetime, or None if it is not one."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    match = _PARTIAL.match(text)
    try:
        if match:
            year, month, day = (int(g) if g else 1 for g in match.groups())
            return datetime(year, month, day, tzinfo=UTC) if year in _YEARS else None
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.year not in _YEARS:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def as_written(value: Any) -> str:
    """The date part as the chart wrote it, at its own precision: "2016-03", "1971", "2014-09-17"."""
    if not isinstance(value, str) or partial_timestamp(value) is None:
        return ""
    return value.strip()[:10]
