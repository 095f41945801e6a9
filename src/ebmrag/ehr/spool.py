"""Private spool folders for Bulk Data downloads, removed when their work ends and found again when it was killed.

A Group export's NDJSON files hold every exported patient's chart. They are written to a folder of their own
(0700), removed when the export ends, however it ends. A process killed mid-export (SIGKILL, out of memory, power
lost) cannot remove anything, so its folder would stay in the temp folder for ever: patient data at rest that no
erasure reaches. Each folder therefore carries its owner (`owner.json`: pid, the process's start time, host), and
`sweep_stale` removes the folders whose owner is gone; `serve` and every export call it when they start.

The owner is gone when no process has its pid, or one has it with another start time (a pid reused after a
reboot or a long run); a folder whose marker cannot be read (killed between creating the folder and writing it),
or one of another host (a shared temp folder), counts as gone once it is older than `GRACE_SECONDS`. Folders of
earlier versions (`ebmrag-export-*`, no marker) are gone after the same grace. Only real folders of this account
are touched: a symlink or another user's folder is left alone.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)
PREFIX = "ebmrag-spool-"
LEGACY_PREFIX = "ebmrag-export-"  # tempfile.TemporaryDirectory's, before owner markers
MARKER = "owner.json"
GRACE_SECONDS = 3600.0


class Spool:
    """`with Spool() as folder:` a private folder, removed with everything in it when the block ends."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.gettempdir())
        self.path = self.root / f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"

    def __enter__(self) -> Path:
        self.path.mkdir(mode=0o700)
        marker = {"pid": os.getpid(), "started": process_start(os.getpid()), "host": socket.gethostname(),
                  "created": time.time()}
        (self.path / MARKER).write_text(json.dumps(marker), encoding="utf-8")
        return self.path

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _remove(self.path)


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat, field 22); None where unknown."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()  # the command name, in parentheses, may hold spaces
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def sweep_stale(root: Path | None = None, now: float | None = None) -> int:
    """Remove the spool folders under `root` whose owner is gone (module doc); how many were removed. Never
    raises: a folder that cannot be removed is one warning line."""
    root = Path(root or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        log.warning("spool sweep: %s cannot be listed (%s)", root, type(exc).__name__)
        return 0
    for entry in entries:
        if not entry.name.startswith((PREFIX, LEGACY_PREFIX)) or not _ours(entry):
            continue
        if _owner_alive(Path(entry.path), now):
            continue
        removed += _remove(Path(entry.path))
    if removed:
        log.warning("spool sweep: removed %d spool folder(s) left by export(s) that were killed", removed)
    return removed


def _ours(entry: os.DirEntry[str]) -> bool:
    """A real folder (never a symlink) of this account."""
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _owner_alive(folder: Path, now: float) -> bool:
    try:
        age = now - folder.stat().st_mtime
    except OSError:
        return True  # gone meanwhile, or not ours to judge
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        pid, started, host = int(marker["pid"]), marker.get("started"), str(marker["host"])
    except (OSError, ValueError, KeyError, TypeError):  # no marker (yet, or an older version's folder)
        return age < GRACE_SECONDS
    if host != socket.gethostname():
        return age < GRACE_SECONDS
    if not Path(f"/proc/{pid}").exists() and not _pid_exists(pid):
        return False
    return started is None or process_start(pid) in (None, started)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(folder: Path) -> bool:
    """Remove the folder and everything in it; False (and one warning line) when that fails."""
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("spool: %s could not be removed (%s)", folder, type(exc).__name__)
        return False
    return True
