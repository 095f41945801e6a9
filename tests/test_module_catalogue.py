"""docs/MODULES.md is generated from the docstrings (bench/module_catalogue.py): it must match them, and every
module must have one, since a module without a docstring is a blank line in the catalogue."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "module_catalogue.py"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return load_script("module_catalogue")


def test_docs_modules_md_is_current(generator: ModuleType) -> None:
    expected = generator.catalogue()
    written = generator.OUT.read_text(encoding="utf-8") if generator.OUT.exists() else ""
    assert written == expected, (
        f"docs/MODULES.md is stale (a module was added, moved or its docstring changed): run `{generator.COMMAND}`"
    )


def test_every_module_has_a_docstring(generator: ModuleType) -> None:
    missing = generator.missing_docstrings()
    assert not missing, "modules without a docstring (add one saying why the module exists):\n" + "\n".join(missing)


def test_catalogue_is_sorted_by_package_and_reads_first_paragraphs(generator: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "ebmrag"
    files = {
        "__init__.py": '"""The root."""\n',
        "zeta.py": '"""Last at the root.\n\nNot in the catalogue."""\n',
        "alpha.py": '"""First at the root,\nover two lines."""\n',
        "pkg/__init__.py": '"""A package."""\n',
        "pkg/b.py": "x = 1\n",
        "pkg/a.py": '"""A module."""\n',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    text = generator.catalogue(root)
    assert text == generator.catalogue(root), "the same tree gives the same text"
    body = text.split("## ", 1)[1]
    assert body.index("alpha.py") < body.index("zeta.py") < body.index("## `ebmrag.pkg`") < body.index("pkg/a.py")
    assert "First at the root, over two lines." in text and "Not in the catalogue" not in text
    assert "- [`pkg/b.py`](../src/ebmrag/pkg/b.py) — (no docstring)" in text
    assert generator.missing_docstrings(root) == ["ebmrag/pkg/b.py"]


def test_write_replaces_the_file_and_leaves_no_temporary(generator: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "MODULES.md"
    out.write_text("old")
    generator.write_atomically(out, "new\n")
    assert out.read_text() == "new\n"
    assert [path.name for path in tmp_path.iterdir()] == ["MODULES.md"]
