"""A knowledge base records its on-disk format in every generation's manifest; one this ebmrag cannot read as it is
(older, newer, none recorded, not a knowledge base at all) is refused in one line naming what to run, and a
directory that holds anything else is never turned into a fresh knowledge base."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ebmrag.errors import KnowledgeBaseError
from ebmrag.index import generations
from ebmrag.index.kb import KnowledgeBase, require_readable
from ebmrag.index.reader import FORMAT_VERSION, MANIFEST
from ebmrag.ingest.documents import Document

pytestmark = pytest.mark.model

DOCS = [Document("gout", "Colchicine eases an acute gout flare within a day.", "notes", "txt", title="Gout"),
        Document("aki", "A creatinine rise of 0.3 mg/dL in 48 hours is acute kidney injury.", "notes", "txt")]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Path:
    root = tmp_path_factory.mktemp("format") / "kb"
    KnowledgeBase(root, embedder=embedder).apply(DOCS)
    return root


@pytest.fixture
def copy_of(built: Path, tmp_path: Path) -> Callable[..., Path]:
    """A copy of the built knowledge base whose live manifest says `format=` (a key left out with `...`)."""

    def make(**changes: Any) -> Path:
        root = tmp_path / "kb"
        shutil.copytree(built, root)
        manifest = generations.current_generation(root) / MANIFEST  # type: ignore[operator]
        data = json.loads(manifest.read_text())
        for key, value in changes.items():
            if value is ...:
                del data[key]
            else:
                data[key] = value
        manifest.write_text(json.dumps(data))
        return root

    return make


def test_every_generation_records_the_format_it_was_written_in(built: Path) -> None:
    live = generations.current_generation(built)
    assert live is not None and json.loads((live / MANIFEST).read_text())["format"] == FORMAT_VERSION
    assert KnowledgeBase(built).format == FORMAT_VERSION
    require_readable(built)


def test_an_older_format_opens_only_to_be_converted(copy_of: Callable[..., Path], embedder: Any) -> None:
    """Format 1 is what `kb compact` converts: reading or writing it is refused with that command; a manifest that
    says format 1 over files that are not a format-1 index is refused as damaged, not converted into a crash."""
    root = copy_of(format=1)
    kb = KnowledgeBase(root, embedder=embedder)
    assert kb.format == 1
    for attempt in (kb.reader, lambda: kb.apply(DOCS[:1]), lambda: require_readable(root)):
        with pytest.raises(KnowledgeBaseError, match=f"convert it once with `ebmrag kb compact --kb {root}`"):
            attempt()
    with pytest.raises(KnowledgeBaseError, match="holds no format-1 index"):
        kb.compact()


@pytest.mark.parametrize(("changes", "says"), [
    ({"format": FORMAT_VERSION + 1}, "written by a newer ebmrag .*upgrade ebmrag"),
    ({"format": ...}, "records no on-disk format"),
    ({"format": "2"}, "unknown on-disk format '2'"),
])
def test_a_newer_or_unrecorded_format_is_refused_before_anything_reads_it(
        copy_of: Callable[..., Path], embedder: Any, changes: dict[str, Any], says: str) -> None:
    root = copy_of(**changes)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(KnowledgeBaseError, match=says):
        KnowledgeBase(root, embedder=embedder)
    with pytest.raises(KnowledgeBaseError, match=says):
        require_readable(root)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before, "a refused knowledge base is left as is"


def test_an_unreadable_manifest_is_named_damaged(copy_of: Callable[..., Path]) -> None:
    root = copy_of()
    (generations.current_generation(root) / MANIFEST).write_text("{not json")  # type: ignore[operator]
    with pytest.raises(KnowledgeBaseError, match=r"manifest\.json does not read .* damaged"):
        KnowledgeBase(root)


def test_a_directory_of_other_files_is_never_made_a_knowledge_base(tmp_path: Path, embedder: Any) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "letter.txt").write_text("not a knowledge base")
    for attempt in (lambda: KnowledgeBase(notes, embedder=embedder), lambda: require_readable(notes)):
        with pytest.raises(KnowledgeBaseError, match=r"is not a knowledge base and not empty \(letter\.txt\)"):
            attempt()
    assert sorted(p.name for p in notes.iterdir()) == ["letter.txt"]


def test_a_knowledge_base_that_lost_its_current_file_is_damaged_not_new(built: Path, tmp_path: Path,
                                                                        embedder: Any) -> None:
    root = tmp_path / "kb"
    shutil.copytree(built, root)
    (root / generations.CURRENT).unlink()
    with pytest.raises(KnowledgeBaseError, match=r"no CURRENT file .* damaged"):
        KnowledgeBase(root, embedder=embedder)
    assert (root / "segments").is_dir() and any((root / "segments").iterdir()), "its segments are not collected"


def test_an_empty_directory_or_a_crashed_first_write_becomes_a_knowledge_base(tmp_path: Path, embedder: Any) -> None:
    empty, crashed = tmp_path / "empty", tmp_path / "crashed"
    empty.mkdir()
    (crashed / "gen-000001.partial").mkdir(parents=True)
    (crashed / "segments" / "seg-000001.partial").mkdir(parents=True)
    (crashed / ".lock").touch()
    for root in (empty, crashed):
        with pytest.raises(KnowledgeBaseError, match="holds no knowledge base yet; create it with `ebmrag ingest"):
            require_readable(root)
        assert KnowledgeBase(root, embedder=embedder).apply(DOCS).added == ["gout", "aki"]
        require_readable(root)
        assert not (root / "gen-000001.partial").exists()
