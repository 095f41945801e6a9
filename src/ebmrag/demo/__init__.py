"""Synthetic demo patients and a small demo knowledge base that ship with ebmrag (written for this project;
no real patient data, no text copied from elsewhere)."""

from __future__ import annotations

import hashlib
import json
import logging
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
    """Build the demo knowledge base on first use (a few seconds of embedding); later calls only open it."""
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.index.sync import ingest_paths

    root = demo_kb_path(cache_dir)
    kb = KnowledgeBase(root, cache_dir=cache_dir)
    if not kb.exists:
        log.warning("building the demo knowledge base in %s (first use only)", root)
        report = ingest_paths(kb, [DEMO_CORPUS])
        if report.errors:
            raise RuntimeError(f"the bundled demo corpus failed to ingest: {report.errors[0]}")
    return root
