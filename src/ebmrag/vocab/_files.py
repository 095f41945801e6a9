"""What the vocabulary's tables share however they are read: the `version = 1` each carries, and a file a caller
names outside the rules folder (a test's, a site's own table, the bench's while it regenerates one), read by the
rules loader's reader of user files so that every error names the file at fault.

The bundled files are not read here: each vocabulary declares its files with `ebmrag.rules.rule_file`, so that
`RuleBook.check()` reads them at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.rules import RuleFile, read_user_file


def versioned(file: RuleFile, what: str) -> Mapping[str, Any]:
    """The file's table (read-only), once it says `version = 1`; `what` names the file's role in the error
    ("drug vocabulary")."""
    if not isinstance(file.table, Mapping) or file.table.get("version") != 1:
        raise ConfigError(f"{what} {file.path}: version must be 1")
    return file.table


def read_file(path: Path, what: str) -> RuleFile:
    """A TOML table a caller names by its path, read as the book would hand it to a builder."""
    return RuleFile(path, *read_user_file(Path(path), what))


def language_list(raw: Mapping[str, Any], language: str, key: str, where: str,
                  items: str = "non-empty strings") -> list[str]:
    """`[language] key` of a table written per language (`[english]`, `[chinese]`): a list of `items`, or a
    ConfigError naming `where` (the file's role and path) and the entry."""
    table = raw.get(language)
    value = table.get(key) if isinstance(table, Mapping) else None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{where}: [{language}] {key} must be a list of {items}")
    return value
