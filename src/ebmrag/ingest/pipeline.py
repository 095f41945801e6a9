"""Files and folders -> documents, with a per-file error report (`index.sync` writes them to a knowledge base).

Document ids: a file named on the command line is keyed by its name, a file found in folder D by
"D/relative/path"; JSONL records carry their own ids. With `sync`, documents that came from a
given folder or file and are no longer there are deleted, except those of files that failed to
read this time (a transient error must never delete knowledge).
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ebmrag.errors import IngestError
from ebmrag.ingest.documents import Document
from ebmrag.ingest.readers import DEFAULT_MAX_FILE_BYTES, SUFFIXES, FieldMap, ReadResult, read_file
from ebmrag.protocols import Progress

log = logging.getLogger(__name__)


@dataclass
class FileBatch:
    documents: list[Document] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)
    errors: list[IngestError] = field(default_factory=list)
    failed_files: set[str] = field(default_factory=set)


def _files(path: Path, source: str = "") -> list[tuple[Path, str]]:
    """(file, doc_id) pairs; hidden files and unsupported suffixes inside folders are skipped. Ids are
    "<folder name>/<relative path>" (a file named alone: "<its folder's name>/<file name>"), or
    "<source>/<relative path>" with an explicit source name, which keeps two folders of one name apart."""
    path = path.resolve()
    if path.is_file():
        return [(path, f"{source or path.parent.name}/{path.name}")]
    found = []
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if file.is_file() and file.suffix.lower() in SUFFIXES and not any(p.startswith(".") for p in relative.parts):
            found.append((file, f"{source or path.name}/{relative.as_posix()}"))
    return found


def read_one(file: Path, doc_id: str, field_map: FieldMap | None, max_bytes: int) -> ReadResult | IngestError:
    """One file's documents, or the error that stopped it (a value, so it can cross a process boundary)."""
    try:
        return read_file(file, doc_id, field_map, max_bytes)
    except IngestError as exc:
        return exc


ReadMany = Callable[[Sequence[tuple[Path, str]], FieldMap | None, int], Iterator[ReadResult | IngestError]]


def read_here(files: Sequence[tuple[Path, str]], field_map: FieldMap | None,
              max_bytes: int) -> Iterator[ReadResult | IngestError]:
    yield from (read_one(file, doc_id, field_map, max_bytes) for file, doc_id in files)


MIN_FILES_FOR_PROCESSES = 64


def _read_group(group: Sequence[tuple[Path, str]], field_map: FieldMap | None,
                max_bytes: int) -> list[ReadResult | IngestError]:
    return list(read_here(group, field_map, max_bytes))


def read_in_processes(workers: int) -> ReadMany:
    """A `ReadMany` that reads (decodes, extracts PDF and HTML text, normalises) in `workers` spawned
    processes, a group of files per task, in order; few files are read here (a process costs ~1 s to start)."""
    def read_many(files: Sequence[tuple[Path, str]], field_map: FieldMap | None,
                  max_bytes: int) -> Iterator[ReadResult | IngestError]:
        if workers <= 1 or len(files) < MIN_FILES_FOR_PROCESSES:
            yield from read_here(files, field_map, max_bytes)
            return
        size = max(1, min(32, len(files) // (4 * workers)))
        groups = [files[i:i + size] for i in range(0, len(files), size)]
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for results in pool.map(_read_group, groups, [field_map] * len(groups), [max_bytes] * len(groups)):
                yield from results
    return read_many


def collect(paths: Sequence[Path], field_map: FieldMap | None = None,
            max_bytes: int = DEFAULT_MAX_FILE_BYTES, progress: Progress | None = None, source: str = "",
            read_many: ReadMany = read_here) -> FileBatch:
    """Every document under `paths`; `read_many` reads the files (in order), here or on other machines."""
    batch = FileBatch()
    files: list[tuple[Path, str]] = []
    for path in paths:
        if not path.exists():
            batch.errors.append(IngestError(str(path), "no such file or folder"))
            continue
        files.extend(_files(path, source))
    for done, ((file, _), result) in enumerate(zip(files, read_many(files, field_map, max_bytes), strict=True)):
        if progress:
            progress("reading", done, len(files))
        origin = str(file.resolve())
        if isinstance(result, IngestError):
            batch.errors.append(result)
            batch.failed_files.add(origin)
            continue
        batch.errors.extend(result.errors)
        for document in result.documents:
            batch.documents.append(document)
            batch.origins[document.doc_id] = origin
    if progress:
        progress("reading", len(files), len(files))
    return batch
