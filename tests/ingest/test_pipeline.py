from __future__ import annotations

from pathlib import Path

from ebmrag.ingest.pipeline import MIN_FILES_FOR_PROCESSES, collect, read_in_processes


def test_reading_in_worker_processes_equals_reading_here(tmp_path: Path) -> None:
    """Files are read (decoded, HTML stripped, normalised) in spawned processes, in order, errors as values."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(MIN_FILES_FOR_PROCESSES + 16):
        suffix = "html" if i % 5 == 0 else "md"
        body = f"<p>Note {i}:   creatinine  rose.</p>" if suffix == "html" else f"# Note {i}\n\nCreatinine  rose.\n"
        (folder / f"n{i:03d}.{suffix}").write_text(body, encoding="utf-8")
    (folder / "broken.txt").write_bytes(b"\xff\xfe not utf-8 \xff")
    here = collect([folder])
    there = collect([folder], read_many=read_in_processes(2))
    assert [d.doc_id for d in there.documents] == [d.doc_id for d in here.documents]
    assert [d.text for d in there.documents] == [d.text for d in here.documents]
    assert [str(e) for e in there.errors] == [str(e) for e in here.errors] and there.failed_files == here.failed_files
    assert len(there.documents) == MIN_FILES_FOR_PROCESSES + 16 and len(there.errors) == 1
