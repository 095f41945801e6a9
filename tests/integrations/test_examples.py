"""The documented drop-in examples run as written, offline, on the bundled patient and guidelines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.model
@pytest.mark.parametrize(("script", "framework"), [("llamaindex_pack.py", "llama_index.core"),
                                                    ("langchain_pack.py", "langchain_classic"),
                                                    ("haystack_pack.py", "haystack")])
@pytest.mark.integration
def test_example_keeps_the_allergy(script: str, framework: str) -> None:
    pytest.importorskip(framework, reason=f"the extra providing {framework} is not installed")
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--budget", "420"], capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    line = next(line for line in run.stdout.splitlines() if "admission-2026-03-08" in line)
    assert "T1" in line and "allergy" in line
