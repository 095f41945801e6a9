"""Synthetic demo patients that ship with ebmrag (written for this project; no real patient data)."""

from __future__ import annotations

import json
from pathlib import Path

RECORDS_DIR = Path(__file__).parent / "records"


def demo_record_paths() -> list[Path]:
    return sorted(RECORDS_DIR.glob("*.json"))


def demo_query(path: Path) -> str:
    """Each demo record carries the clinical question it was written for."""
    return str(json.loads(path.read_text(encoding="utf-8"))["query"])
