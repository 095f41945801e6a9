from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} not present beside the checkout")
    return SHARED_DATA


@pytest.fixture(scope="session")
def context_packer():  # type: ignore[no-untyped-def]
    """One loaded model for the whole session (loading takes a few seconds)."""
    from ebmrag.packing.packer import ContextPacker

    packer = ContextPacker()
    packer.warm_up()
    return packer
