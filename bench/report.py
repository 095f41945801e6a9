"""Each benchmark owns one section of docs/benchmarks.md, so running one never erases another's results.

A section sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`; text outside the markers
(notes, goals, analysis written by hand) is kept as it is. The file is replaced atomically.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_section(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
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
    os.replace(temporary, path)
