"""[chart]: how charts are read (every key in docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class ChartParams:
    """`stale_order_days`: an active medication order or statement older than this, with no newer record of
    the drug in the chart, stays current but is marked "not recently confirmed" (orders are rarely closed
    out, so an old `active` is a question for the prescriber, not a fact)."""

    stale_order_days: int = 730

    def __post_init__(self) -> None:
        if self.stale_order_days < 1:
            raise ValueError(f"stale_order_days must be at least 1, got {self.stale_order_days}")

    @property
    def stale_after(self) -> timedelta:
        return timedelta(days=self.stale_order_days)
