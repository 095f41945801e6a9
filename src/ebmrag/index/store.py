"""SQLite tables of one generation: documents and chunks. Chunk `row` i is row i of the BM25 and vector indexes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DB_FILE = "kb.sqlite"
SCHEMA = """
CREATE TABLE documents (
    doc_id TEXT PRIMARY KEY, content_hash TEXT NOT NULL, source TEXT NOT NULL, source_type TEXT NOT NULL,
    title TEXT NOT NULL, date TEXT NOT NULL, authority TEXT NOT NULL, origin TEXT NOT NULL,
    metadata TEXT NOT NULL, n_chunks INTEGER NOT NULL, ingested_at TEXT NOT NULL);
CREATE TABLE chunks (
    row INTEGER PRIMARY KEY, chunk_id TEXT NOT NULL UNIQUE, doc_id TEXT NOT NULL REFERENCES documents(doc_id),
    position INTEGER NOT NULL, section TEXT NOT NULL, section_id TEXT NOT NULL, char_start INTEGER NOT NULL,
    char_end INTEGER NOT NULL, text TEXT NOT NULL, terms TEXT NOT NULL, source TEXT NOT NULL, date TEXT NOT NULL,
    authority TEXT NOT NULL);
CREATE INDEX chunks_doc ON chunks(doc_id);
"""
CHUNK_COLUMNS = ("row", "chunk_id", "doc_id", "position", "section", "section_id", "char_start", "char_end", "text",
                 "terms", "source", "date", "authority")
DOCUMENT_COLUMNS = ("doc_id", "content_hash", "source", "source_type", "title", "date", "authority", "origin",
                    "metadata", "n_chunks", "ingested_at")


@dataclass(frozen=True)
class ChunkRow:
    row: int
    chunk_id: str
    doc_id: str
    position: int
    section: str
    section_id: str
    char_start: int
    char_end: int
    text: str
    terms: str
    source: str
    date: str
    authority: str


@dataclass(frozen=True)
class DocumentRow:
    doc_id: str
    content_hash: str
    source: str
    source_type: str
    title: str
    date: str
    authority: str
    origin: str
    metadata: str
    n_chunks: int
    ingested_at: str

    @property
    def metadata_dict(self) -> dict[str, str]:
        return dict(json.loads(self.metadata))


def create(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path / DB_FILE))
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    return db


def seal(db: sqlite3.Connection) -> None:
    """Fold the WAL into the main file so a sealed generation is one immutable file."""
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()


def open_readonly(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(f"file:{path / DB_FILE}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    return db


def insert_documents(db: sqlite3.Connection, rows: Iterable[DocumentRow]) -> None:
    marks = ",".join("?" * len(DOCUMENT_COLUMNS))
    db.executemany(f"INSERT INTO documents VALUES ({marks})", (_values(r, DOCUMENT_COLUMNS) for r in rows))


def insert_chunks(db: sqlite3.Connection, rows: Iterable[ChunkRow]) -> None:
    marks = ",".join("?" * len(CHUNK_COLUMNS))
    db.executemany(f"INSERT INTO chunks VALUES ({marks})", (_values(r, CHUNK_COLUMNS) for r in rows))


def _values(row: object, columns: Sequence[str]) -> tuple[object, ...]:
    """Field values in column order; `dataclasses.astuple` deep-copies every field, 10x slower at 1M rows."""
    return tuple(getattr(row, column) for column in columns)


def documents(db: sqlite3.Connection) -> dict[str, DocumentRow]:
    cursor = db.execute(f"SELECT {','.join(DOCUMENT_COLUMNS)} FROM documents")
    return {row[0]: DocumentRow(*row) for row in cursor}


def iter_chunks(db: sqlite3.Connection) -> Iterator[ChunkRow]:
    yield from (ChunkRow(*row) for row in db.execute(f"SELECT {','.join(CHUNK_COLUMNS)} FROM chunks ORDER BY row"))


def chunks_by_rows(db: sqlite3.Connection, rows: Sequence[int]) -> dict[int, ChunkRow]:
    found: dict[int, ChunkRow] = {}
    for start in range(0, len(rows), 500):
        part = [int(r) for r in rows[start:start + 500]]
        marks = ",".join("?" * len(part))
        cursor = db.execute(f"SELECT {','.join(CHUNK_COLUMNS)} FROM chunks WHERE row IN ({marks})", part)
        found.update((row[0], ChunkRow(*row)) for row in cursor)
    return found


def document(db: sqlite3.Connection, doc_id: str) -> DocumentRow | None:
    found = db.execute(f"SELECT {', '.join(DOCUMENT_COLUMNS)} FROM documents WHERE doc_id = ?", (doc_id,)).fetchone()
    return DocumentRow(*found) if found else None


def chunks_of(db: sqlite3.Connection, doc_id: str) -> list[ChunkRow]:
    """A document's chunks in reading order."""
    query = f"SELECT {', '.join(CHUNK_COLUMNS)} FROM chunks WHERE doc_id = ? ORDER BY position"
    return [ChunkRow(*row) for row in db.execute(query, (doc_id,))]


def hashes_of(db: sqlite3.Connection, doc_ids: Sequence[str]) -> dict[str, str]:
    """doc id -> content hash for those of `doc_ids` this table holds."""
    found: dict[str, str] = {}
    for start in range(0, len(doc_ids), 500):
        part = list(doc_ids[start:start + 500])
        marks = ",".join("?" * len(part))
        found.update(db.execute(f"SELECT doc_id, content_hash FROM documents WHERE doc_id IN ({marks})", part))
    return found


def rows_of_documents(db: sqlite3.Connection, doc_ids: Sequence[str]) -> list[int]:
    found: list[int] = []
    for start in range(0, len(doc_ids), 500):
        part = list(doc_ids[start:start + 500])
        marks = ",".join("?" * len(part))
        found.extend(row for (row,) in db.execute(f"SELECT row FROM chunks WHERE doc_id IN ({marks})", part))
    return found


def rows_matching(db: sqlite3.Connection, where: str, params: Sequence[str]) -> list[int]:
    return [row for (row,) in db.execute(f"SELECT row FROM chunks WHERE {where}", list(params))]


def titles_of(db: sqlite3.Connection, doc_ids: Sequence[str]) -> dict[str, str]:
    """doc id -> title for these documents (one query per 500 ids)."""
    found: dict[str, str] = {}
    unique = list(dict.fromkeys(doc_ids))
    for start in range(0, len(unique), 500):
        part = unique[start:start + 500]
        marks = ",".join("?" * len(part))
        found.update(db.execute(f"SELECT doc_id, title FROM documents WHERE doc_id IN ({marks})", part).fetchall())
    return found


def titles(db: sqlite3.Connection) -> list[str]:
    """Every distinct non-empty document title (the focus extractor's phrases)."""
    return [row[0] for row in db.execute("SELECT DISTINCT title FROM documents WHERE title != ''")]
