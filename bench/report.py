"""Each benchmark owns one section of docs/benchmarks.md, so running one never erases another's results.

A section sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; text outside the markers
(notes, goals, analysis written by hand) is kept as it is. The file is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path


def machine() -> str:
    """The line every result starts from: what it was measured on."""
    return f"Machine: {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores"


def emit(out: Path | None, name: str, lines: Sequence[str]) -> None:
    """Print a benchmark's section and, given `out`, write it into that document (see write_section)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        write_section(out, name, text)


def write_section(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    if path.exists() and not path.is_file():  # a device or a pipe (--out /dev/null): nothing to keep from it, and
        path.write_text(block + "\n", encoding="utf-8")  # a rename over it would replace the device with a file
        return
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    start, stop = old.find(begin), old.find(end)
    if start >= 0 and stop > start:
        new = old[:start] + block + old[stop + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(new)
    os.chmod(temporary, 0o644)  # mkstemp makes it private; the report is a tracked document, readable like its peers
    os.replace(temporary, path)


def sentences(path: Path, count: int) -> list[str]:
    """`count` non-empty texts of a JSONL file, the first by sha256 of their id: the same slice on every run."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if str(r.get("text", "")).strip()]
    if len(rows) < count:
        raise SystemExit(f"{path}: {len(rows)} texts, {count} needed")
    rows.sort(key=lambda r: hashlib.sha256(str(r["id"]).encode()).hexdigest())
    return [str(r["text"]) for r in rows[:count]]
