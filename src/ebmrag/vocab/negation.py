"""Negation cues (rules/negation.toml), compiled once for every reader of negation.

The entity compressor, the ADR recogniser, the CDS allergy statements and the differential's finding mapper
each kept a list of their own, and the lists had drifted apart ("denies" here, "never" there, "排除" in one of
three); one file, read here, gives them the same cues. How far a cue reaches (to the end of a sentence, 45
characters back from a reaction, a whole clause) stays each reader's decision. The file is declared with the rules
loader (ebmrag.rules), so `RuleBook.check()` compiles it at start-up and a test passes a book of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.rules import RuleFile, rule_file
from ebmrag.vocab._files import versioned

NEGATION = "negation.toml"  # in the rules folder
_LISTS = {"english": ("before", "after", "patient"), "chinese": ("before",)}


@dataclass(frozen=True)
class Negation:
    """`cue`: any cue of the file (English as whole words, Chinese anywhere); `patient`: the first-person cues
    alone ("I don't", "nope"); `leading`: a cue (before or patient) that opens a text or clause, for `match`.
    `source` is the file's text, for the fingerprints of results computed with it."""

    cue: re.Pattern[str]
    patient: re.Pattern[str]
    leading: re.Pattern[str]
    source: str


@rule_file(NEGATION, as_files=True)
def negation(file: RuleFile) -> Negation:
    """The cues of rules/negation.toml, compiled once per book (default: the bundled one)."""
    raw = versioned(file, "negation cues")
    lists = {(language, key): _cues(raw, language, key, file.path) for language, keys in _LISTS.items()
             for key in keys}
    every = [cue for cues in lists.values() for cue in cues]
    opening = [*lists["english", "before"], *lists["english", "patient"], *lists["chinese", "before"]]
    return Negation(_pattern(every), _pattern(lists["english", "patient"]), re.compile(
        rf"\s*(?:{_pattern(opening).pattern})", re.IGNORECASE), file.source)


def _cues(raw: Mapping[str, Any], language: str, key: str, path: Path) -> list[str]:
    table = raw.get(language)
    value = table.get(key) if isinstance(table, dict) else None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"negation cues {path}: [{language}] {key} must be a list of non-empty strings")
    return value


def _pattern(cues: list[str]) -> re.Pattern[str]:
    """English cues as whole words (not inside a hyphenated word: "no-reflow"), Chinese ones anywhere; the
    longest first, so that "no evidence of" wins over "no"."""
    ordered = sorted(set(cues), key=len, reverse=True)
    english = "|".join(re.escape(c).replace(r"\ ", r"\s+") for c in ordered if c.isascii())
    chinese = "|".join(re.escape(c) for c in ordered if not c.isascii())
    parts = ([rf"(?<![\w-])(?:{english})(?![\w-])"] if english else []) + ([f"(?:{chinese})"] if chinese else [])
    return re.compile("|".join(parts), re.IGNORECASE)
