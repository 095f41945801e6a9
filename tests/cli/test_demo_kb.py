"""The demo knowledge base is a cache of the bundled corpus: damaged, of another format, or holding an older
ebmrag's uploads, it is moved aside (never deleted) with one warning and built again, and `ask` answers the same."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.demo import demo_guidelines, ensure_demo_kb
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.reader import FORMAT_VERSION
from ebmrag.ingest.documents import Document

pytestmark = pytest.mark.model
QUESTION = "Which antibiotic is safe for his wound infection, given his allergy?"


def damage_sqlite(root: Path) -> None:
    (next((root / "segments").iterdir()) / "kb.sqlite").write_bytes(b"not a database " * 100)


def damage_manifest(root: Path) -> None:
    (root / (root / "CURRENT").read_text().strip() / "manifest.json").write_text("{truncated")


def newer_format(root: Path) -> None:
    manifest = root / (root / "CURRENT").read_text().strip() / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": FORMAT_VERSION + 1}))


def demo_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ebmrag.demo" and r.levelno == logging.WARNING]


def answer_of(output: str) -> tuple[str, list[str], list[str]]:
    data = json.loads(output)
    return data["answer"], [c["id"] for c in data["citations"]], [d["doc_id"] for d in data["trace"]["retrieved"]]


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder with the demo knowledge base built, once for the module (seconds of embedding)."""
    cache = tmp_path_factory.mktemp("demo-kb-built") / "cache"
    ensure_demo_kb(cache)
    return cache


@pytest.mark.slow
def test_ask_answers_the_same_after_the_demo_kb_is_damaged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           built_once: Path) -> None:
    """The first ask answers from a sound copy of the module's demo KB (test_ask.py builds one on first use)."""
    cache = tmp_path / "cache"
    shutil.copytree(built_once, cache)
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{cache}"\n')
    ask = ["ask", QUESTION, "--patient", "demo-colon", "--retrieval", "always", "--json", "--config", str(config)]
    first = CliRunner().invoke(app, ask)
    assert first.exit_code == 0, first.output
    (root,) = cache.glob("demo-kb-*-onnx")
    assert answer_of(first.output)[2], "the demo knowledge base was searched"
    for damage in (damage_sqlite, damage_manifest):
        damage(root)
        caplog.clear()
        again = CliRunner().invoke(app, ask)
        assert again.exit_code == 0, again.output
        assert answer_of(again.output) == answer_of(first.output)
        (warning,) = demo_warnings(caplog)
        assert f"the demo knowledge base in {root} is unusable" in warning and "moved it to" in warning
    assert len(list(cache.glob(f"{root.name}.broken-*"))) == 2, "each damaged copy is kept aside, none deleted"


@pytest.fixture
def built_demo(tmp_path: Path, built_once: Path) -> Path:
    """A demo knowledge base of the test's own to damage: a copy of the one built once, found sound as it is."""
    shutil.copytree(built_once, tmp_path / "cache")
    return ensure_demo_kb(tmp_path / "cache")


@pytest.mark.parametrize("change", [newer_format, damage_manifest])
def test_a_demo_kb_that_does_not_read_is_rebuilt_with_one_warning(built_demo: Path, caplog: pytest.LogCaptureFixture,
                                                                  change: Callable[[Path], None]) -> None:
    change(built_demo)
    caplog.clear()
    assert ensure_demo_kb(built_demo.parent) == built_demo
    assert len(demo_warnings(caplog)) == 1
    assert KnowledgeBase(built_demo).format == FORMAT_VERSION
    assert set(KnowledgeBase(built_demo).reader().documents()) == {g["id"] for g in demo_guidelines()}
    caplog.clear()
    ensure_demo_kb(built_demo.parent)
    assert demo_warnings(caplog) == [], "a sound demo knowledge base is only opened"


def test_uploads_an_older_ebmrag_wrote_into_the_demo_kb_are_kept_aside(built_demo: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Before `serve --kb`, uploads landed in the demo knowledge base; the cache is rebuilt without them, and the
    moved copy, which holds them, is still a knowledge base an operator can serve."""
    uploaded = Document("local-protocol", "Our ward gives vancomycin for wound infections.", "upload", "upload")
    KnowledgeBase(built_demo, cache_dir=built_demo.parent).apply([uploaded])
    caplog.clear()
    ensure_demo_kb(built_demo.parent)
    (warning,) = demo_warnings(caplog)
    assert "besides the bundled corpus (1)" in warning and "ebmrag serve --kb" in warning
    (aside,) = built_demo.parent.glob(f"{built_demo.name}.broken-*")
    assert "local-protocol" in KnowledgeBase(aside).reader().documents()
    assert "local-protocol" not in KnowledgeBase(built_demo).reader().documents()
