"""Synthetic demo patients and a small demo knowledge base that ship with ebmrag (written for this project;
no real patient data, no text copied from elsewhere)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from ebmrag.errors import RecordError
from ebmrag.records.fragment import PatientRecord
from ebmrag.records.loaders import load_record
from ebmrag.records.params import ChartParams

RECORDS_DIR = Path(__file__).parent / "records"
DEMO_CORPUS = Path(__file__).parent / "kb" / "guidelines.jsonl"
log = logging.getLogger(__name__)


def demo_guidelines() -> list[dict[str, str]]:
    """The demo corpus as records (id, title, section, date, authority, source, text): what the drop-in examples
    hand to a framework's own index."""
    lines = DEMO_CORPUS.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def demo_record_paths() -> list[Path]:
    return sorted(RECORDS_DIR.glob("*.json"))


def demo_record_path(name: str) -> Path | None:
    """A bundled record by its file stem ("demo-colon"), or None when there is none of that name."""
    path = RECORDS_DIR / f"{name}.json"
    return path if path.is_file() and path.parent == RECORDS_DIR else None


def load_patient(source: str | Path, patient_id: str | None = None, params: ChartParams | None = None
                 ) -> PatientRecord:
    """A record file (every format `load_record` reads), or the name of a bundled demo record ("demo-colon")."""
    path = Path(source)
    if not path.exists():
        bundled = demo_record_path(str(source))
        if bundled is None:
            names = ", ".join(p.stem for p in demo_record_paths())
            raise RecordError(str(source), f"no such file, and not a bundled demo record ({names})")
        path = bundled
    return load_record(path, patient_id, params)


def demo_query(path: Path) -> str:
    """Each demo record carries the clinical question it was written for."""
    return str(json.loads(path.read_text(encoding="utf-8"))["query"])


def demo_kb_path(cache_dir: Path) -> Path:
    """Where the demo knowledge base lives: keyed by the corpus hash, the on-disk format and the runtime that
    embeds it by default (ONNX), so an upgraded corpus or ebmrag gets a fresh build, and a demo KB that an older
    ebmrag embedded with torch is not opened by an install that has no torch."""
    from ebmrag.index.reader import FORMAT_VERSION

    digest = hashlib.sha256(DEMO_CORPUS.read_bytes()).hexdigest()[:12]
    return cache_dir / f"demo-kb-{digest}-f{FORMAT_VERSION}-onnx"


def ensure_demo_kb(cache_dir: Path) -> Path:
    """The demo knowledge base, built on first use (a few seconds of embedding). It is a cache of the bundled
    corpus: one that does not read as that corpus in this ebmrag's format (damaged, unreadable, another format, or
    holding an older ebmrag's uploads) is moved aside to `<name>.broken-<time>`, never deleted, with one warning,
    and built again, so the command still succeeds. One process at a time checks and builds it (a lock beside
    it): the workers of one service start together."""
    root = demo_kb_path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _demo_lock(cache_dir):
        if not root.exists() and not root.is_symlink():
            log.warning("building the demo knowledge base in %s (first use only)", root)
        else:
            problem = _unusable(root)
            if problem is None:
                return root
            aside = root.with_name(f"{root.name}.broken-{datetime.now(UTC):%Y%m%dT%H%M%S%f}")
            root.rename(aside)
            log.warning("the demo knowledge base in %s is unusable (%s): moved it to %s and building it again from "
                        "the bundled corpus", root, problem, aside)
        _build(root, cache_dir)
    return root


@contextmanager
def _demo_lock(cache_dir: Path) -> Iterator[None]:
    with open(cache_dir / "demo-kb.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _unusable(root: Path) -> str | None:
    """Why the demo knowledge base at `root` cannot serve as it is, or None: it must open in this ebmrag's format
    and hold exactly the bundled corpus, every chunk row, BM25 array and vector readable (milliseconds at its
    size). Any failure to read a cache is a reason to rebuild it, whatever the exception."""
    from ebmrag.index.kb import KnowledgeBase

    try:
        reader = KnowledgeBase(root).reader()  # no cache directory: checking embeds nothing
        try:
            held, corpus = set(reader.documents()), {g["id"] for g in demo_guidelines()}
            if held - corpus:
                return (f"it holds documents besides the bundled corpus ({len(held - corpus)}), uploads by an "
                        "older ebmrag? `ebmrag serve --kb` serves the moved copy")
            if corpus - held:
                return f"it lacks {len(corpus - held)} documents of the bundled corpus"
            rows = sum(1 for _ in reader.iter_chunks())
            shape = reader.dense.vectors.shape
            reader.lexical.search(["penicillin"], 1)  # its term arrays load
            if rows != reader.live_chunks or shape != (reader.size, int(reader.manifest["dim"])):
                return f"{rows} chunks and {shape[0]} vectors where the manifest says {reader.live_chunks}"
        finally:
            reader.close()
    except Exception as exc:  # a cache that does not read, for whatever reason, is rebuilt
        return f"{type(exc).__name__}: {str(exc).split('; ')[0]}"  # what is wrong, not the advice for a user's KB
    return None


def _build(root: Path, cache_dir: Path) -> None:
    """Into a sibling folder renamed into place once complete: a build cut short leaves no half knowledge base."""
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.index.sync import ingest_paths

    building = root.with_name(root.name + ".building")
    _remove(building)
    report = ingest_paths(KnowledgeBase(building, cache_dir=cache_dir), [DEMO_CORPUS])
    if report.errors:
        raise RuntimeError(f"the bundled demo corpus failed to ingest: {report.errors[0]}")
    building.rename(root)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
