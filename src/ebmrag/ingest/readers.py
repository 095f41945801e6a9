"""File formats -> `Document`s: txt, Markdown, HTML (boilerplate stripped), PDF (text layer), JSONL.

Every problem is an `IngestError` naming the file (and line, for JSONL) so one bad file never
stops a batch: an empty file, invalid UTF-8, a file over the size limit, a PDF without a text
layer, a JSONL line that is not a JSON object. Shapes of known public corpora in JSONL are
recognised in `ebmrag.ingest.corpora`; other JSONL files use a `FieldMap`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields
from html.parser import HTMLParser
from pathlib import Path

from ebmrag.errors import IngestError, require_extra
from ebmrag.ingest.corpora import recognise_record
from ebmrag.ingest.documents import AUTHORITIES, Document, DocumentBuilder, Section, normalize_text
from ebmrag.records.fragment import lone_surrogate

SUFFIXES = {".txt": "txt", ".text": "txt", ".md": "markdown", ".markdown": "markdown", ".html": "html",
            ".htm": "html", ".pdf": "pdf", ".jsonl": "jsonl"}
DEFAULT_MAX_FILE_BYTES = 50 * 1024 * 1024
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


@dataclass(frozen=True)
class FieldMap:
    """Which JSONL fields hold what. Only `text` is required in each line; `id` defaults to file:line."""

    text: str = "text"
    id: str = "id"
    title: str = "title"
    section: str = "section"
    source: str = "source"
    date: str = "date"
    authority: str = "authority"

    @classmethod
    def parse(cls, pairs: list[str]) -> FieldMap:
        """From CLI pairs like ['text=body', 'id=pmid']."""
        known = {f.name for f in fields(cls)}
        values: dict[str, str] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in known or not value:
                raise ValueError(f"bad field mapping {pair!r}: use NAME=FIELD with NAME one of {sorted(known)}")
            values[key] = value
        return cls(**values)


@dataclass(frozen=True)
class ReadResult:
    documents: list[Document]
    errors: list[IngestError]


def read_file(path: Path, doc_id: str, field_map: FieldMap | None = None,
              max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> ReadResult:
    """All documents in one file, plus per-line errors for JSONL. Raises IngestError when the file is unusable."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise IngestError(str(path), f"unsupported file type {path.suffix!r}; supported: {sorted(SUFFIXES)}")
    raw = _read_bytes(path, max_bytes)
    source = str(path)
    if kind == "pdf":
        return ReadResult([_document(doc_id, _pdf_text(path, raw), source, "pdf", path.stem)], [])
    text = _decode(path, raw)
    if kind == "jsonl":
        return _read_jsonl(path, text, field_map or FieldMap())
    if kind == "html":
        title, text = html_to_markdown(text)
        return ReadResult([_markdown_document(doc_id, text, source, "html", title or path.stem)], [])
    if kind == "markdown":
        return ReadResult([_markdown_document(doc_id, text, source, "markdown", path.stem)], [])
    return ReadResult([_document(doc_id, text, source, "txt", path.stem)], [])


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise IngestError(str(path), f"file is {size / 2**20:.0f} MB, over the {max_bytes / 2**20:.0f} MB limit "
                                         "(raise max_file_mb or split the file)")
        raw = path.read_bytes()
    except OSError as exc:
        raise IngestError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    if not raw.strip():
        raise IngestError(str(path), "empty file")
    return raw


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(str(path), f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                                     "convert the file to UTF-8") from exc


def _document(doc_id: str, text: str, source: str, source_type: str, title: str) -> Document:
    text = normalize_text(text)
    if not text:
        raise IngestError(source, "no text left after normalization")
    return Document(doc_id, text, source, source_type, title=title)


def _markdown_document(doc_id: str, text: str, source: str, source_type: str, title: str) -> Document:
    """Sections run from one heading line to the next; text before the first heading is its own section."""
    text = normalize_text(text)
    if not text:
        raise IngestError(source, "no text left after normalization")
    headings = list(_HEADING.finditer(text))
    bounds = [0, *[m.start() for m in headings], len(text)]
    titles = ["", *[m.group(2).strip() for m in headings]]
    sections = [Section(t, s, e) for t, s, e in zip(titles, bounds, bounds[1:], strict=False)
                if text[s:e].strip()]
    return Document(doc_id, text, source, source_type, title=title, sections=tuple(sections))


