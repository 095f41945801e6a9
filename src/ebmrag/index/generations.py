"""Atomic generations: a knowledge base is a directory whose `CURRENT` file names the live generation.

A writer builds `gen-NNNNNN.partial/` in full, fsyncs it, renames it to `gen-NNNNNN/`, then replaces
`CURRENT` with `os.replace` (atomic on POSIX). A crash at any point leaves `CURRENT` naming the
previous, complete generation; the next writer deletes leftover partial directories. One writer at
a time is enforced with an exclusive `flock` on `.lock`; readers take no lock.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ebmrag.errors import KnowledgeBaseError

CURRENT = "CURRENT"
_NAME = re.compile(r"^gen-(\d{6})$")


def current_generation(root: Path) -> Path | None:
    marker = root / CURRENT
    if not marker.exists():
        return None
    name = marker.read_text(encoding="utf-8").strip()
    if not _NAME.match(name) or not (root / name).is_dir():
        raise KnowledgeBaseError(f"{root}: CURRENT names {name!r}, which is not a complete generation")
    return root / name


def generation_number(path: Path | None) -> int:
    match = _NAME.match(path.name) if path else None
    return int(match.group(1)) if match else 0


def fsync_dir(path: Path) -> None:
    """Make the renames and creations inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise KnowledgeBaseError(f"{root}: another process is writing to this knowledge base") from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_partials(root: Path) -> None:
    for leftover in root.glob("gen-*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)


def new_partial(root: Path) -> Path:
    number = generation_number(current_generation(root)) + 1
    partial = root / f"gen-{number:06d}.partial"
    partial.mkdir()
    return partial


def commit(root: Path, partial: Path) -> Path:
    """Seal the partial directory and make it the live generation; older generations are then deleted."""
    for file in partial.iterdir():
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    final = partial.with_name(partial.name.removesuffix(".partial"))
    partial.rename(final)
    fsync_dir(root)
    temporary = root / f"{CURRENT}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(final.name)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, root / CURRENT)
    fsync_dir(root)
    for old in root.glob("gen-*"):
        if old != final and _NAME.match(old.name):
            shutil.rmtree(old, ignore_errors=True)
    return final
