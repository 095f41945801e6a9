"""The vocabulary's data files under src/ebmrag/rules/, read through the one rules loader (ebmrag.rules): a bundled
file is parsed once by the rule book, a file a caller names elsewhere (a test's, a site's own table) by the same
reader of user files; every error names the file at fault.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, bundled, read_user_file

RULES = FOLDER
DRUGS = RULES / "drugs"


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A versioned TOML table (`version = 1`), the caller's own copy; `what` names the file's role in the error
    ("drug vocabulary")."""
    resolved = path.resolve()
    if resolved.is_relative_to(RULES) and resolved.is_file():
        raw: Mapping[str, Any] = bundled().read(str(resolved.relative_to(RULES)))
    else:
        raw = read_user_file(path, what)[0]
    if raw.get("version") != 1:
        raise ConfigError(f"{what} {path}: version must be 1")
    return copy.deepcopy(dict(raw))


def read_lines(path: Path, what: str) -> list[str]:
    """The non-empty lines of a word list, stripped, without its `#` comments."""
    resolved = path.resolve()
    if resolved.is_relative_to(RULES) and resolved.is_file():
        return list(bundled().read(str(resolved.relative_to(RULES))))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{what} {path} could not be read: {exc}") from exc
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]
