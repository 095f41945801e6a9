"""bench/report.py: one benchmark's run replaces its own section and leaves every other one alone."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from tests.bench_scripts import load_script


def load_write_section():  # type: ignore[no-untyped-def]
    return load_script("report").write_section


def test_sections_are_replaced_in_place_and_never_erase_each_other(tmp_path: Path) -> None:
    write_section = load_write_section()
    doc = tmp_path / "benchmarks.md"
    write_section(doc, "packing", "## Packing\nold packing")
    write_section(doc, "ask", "## Ask\nask numbers")
    doc.write_text(doc.read_text() + "\nA note written by hand.\n")
    write_section(doc, "packing", "## Packing\nnew packing")
    text = doc.read_text()
    assert "new packing" in text and "old packing" not in text
    assert "ask numbers" in text and "A note written by hand." in text
    assert text.index("new packing") < text.index("ask numbers"), "a rewritten section keeps its place"
    assert text.startswith("# Benchmarks") and text.count("<!-- bench:packing -->") == 1
    assert not [p for p in tmp_path.iterdir() if p.name != "benchmarks.md"], "no temporary file left behind"


def test_emit_prints_and_writes_the_section_it_names(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    module = load_script("report")
    out = tmp_path / "b.md"
    module.emit(out, "x", ["## X", module.machine()])
    assert "<!-- bench:x -->\n## X\nMachine: " in out.read_text() and "## X" in capsys.readouterr().out
    module.emit(None, "y", ["## Y"])
    assert "bench:y" not in out.read_text()


def _read_fifo_in_background(fifo: Path, got: list[str]) -> threading.Thread:
    reader = threading.Thread(target=lambda: got.append(fifo.read_text(encoding="utf-8")), daemon=True)
    reader.start()
    return reader


def test_an_out_that_is_a_device_or_pipe_is_written_through_never_replaced(tmp_path: Path) -> None:
    """`--out /dev/null` once replaced the machine's /dev/null with a private regular file (a rename over it): a
    report or a JSONL written to a device or a pipe goes through it, and the device stays what it was."""
    from ebmrag.cli.common import write_jsonl

    for write in (lambda path: load_write_section()(path, "packing", "## Packing\nnumbers"),
                  lambda path: write_jsonl(path, [{"a": 1}, {"b": 2}])):
        fifo = tmp_path / f"pipe{len(list(tmp_path.iterdir()))}"
        os.mkfifo(fifo)
        got: list[str] = []
        reader = _read_fifo_in_background(fifo, got)
        writer = threading.Thread(target=write, args=(fifo,), daemon=True)  # a writer that reads the pipe first
        writer.start()  # would wait for ever: the test fails instead of hanging
        writer.join(10)
        assert not writer.is_alive(), "the write went through the pipe without waiting to read it"
        reader.join(10)
        assert stat.S_ISFIFO(fifo.stat().st_mode), "the pipe is still a pipe"
        assert got and ("numbers" in got[0] or '{"b": 2}' in got[0])
