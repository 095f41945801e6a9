"""Bulk Data spools (ehr.spool): removed however their work ends, and found again after a kill."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebmrag.ehr.spool import GRACE_SECONDS, MARKER, OTHER_HOST_SECONDS, PREFIX, Spool, sweep_stale


def test_a_spool_is_private_and_removed_on_success_and_on_failure(tmp_path: Path) -> None:
    with Spool(tmp_path) as folder:
        assert folder.stat().st_mode & 0o777 == 0o700
        (folder / "00001.ndjson").write_text('{"resourceType": "Patient"}\n')
    assert not folder.exists()
    with pytest.raises(KeyboardInterrupt), Spool(tmp_path) as folder:
        (folder / "00001.ndjson").write_text("{}\n")
        raise KeyboardInterrupt
    assert not folder.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_a_spool_left_by_a_killed_process_is_swept_and_a_live_ones_is_not(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom ebmrag.ehr.spool import Spool\n"
        f"with Spool(Path({str(tmp_path)!r})) as folder:\n"
        "    (folder / '00001.ndjson').write_text('{\"resourceType\": \"Observation\"}\\n')\n"
        "    print(folder, flush=True)\n    time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    orphan = Path(child.stdout.readline().strip())
    with Spool(tmp_path) as mine:
        assert sweep_stale(tmp_path) == 0, "both owners are alive"
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert orphan.is_dir(), "a killed process cleans up nothing"
        assert sweep_stale(tmp_path) == 1
        assert not orphan.exists() and mine.is_dir()
    child.stdout.close()


def test_a_reused_pid_is_not_the_owner(tmp_path: Path) -> None:
    folder = tmp_path / f"{PREFIX}{os.getpid()}-left"  # a marker of a dead process, its lock gone with it
    folder.mkdir()
    marker = {"pid": os.getpid(), "started": 1, "host": socket.gethostname(), "created": time.time()}
    (folder / MARKER).write_text(json.dumps(marker))  # this pid, another process start
    assert sweep_stale(tmp_path) == 1 and not folder.exists()


def test_a_locked_marker_is_a_live_owner_whatever_pid_it_shows(tmp_path: Path) -> None:
    """A process in another pid namespace sharing the temp folder: its pid means nothing here, its lock does."""
    with Spool(tmp_path) as folder:
        marker = json.loads((folder / MARKER).read_text())
        (folder / MARKER).write_text(json.dumps({**marker, "pid": 4_000_000 - 7, "started": 1}))
        assert sweep_stale(tmp_path) == 0 and folder.exists()


def test_unmarked_and_older_folders_wait_out_the_grace_and_symlinks_are_never_followed(tmp_path: Path) -> None:
    legacy = tmp_path / "ebmrag-export-abc"
    legacy.mkdir()
    (legacy / "00001.ndjson").write_text("{}\n")
    unmarked = tmp_path / f"{PREFIX}1-fresh"
    unmarked.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("not a spool")
    (tmp_path / f"{PREFIX}2-link").symlink_to(target)
    assert sweep_stale(tmp_path) == 0, "a folder without its marker yet may be one being created"
    old = time.time() - GRACE_SECONDS - 60
    os.utime(legacy, (old, old))
    assert sweep_stale(tmp_path) == 1
    assert not legacy.exists() and unmarked.exists() and (target / "keep.txt").exists()
    assert sweep_stale(tmp_path, now=time.time() + GRACE_SECONDS + 60) == 1 and not unmarked.exists()
    assert (target / "keep.txt").exists() and (tmp_path / f"{PREFIX}2-link").is_symlink()


@pytest.mark.parametrize("marker", [{"pid": 1, "started": None, "host": "another-node"},
                                    {"pid": -1, "started": None, "host": None}, {"pid": 2**40, "host": None}])
def test_a_marker_that_cannot_be_checked_here_waits(tmp_path: Path, marker: dict[str, object]) -> None:
    folder = tmp_path / f"{PREFIX}9-marked"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({**marker, "host": marker["host"] or socket.gethostname()}))
    other_host = marker["host"] is not None
    assert sweep_stale(tmp_path, now=time.time() + GRACE_SECONDS + 60) == (0 if other_host else 1)
    if other_host:  # a shared temp folder: a live export on the other node must not lose its files
        assert folder.exists() and sweep_stale(tmp_path, now=time.time() + OTHER_HOST_SECONDS + 60) == 1
    assert not folder.exists()
