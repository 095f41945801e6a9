"""Dates as charts write them: FHIR allows a year ("1971") or a month ("2016-03") where a day is unknown.

A partial date is a fact with its precision, not an error: it is read as the first instant of the period
it names (so ages and ordering work) and the text keeps the date as written ("since 2016-03", never an
invented "2016-03-01"). A value that is no date at all gives None, and the caller reports it.

A date after the present (a mistyped year, "2062" for "2026"; a producer's clock ahead) is a date the chart wrote
but not one to trust: `Today` says which dates lie beyond the present (allowing a small clock skew), ranks them
below every trustworthy date wherever "the newest" is picked, and `future_flag` shows them flagged. The present
is the wall clock when the chart is read or the question asked, never the newest date of the chart: a chart
whose newest entry is the mistyped one would otherwise make that entry "today".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ebmrag.rules import rule_file

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


DEFAULT_FUTURE_SKEW = timedelta(days=1)  # [chart] future_skew_hours: clocks and time zones, not a mistyped year


@dataclass(frozen=True)
class Today:
    """The present a chart is read or a question asked at (`now`, timezone-aware), and how far past it a date may
    lie before it is "in the future" (`skew`: a laboratory's clock a little ahead, a date written in another time
    zone). Tests and replays give their own `now`; everything else takes `Today.wall_clock()`."""

    now: datetime
    skew: timedelta = DEFAULT_FUTURE_SKEW

    def __post_init__(self) -> None:
        if self.now.tzinfo is None:
            raise ValueError(f"Today.now must be timezone-aware, got {self.now.isoformat()}")
        if self.skew < timedelta(0):
            raise ValueError(f"the future-date skew must be >= 0, got {self.skew}")

    @classmethod
    def wall_clock(cls, skew: timedelta = DEFAULT_FUTURE_SKEW) -> Today:
        return cls(datetime.now(UTC), skew)

    def is_future(self, stamp: datetime | None) -> bool:
        """A date beyond the present and its skew (an undated fact is not in the future)."""
        return stamp is not None and stamp > self.now + self.skew

    def rank(self, stamp: datetime) -> tuple[bool, datetime]:
        """Sort key for "the newest": every trustworthy date above every future one, then by date."""
        return trust_rank(stamp, self.is_future(stamp))

    def newest(self, stamps: Iterable[datetime | None]) -> datetime | None:
        """The newest trustworthy date, or None when there is none: a future date is never "the newest"."""
        return max((s for s in stamps if s is not None and not self.is_future(s)), default=None)

    @property
    def day(self) -> str:
        return self.now.date().isoformat()


def trust_rank(stamp: datetime, future: bool) -> tuple[bool, datetime]:
    """Sort key for "the newest" when a fact's future flag is known already (a fragment's `date_in_future`)."""
    return (not future, stamp)


@rule_file("records/dates.toml")
def _wording(raw: Mapping[str, Any]) -> dict[str, str]:
    for key in ("future", "future_birth"):
        if "{date}" not in str(raw.get(key, "")):
            raise ValueError(f"{key!r} must be text holding {{date}}")
    return {key: str(value) for key, value in raw.items()}


def future_flag(written: str) -> str:
    """"date in the future: 2062-03-01": how a date after the present is shown wherever the chart's date is."""
    return _wording()["future"].format(date=written)


def shown_date(written: str, future: bool) -> str:
    """The date as written, or flagged when it lies in the future."""
    return future_flag(written) if future and written else written


def future_birth(written: str) -> str:
    """What the face sheet says in place of an age when the birth date lies in the future."""
    return _wording()["future_birth"].format(date=written)
