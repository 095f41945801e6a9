"""Drug and drug-class mentions from an offline lexicon: rules/drugs/lexicon.txt and rules/drugs/drug_terms.toml.

Tier rules that need to know whether a text names a drug ("hives and throat swelling after taking
cefuroxime") ask this lexicon rather than a regex: 27,000 names do not fit a readable pattern, and a
set lookup per word costs microseconds. General words and Chinese names are listed beside the names because a
chart says "after an antibiotic" or "头孢类" as often as it names the molecule; which drug a Chinese name
identifies (阿莫西林 -> amoxicillin) is the drug vocabulary's business (vocab/drugs.py), read from the same file.
Both files are declared with the rules loader (ebmrag.rules): `RuleBook.check()` reads them at start-up.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, RuleFile, rule_file
from ebmrag.vocab._files import versioned

LEXICON, TERMS = "drugs/lexicon.txt", "drugs/drug_terms.toml"  # in the rules folder
TERMS_PATH = FOLDER / TERMS
_MEANINGS = ("ingredient", "class", "general")
_TOKEN = re.compile(r"[a-z][a-z-]+")


@dataclass(frozen=True)
class ChineseName:
    """What a Chinese name names: `kind` "ingredient" (an INN), "class" (a class id of the drug tables) or
    "general" (no drug of its own; `value` is its English meaning)."""

    kind: str
    value: str


@dataclass(frozen=True)
class Terms:
    """drug_terms.toml: the English general words and the Chinese names, in the file's order."""

    general: frozenset[str]
    chinese: Mapping[str, ChineseName]

    @property
    def chinese_general(self) -> frozenset[str]:
        return frozenset(name for name, meaning in self.chinese.items() if meaning.kind == "general")

    @classmethod
    def of(cls, file: RuleFile) -> Terms:
        """drug_terms.toml read and checked (the bundled file's through `terms()`, a test's or a site's through
        the drug vocabulary's `from_files`)."""
        raw, path = versioned(file, "drug terms"), file.path
        general = raw.get("general", {}).get("en") if isinstance(raw.get("general"), dict) else None
        if not isinstance(general, list) or not all(isinstance(w, str) and w.strip() for w in general):
            raise ConfigError(f"drug terms {path}: [general] en must be a list of words")
        table = raw.get("chinese")
        if not isinstance(table, dict):
            raise ConfigError(f"drug terms {path}: [chinese] must be a table of name = {{ kind = value }}")
        return cls(frozenset(general), {name: _meaning(name, means, path) for name, means in table.items()})


@rule_file(LEXICON)
def drug_names(lines: tuple[str, ...]) -> frozenset[str]:
    """The lexicon's names (lower case), once per book (default: the bundled one)."""
    return frozenset(lines)


@rule_file(TERMS, as_files=True)
def terms(file: RuleFile) -> Terms:
    """The general words and Chinese names, read and checked once per book (default: the bundled one)."""
    return Terms.of(file)


def _meaning(name: str, means: Any, path: Path) -> ChineseName:
    if not isinstance(means, dict) or len(means) != 1 or next(iter(means)) not in _MEANINGS \
            or not isinstance(value := next(iter(means.values())), str) or not value.strip():
        raise ConfigError(f"drug terms {path}: [chinese] {name!r} must be one of "
                          f"{{ ingredient = \"INN\" }}, {{ class = \"id\" }}, {{ general = \"meaning\" }}")
    return ChineseName(next(iter(means)), value)


def drug_mentions(text: str) -> list[str]:
    """The drug names and classes a text mentions, in order (Chinese by substring)."""
    lowered = text.lower()
    names, general = drug_names(), terms().general
    words = _TOKEN.findall(lowered)
    parts = [part for word in words if "-" in word for part in word.split("-")]  # "metoclopramide-induced"
    found = [w for w in words + parts if w in names or w in general]
    found += [f"{a} {b}" for a, b in itertools.pairwise(words) if f"{a} {b}" in general]
    found += [name for name in terms().chinese if name in text]
    return found
