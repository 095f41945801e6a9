"""Attachments as EHRs send them -> the text of the note inside.

What the bytes are decides, not the label: producers label gzip and PDF as `text/plain`, wrap a whole
C-CDA document in a FHIR attachment (gzip of XML, base64), or put a PDF inside a C-CDA's nonXMLBody. So
gzip is recognised by its magic bytes and opened (bounded: a decompression bomb is refused), PDF text is
extracted with pypdf, a C-CDA document yields its section narratives, HTML/XHTML is reduced to text with
its headings; images and other binaries are named in the trace, not read. Only inline data is read: a
`url` would need a fetch, which an air-gapped loader never does.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import logging
import re
from collections.abc import Mapping
from typing import Any

from ebmrag.records.notes import html_to_text

_READABLE = ("text/", "application/xhtml", "application/xml", "application/json")
_MAX_INFLATED = 64 * 2**20  # a note larger than this once inflated is a decompression bomb, not a note
_MAX_PDF_PAGES = 200


def attachment_text(attachment: Mapping[str, Any], patient: Mapping[str, Any] | None = None
                    ) -> tuple[str | None, str]:
    """(the attachment's text, "") or (None, why it cannot be read). What the bytes are decides, not the
    label: producers label gzip and PDF as text/plain. Only inline data is read: a `url` would need a fetch,
    which an air-gapped loader never does."""
    label = str(attachment.get("contentType") or "").split(";")[0].strip().lower()
    if not attachment.get("data"):
        return None, "attachment without inline data" + (" (a url only, not fetched)" if attachment.get("url") else "")
    try:
        raw = base64.b64decode(re.sub(r"\s+", "", str(attachment["data"])), validate=True)
    except (binascii.Error, ValueError):
        return None, "attachment data is not valid base64"
    return content_text(raw, label, patient=patient)


def content_text(raw: bytes, label: str, depth: int = 0, patient: Mapping[str, Any] | None = None
                 ) -> tuple[str | None, str]:
    """Bytes of a note -> its text: gzip opened, PDF text extracted, a C-CDA document's narrative read,
    HTML/XHTML reduced to text with its headings; images and other binaries are named, not read."""
    if raw[:2] == b"\x1f\x8b" and depth < 3:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as opened:
                inflated = opened.read(_MAX_INFLATED + 1)
        except (OSError, EOFError) as exc:
            return None, f"gzip attachment that could not be opened ({exc})"
        if len(inflated) > _MAX_INFLATED:
            return None, f"gzip attachment inflating past {_MAX_INFLATED // 2**20} MB (refused)"
        return content_text(inflated, label, depth + 1, patient)
    if raw[:5] == b"%PDF-":
        return _pdf_text(raw)
    if label.startswith(("image/", "audio/", "video/")):
        return None, f"attachment of type {label} (not text)"
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff")
    from ebmrag.records.ccda import ccda_narrative, ccda_patient, is_ccda  # C-CDA reads its PDFs through here

    if is_ccda(text):
        if patient is not None and not same_person(ccda_patient(text, "attachment"), patient):
            return None, "a C-CDA document about another patient (birth date or family name differ); not read"
        sections = ccda_narrative(text, "attachment")
        return "\n".join(f"# {title}\n{body}" for title, body in sections if body.strip()), ""
    if label in ("text/html", "application/xhtml", "application/xhtml+xml") or _looks_like_html(text):
        return html_to_text(text), ""
    if label and not label.startswith(_READABLE) and "\x00" in text:
        return None, f"attachment of type {label} (not text)"
    return text, ""


def _looks_like_html(text: str) -> bool:
    return bool(re.match(r"\s*(<!doctype html|<html|<div|<body|<\?xml[^>]*>\s*<html)", text, re.IGNORECASE))


def _pdf_text(raw: bytes) -> tuple[str | None, str]:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PyPdfError
    except ImportError:
        return None, "PDF attachment (reading PDFs needs pypdf: pip install pypdf)"
    quiet = logging.getLogger("pypdf")  # it warns about every malformed cross-reference; the trace says enough
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        pages = PdfReader(io.BytesIO(raw)).pages
        text = "\n".join((page.extract_text() or "") for page in pages[:_MAX_PDF_PAGES])
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        return None, f"PDF attachment that could not be read ({type(exc).__name__})"
    finally:
        quiet.setLevel(level)
    return (text, "") if text.strip() else (None, "PDF attachment without a text layer (a scan)")


def same_person(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """False when two Patient resources disagree on what both state: the birth date, or every family name."""
    born = [str(p.get("birthDate") or "")[:10] for p in (one, other)]
    if all(born) and not (born[0].startswith(born[1]) or born[1].startswith(born[0])):
        return False
    families = [{str(n.get("family") or "").strip().lower() for n in p.get("name") or [] if isinstance(n, Mapping)}
                - {""} for p in (one, other)]
    return not (all(families) and not families[0] & families[1])
