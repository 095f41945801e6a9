"""Input from outside (request bodies, files, NDJSON lines, queue messages), read within the limits every
later reader relies on: JSON parsed within bounds, and XML measured before a reader walks it.

Python's `json` recurses once per nesting level: an array nested 100,000 deep raises RecursionError, and
one nested 900 deep parses but can still exhaust the stack of whatever walks it later (`json.dumps`, a
renderer, pydantic). Catching RecursionError is therefore not enough: the depth is measured first, over
the raw bytes and without recursion, and anything nested deeper than `MAX_DEPTH` is refused. Real input
nests far less (an ebmrag record 3 levels, a FHIR Bundle with contained resources and extensions about 15).

Also refused, each by name: NaN and Infinity (not JSON, RFC 8259), integers past Python's conversion limit
(4,300 digits), and unpaired UTF-16 surrogates (`\\ud800`), which no store can encode.

XML (C-CDA, FHIR XML) is parsed by expat without recursion, but both readers then walk the tree recursively;
`check_xml_depth` refuses a document nested deeper than `MAX_XML_DEPTH` elements first (real C-CDA documents
nest under 20).
"""

from __future__ import annotations

import io
import json
import re
from typing import Any
from xml.etree.ElementTree import ParseError

import numpy as np
from defusedxml import DefusedXmlException  # type: ignore[import-untyped]
from defusedxml import ElementTree as SafeTree

from ebmrag.errors import RecordError
from ebmrag.records.fragment import lone_surrogate

MAX_DEPTH = 64
MAX_XML_DEPTH = 128
# A JSON string, escapes included; one left open runs to the end (matched once, in linear time: without the
# alternative, every escaped quote of an unterminated string would start a new scan to the end).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int32)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
# A surrogate written as an escape, or as the 3-byte form json.loads(bytes) decodes with "surrogatepass".
_MAY_HOLD_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def nesting_depth(raw: bytes) -> int:
    """How deeply arrays and objects nest, brackets inside strings ignored; linear time, no recursion."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    return int(np.cumsum(_STEP[np.frombuffer(brackets, dtype=np.uint8)], dtype=np.int64).max())


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def load_json(raw: bytes | str, where: str) -> Any:
    """`raw` parsed, or RecordError(where, ...) saying what is wrong: invalid JSON (line and column),
    nested too deeply, NaN/Infinity, an oversized integer, or an unpaired surrogate."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = nesting_depth(data)
    if depth > MAX_DEPTH:
        raise RecordError(where, f"JSON nested {depth} levels deep; at most {MAX_DEPTH} are read")
    try:
        parsed = json.loads(raw, parse_constant=_not_a_number)
    except json.JSONDecodeError as exc:
        raise RecordError(where, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError:
        raise RecordError(where, "is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:  # NaN, Infinity; an integer of more than 4,300 digits
        problem = "an integer with too many digits" if "digits" in str(exc) else str(exc)
        raise RecordError(where, f"invalid JSON: {problem}") from None
    if _MAY_HOLD_SURROGATE.search(data):
        surrogate = lone_surrogate(json.dumps(parsed, ensure_ascii=False))
        if surrogate:
            raise RecordError(where, f"contains {surrogate} of the decoded JSON: not valid Unicode")
    return parsed


def check_xml_depth(data: bytes, where: str) -> None:
    """RecordError(where, ...) when elements nest deeper than MAX_XML_DEPTH; a document that does not parse is
    left to its reader, which says why."""
    depth = 0
    try:
        for event, element in SafeTree.iterparse(io.BytesIO(data), events=("start", "end"), forbid_dtd=True,
                                                  forbid_entities=True, forbid_external=True):
            if event == "end":
                depth -= 1
                element.clear()
            elif (depth := depth + 1) > MAX_XML_DEPTH:
                break
    except (ParseError, DefusedXmlException, ValueError, UnicodeError):
        return
    if depth > MAX_XML_DEPTH:
        raise RecordError(where, f"XML nested more than {MAX_XML_DEPTH} elements deep")
