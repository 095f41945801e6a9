"""Private spool folders for Bulk Data downloads, removed when their work ends and found again when it was killed.

A Group export's NDJSON files hold every exported patient's chart. They are written to a folder of their own
(0700), removed when the export ends, however it ends. A process killed mid-export (SIGKILL, out of memory, power
lost) cannot remove anything, so its folder would stay in the temp folder for ever: patient data at rest that no
erasure reaches. Each folder therefore carries its owner (`owner.json`: pid, the process's start time, host), and
`sweep_stale` removes the folders whose owner is gone; `serve` and every export call it when they start.

The owner holds an exclusive lock (flock) on its marker while the spool lives, and the kernel drops it when the
process dies however it dies: a locked marker is a live owner, whatever pid it shows (a process in another pid
namespace sharing this temp folder). Without the lock, the owner is gone when no process has its pid, or one has
it with another start time (a pid reused after a reboot or a long run). A folder whose marker cannot be read
(killed between creating the folder and writing it) counts as gone once it is older than `GRACE_SECONDS`, and so
do folders of earlier versions (`ebmrag-export-*`, no marker). One of another host (a shared temp folder) cannot
be checked from here, so it waits `OTHER_HOST_SECONDS`, longer than any export runs. Only real folders of this
account are touched: a symlink or another user's folder is left alone.
"""

from __future__ import annotations

import fcntl
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
from typing import IO

log = logging.getLogger(__name__)
PREFIX = "ebmrag-spool-"
LEGACY_PREFIX = "ebmrag-export-"  # tempfile.TemporaryDirectory's, before owner markers
MARKER = "owner.json"
GRACE_SECONDS = 3600.0
OTHER_HOST_SECONDS = 24 * 3600.0


class Spool:
    """`with Spool() as folder:` a private folder, removed with everything in it when the block ends."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.gettempdir())
        self.path = self.root / f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self._held: IO[str] | None = None

    def __enter__(self) -> Path:
        self.path.mkdir(mode=0o700)
        marker = {"pid": os.getpid(), "started": process_start(os.getpid()), "host": socket.gethostname(),
                  "created": time.time()}
        try:
            self._held = (self.path / MARKER).open("w", encoding="utf-8")
            fcntl.flock(self._held, fcntl.LOCK_EX)  # held while the spool lives; the kernel drops it at any death
            self._held.write(json.dumps(marker))
            self._held.flush()
        except BaseException:  # a full disk: __exit__ will not run, so nothing else would remove the folder
            self._release()
            _remove(self.path)
            raise
        return self.path

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _remove(self.path)
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None


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
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no marker (yet, or an older version's)
        return age < GRACE_SECONDS
    if host != socket.gethostname():
        return age < OTHER_HOST_SECONDS
    if _locked(folder / MARKER):  # its owner holds the lock: alive, whatever pid it has here (another pid namespace)
        return True
    if not 0 < pid < 2**22:  # not a pid this kernel hands out (pid_max); os.kill(-1, 0) would ask about everyone
        return age < GRACE_SECONDS
    if not Path(f"/proc/{pid}").exists() and not _pid_exists(pid):
        return False
    return started is None or process_start(pid) in (None, started)


def _locked(marker: Path) -> bool:
    """Whether a live process holds the marker's lock."""
    try:
        with marker.open("r", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, another account's
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
