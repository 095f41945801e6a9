"""A test session never touches the user's cache: every session's fixtures write to a folder of its own
(tests/conftest.py), so a test run beside a user's work, or two runs at once, cannot break each other's cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def test_the_session_fixtures_build_and_answer(context_packer, demo_voter) -> None:  # type: ignore[no-untyped-def]
    """Every session-wide fixture of tests/conftest.py, built (the next test runs this one in a fresh session)."""
    assert os.environ["XDG_CACHE_HOME"] != str(Path.home() / ".cache")
    assert Path(os.environ["XDG_CACHE_HOME"]).name.startswith("ebmrag-test-cache-")
    assert demo_voter.run(["Which antibiotic is safe with a penicillin allergy?"]), "the demo KB answers"
    assert context_packer is not None
    if "EBMRAG_CACHE_PROBE" in os.environ:  # run by the next test: it checks the folder is gone afterwards
        Path(os.environ["EBMRAG_CACHE_PROBE"]).write_text(os.environ["XDG_CACHE_HOME"])


@pytest.mark.integration
def test_a_session_leaves_the_cache_it_was_given_empty(tmp_path: Path) -> None:
    given = tmp_path / "users-cache"
    given.mkdir()
    probe = tmp_path / "its-cache.txt"
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{TESTS / Path(__file__).name}::test_the_session_fixtures_build_and_answer"],
                         cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "XDG_CACHE_HOME": str(given), "EBMRAG_CACHE_PROBE": str(probe)})
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert list(given.iterdir()) == [], "the session wrote into the cache it was started with"
    own = Path(probe.read_text())
    assert own != given and not own.exists(), "the session's own cache folder is removed when it ends"
