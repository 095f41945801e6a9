"""[chart]: how charts are read (every key in docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ebmrag.records.dates import Today

MAX_FUTURE_SKEW_HOURS = 24 * 30  # a month: beyond it a mistyped year could pass for a clock set wrong


@dataclass(frozen=True)
class ChartParams:
    """`stale_order_days`: an active medication order or statement older than this, with no newer record of
    the drug in the chart, stays current but is marked "not recently confirmed" (orders are rarely closed
    out, so an old `active` is a question for the prescriber, not a fact).

    `future_skew_hours`: a date more than this far past the present (the wall clock when the chart is read or the
    question asked) is "in the future": shown flagged, never the newest fact (records.dates). It allows for clocks
    and time zones, not for a mistyped year."""

    stale_order_days: int = 730
    future_skew_hours: float = 24.0

    def __post_init__(self) -> None:
        if self.stale_order_days < 1:
            raise ValueError(f"stale_order_days must be at least 1, got {self.stale_order_days}")
        if not 0 <= self.future_skew_hours <= MAX_FUTURE_SKEW_HOURS:
            raise ValueError(f"future_skew_hours must be from 0 to {MAX_FUTURE_SKEW_HOURS}, got "
                             f"{self.future_skew_hours}")

    @property
    def stale_after(self) -> timedelta:
        return timedelta(days=self.stale_order_days)

    @property
    def future_skew(self) -> timedelta:
        return timedelta(hours=self.future_skew_hours)

    def today(self) -> Today:
        """The present of a chart read now: the wall clock, with this skew."""
        return Today.wall_clock(self.future_skew)