def _pdf_text(path: Path, raw: bytes) -> str:
    import io

    require_extra("pypdf", "kb", "reading PDF files")
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(raw))
        if reader.is_encrypted:
            raise IngestError(str(path), "the PDF is encrypted; decrypt it first")
        pages = [page.extract_text() or "" for page in reader.pages]
    except IngestError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IngestError(str(path), f"unreadable PDF: {exc}") from exc
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text.strip():
        raise IngestError(str(path), "the PDF has no text layer (a scanned image?); run OCR first")
    return text


def _read_jsonl(path: Path, text: str, field_map: FieldMap) -> ReadResult:
    documents: list[Document] = []
    errors: list[IngestError] = []
    for number, line in _lines(text):
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise IngestError(where, f"a JSONL line must be a JSON object, got {type(record).__name__}")
            problem = lone_surrogate(json.dumps(record, ensure_ascii=False))
            if problem:
                raise IngestError(where, f"contains {problem}: not valid Unicode")
            documents.append(recognise_record(record, str(path)) or _mapped_document(record, field_map, path, number))
        except json.JSONDecodeError as exc:
            errors.append(IngestError(where, f"not JSON: {exc.msg} at column {exc.colno}"))
        except IngestError as exc:
            errors.append(exc)
        except ValueError as exc:
            errors.append(IngestError(where, str(exc)))
    if not documents and not errors:
        raise IngestError(str(path), "no JSONL records")
    return ReadResult(documents, errors)


def _lines(text: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield number, line


def _mapped_document(record: dict[str, object], fm: FieldMap, path: Path, number: int) -> Document:
    where = f"{path}:{number}"
    body = record.get(fm.text)
    if not isinstance(body, str) or not body.strip():
        raise IngestError(where, f"field {fm.text!r} is missing or not a non-empty string "
                                 "(map it with --field text=NAME)")

    def text_field(name: str, default: str = "") -> str:
        value = record.get(name, default)
        return default if value is None else str(value)

    authority = text_field(fm.authority, "other").lower().replace(" ", "_")
    if authority not in AUTHORITIES:
        raise IngestError(where, f"authority {authority!r} is not one of {AUTHORITIES}")
    builder = DocumentBuilder()
    builder.add(text_field(fm.section), body)
    if not builder.text:
        raise IngestError(where, "no text left after normalization")
    return Document(
        doc_id=text_field(fm.id, f"{path.name}:{number}"), text=builder.text,
        source=text_field(fm.source, str(path)), source_type="jsonl", title=text_field(fm.title),
        sections=builder.sections, date=text_field(fm.date), authority=authority,
    )


class _TextExtractor(HTMLParser):
    """Visible text with headings as Markdown lines; navigation, scripts and forms are boilerplate."""

    SKIP = frozenset({"script", "style", "nav", "header", "footer", "aside", "form", "noscript", "svg",
                      "iframe", "button", "template", "menu"})
    BLOCK = frozenset({"p", "div", "section", "article", "main", "li", "tr", "br", "table", "ul", "ol",
                       "blockquote", "pre", "dd", "dt", "figcaption"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skip_depth += 1
        elif tag == "title":
            self._in_title = True
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in self.BLOCK:
            self.parts.append("- " if tag == "li" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag == "title":
            self._in_title = False
        elif re.fullmatch(r"h[1-6]", tag) or tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip_depth:
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_markdown(html: str) -> tuple[str, str]:
    """(title, text) of an HTML page with its boilerplate removed and headings kept as Markdown."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (line.strip() for line in "".join(parser.parts).split("\n"))
    text = "\n".join(line for line in lines if line and line not in {"-", "#"})
    text = re.sub(r"\n(#{1,6} )", r"\n\n\1", text)
    return normalize_text(parser.title), text
