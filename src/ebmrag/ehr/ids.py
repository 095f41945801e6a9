"""The FHIR id grammar, and the paths built from ids: what may be put into a URL sent to an EHR.

A FHIR id is 1-64 of `A-Z a-z 0-9 - .` (R4 `id` datatype). The grammar admits "." and "..", which a URL reads as
"this folder" and "its parent": `Patient/..` is the base itself, and a search of every patient where one was meant
(issue 43). So an id made only of dots is refused too, and every relative path a client builds is checked once
joined: no dot segment, no empty segment, no percent-encoded dot or slash that a server could decode into one.
"""

from __future__ import annotations

import re

FHIR_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
_ENCODED = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)  # an encoded ".", "/" or "\"


def is_fhir_id(value: str) -> bool:
    """Whether `value` is a FHIR id that names one resource (not "." or "..", nor any id of dots alone)."""
    return bool(FHIR_ID.fullmatch(value)) and value.strip(".") != ""


def fhir_id(value: str, what: str) -> str:
    """`value` when it is such an id; a ValueError naming `what` otherwise."""
    if not is_fhir_id(value):
        raise ValueError(f"{what} must be a FHIR id (1-64 letters, digits, - or ., not only dots), got "
                         f"{value[:80]!r}")
    return value


def safe_path(path: str) -> bool:
    """Whether a relative path (before its query) goes where it says: every segment present, none "." or "..",
    none encoding a dot or a slash."""
    segments = path.split("?", 1)[0].lstrip("/").split("/")
    return all(s and s.strip(".") and not _ENCODED.search(s) and "\\" not in s for s in segments)
