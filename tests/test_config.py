from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.config import load_settings
from ebmrag.errors import ConfigError


def test_answer_settings_are_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "ebmrag.toml"
    path.write_text('[answer]\nwindow = 8192\nretrieval = "always"\ngate_theta1 = 0.4\ngate_theta2 = 0.2\n'
                    '[llm]\nbackend = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', encoding="utf-8")
    settings = load_settings(path)
    assert (settings.answer.window, settings.answer.retrieval, settings.answer.gate_theta1) == (8192, "always", 0.4)
    assert settings.llm.backend == "openai"
    for bad, message in [('retrieval = "sometimes"', "retrieval must be"), ("gate_theta2 = 0.9", "thresholds"),
                         ("evidence_share = 0", "evidence_share"), ("windows = 3", "unknown keys")]:
        path.write_text(f"[answer]\n{bad}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=message):
            load_settings(path)


def test_the_all_extra_installs_every_user_extra() -> None:
    """`pip install 'ebmrag[all]'` must not silently miss an extra added later (dev and peer serve this repo)."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    listed = set(re.fullmatch(r"ebmrag\[(.*)\]", extras["all"][0]).group(1).split(","))  # type: ignore[union-attr]
    assert listed == set(extras) - {"all", "dev", "peer"}


def test_the_chart_table_is_read_and_checked(tmp_path: Path) -> None:
    """Issue 29: [chart] stale_order_days reaches the reader; a nonsensical value is refused by name."""
    path = tmp_path / "ebmrag.toml"
    path.write_text("[chart]\nstale_order_days = 365\n", encoding="utf-8")
    assert load_settings(path).chart.stale_order_days == 365
    path.write_text("[chart]\nstale_order_days = 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[chart\].*stale_order_days"):
        load_settings(path)
